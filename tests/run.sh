#!/usr/bin/env bash
# The test command: lint, type-check, then the whole test suite.
#   bash tests/run.sh [--fast] [pytest args...]
# --fast: lint, type-check and the fast tier only (unit tests and the embedded placement: every test
# not marked slow, see tests/conftest.py). Other arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$ROOT"
TIER=()
if [ "${1:-}" = "--fast" ]; then
    shift
    TIER=(-m "not slow")
fi
"$VENV/bin/ruff" check omni_trio tests examples benchmarks
"$VENV/bin/mypy"
exec "$PY" -m pytest "${TIER[@]}" "$@"
