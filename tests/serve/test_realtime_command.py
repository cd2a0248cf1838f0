"""``omni-trio serve examples/omni_speech/serve_voice.toml``, the README's command, as a subprocess.

The voice pipeline's three worker processes start as the file places them;
the official openai client transcribes a file and holds a realtime turn
against it; SIGTERM then leaves no process, IPC directory or shared memory behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import wave
from pathlib import Path
from typing import Any

import openai

import omni_trio as ot
from tests.serve.test_command import _descendants, _workers
from tests.serve.voice_server import MODEL, realtime_client, send_audio, silence, speech_pcm16, until, words

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "omni_speech" / "serve_voice.toml"
SAID = "one two three four five"


def _wav(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


def test_the_voice_file_is_the_processes_placement() -> None:
    from examples.omni_speech.serve_voice import make_serve_voice_config

    config = ot.load_config(CONFIG)
    ot.config.check_imports(config)
    placed = make_serve_voice_config("processes")
    assert config.stages == placed.stages and config.entry_stage == placed.entry_stage
    assert {name: entry.restart for name, entry in config.processes.items()} == {
        "p_asr": "on-failure", "p_tts": "on-failure", "p_listen": "on-failure"}
    assert config.serve is not None and config.serve.model == MODEL
    assert config.serve.sockets.max_realtime_sessions == 16


async def _realtime_turn(ws_url: str) -> list[Any]:
    seen: list[Any] = []
    async with realtime_client(ws_url).realtime.connect(model=MODEL) as connection:
        await until(connection, "session.created", seen)
        await send_audio(connection, silence(0.3) + speech_pcm16(SAID) + silence(1.0))
        await until(connection, "response.done", seen)
    return seen


def test_serve_voice_toml_transcribes_and_answers_a_realtime_turn() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="otv-"))  # short: Unix socket paths are at most ~100 bytes
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "omni_trio", "serve", str(CONFIG), "--port", "0", "--app-dir", str(ROOT)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    workers: set[int] = set()
    run_prefix = ""
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # bounded by the pipeline's start-up timeout
        if not line.startswith("listening on http://127.0.0.1:"):
            server.wait(30)
            stderr = server.stderr.read() if server.stderr else None
            raise AssertionError(f"no listening line: {line!r}; stderr: {stderr}")
        url = line.split()[-1]
        workers = _workers(server.pid)
        assert len(workers) == 3
        spec = pickle.loads(next(tmp_path.glob("omnitrio-*/p_listen.spec")).read_bytes())
        run_prefix = spec.shm_prefix.rsplit("-", 1)[0]

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        audio = ("said.wav", _wav(speech_pcm16(SAID), 24_000))
        transcript = client.audio.transcriptions.create(model=MODEL, file=audio)
        # The server's first utterance meets a cold pocketsphinx decoder ("want to three are are you"):
        # some of the words, not most.
        assert words(transcript.text) & words(SAID), transcript.text

        seen = asyncio.run(asyncio.wait_for(_realtime_turn(url.replace("http://", "ws://") + "/v1"), 120))
        completed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
        assert len(words(completed.transcript) & words(SAID)) >= 2, completed.transcript
        assert any(e.type == "response.output_audio.delta" for e in seen)
        assert seen[-1].response.status == "completed"

        workers |= _descendants(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
        for pid in _descendants(server.pid) | workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        leftover = list(tmp_path.glob("omnitrio-*"))
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert leftover == []
    assert run_prefix and not [name for name in os.listdir("/dev/shm") if name.startswith(run_prefix)]
