# Sourced by tests/run.sh and examples/demo.sh: create .venv and install the
# project with its test tools, once per change of pyproject.toml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH="2.13.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
fi
STAMP="$VENV/.omni-trio-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "setting up $VENV ..." >&2
    "$PY" -m pip install --quiet --upgrade pip
    # torch first, pinned, and a CPU build: PyPI's default torch wheel for Linux
    # is a multi-GB CUDA build. A CPU wheel that pip finds without an index (a
    # --find-links folder from pip's config) is used as it is (its own
    # dependencies come with the project from PyPI); otherwise the
    # CPU wheel comes from PyTorch's own CPU index.
    if "$PY" -m pip install --quiet --no-index --no-deps "torch==$TORCH" 2>/dev/null; then
        echo "torch $TORCH: a CPU wheel found on this machine" >&2
    else
        echo "torch $TORCH: no local wheel; installing the CPU build from $TORCH_CPU_INDEX" >&2
        "$PY" -m pip install --quiet --index-url "$TORCH_CPU_INDEX" "torch==$TORCH"
    fi
    "$PY" -m pip install --quiet -e "$ROOT[test]"
    echo "$WANT" > "$STAMP"
fi
