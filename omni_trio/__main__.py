"""``python -m omni_trio``: the omni-trio command line (see :mod:`omni_trio.cli`)."""

from omni_trio.cli import main

raise SystemExit(main())
