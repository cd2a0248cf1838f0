#!/usr/bin/env bash
# The demo command.
#   bash examples/demo.sh           the omni_speech pipeline: text + a synthetic tone -> streamed speech,
#                                   embedded (writes out/demo.wav), then the same request in worker processes
#   bash examples/demo.sh chapter   the chapter's three experiments (fan-in, batching, streaming)
source "$(dirname "${BASH_SOURCE[0]}")/../tests/bootstrap.sh"
cd "$ROOT"
case "${1:-speech}" in
    speech)
        mkdir -p out
        echo "== omni_speech, embedded"
        "$PY" -m examples.omni_speech --audio --out out/demo.wav
        echo
        echo "== omni_speech, one process per model"
        "$PY" -m examples.omni_speech --audio --placement processes --out out/demo-processes.wav
        ;;
    chapter)
        for experiment in fanin batch stream; do
            echo "== $experiment"
            "$PY" -m "examples.ch4_$experiment"
        done
        ;;
    *)
        echo "usage: bash examples/demo.sh [speech|chapter]" >&2
        exit 2
        ;;
esac
