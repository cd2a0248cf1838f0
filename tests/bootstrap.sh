# Sourced by tests/run.sh and examples/demo.sh: create .venv and install the
# project with its test tools, once per change of pyproject.toml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
fi
STAMP="$VENV/.omni-trio-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "setting up $VENV ..." >&2
    "$PY" -m pip install --quiet --upgrade pip
    # torch first and pinned: this version resolves to a local CPU wheel; an
    # unpinned torch would pull a multi-GB CUDA build.
    "$PY" -m pip install --quiet "torch==2.13.0"
    "$PY" -m pip install --quiet -e "$ROOT[test]"
    echo "$WANT" > "$STAMP"
fi
