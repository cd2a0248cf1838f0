"""``python -m benchmarks ...``: the benchmark suite (:mod:`benchmarks.run`)."""

import sys

from benchmarks.run import main

sys.exit(main())
