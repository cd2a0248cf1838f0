#!/usr/bin/env bash
# The test command: lint, type-check, then the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$ROOT"
"$VENV/bin/ruff" check omni_trio tests examples benchmarks
"$VENV/bin/mypy"
exec "$PY" -m pytest "$@"
