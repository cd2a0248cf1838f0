"""``python -m benchmarks ...``: the benchmark suite (:mod:`benchmarks.run`); ``python -m benchmarks serving
...``: the serving benchmark (:mod:`benchmarks.serving`)."""

import sys

from benchmarks.run import main

sys.exit(main())
