#!/usr/bin/env bash
# The demo command: run the chapter's three experiments.
source "$(dirname "${BASH_SOURCE[0]}")/../tests/bootstrap.sh"
cd "$ROOT"
for experiment in fanin batch stream; do
    echo "== $experiment"
    "$PY" -m "examples.ch4_$experiment"
done
