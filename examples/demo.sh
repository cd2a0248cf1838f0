#!/usr/bin/env bash
# The demo command.
#   bash examples/demo.sh           the omni_speech pipeline: text + a synthetic tone -> streamed speech,
#                                   embedded (writes out/demo.wav), then the same request in worker processes;
#                                   then the real models: spoken audio -> pocketsphinx -> a reply -> espeak-ng
#                                   (writes out/voice.wav), and a streaming session's partial transcripts
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
        echo
        echo "== real models: audio in -> ASR -> responder -> TTS, one process per model"
        "$PY" -m examples.omni_speech.voice --placement processes --out out/voice.wav
        echo
        echo "== real streaming ASR: partial transcripts of a session"
        "$PY" -m examples.realtime_asr --model pocketsphinx
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
