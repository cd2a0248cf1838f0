"""``omni-trio serve examples/omni_speech/serve_voice.toml``, the README's command, as a subprocess.

The voice pipeline's three worker processes start as the file places them;
the official openai client transcribes a file and holds a realtime turn
against it; SIGTERM then leaves no process, IPC directory or shared memory behind.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import signal
import tempfile
import wave
from pathlib import Path
from typing import Any

import openai

import omni_trio as ot
from tests.serve.command_process import descendants, left_behind, serving
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
    directory = Path(tempfile.mkdtemp(prefix="otv-"))  # short: Unix socket paths are at most ~100 bytes
    try:
        with serving(CONFIG, directory, "p_listen") as served:
            assert len(served.workers) == 3
            client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120)
            audio = ("said.wav", _wav(speech_pcm16(SAID), 24_000))
            transcript = client.audio.transcriptions.create(model=MODEL, file=audio)
            assert words(transcript.text) & words(SAID), transcript.text

            ws_url = served.url.replace("http://", "ws://") + "/v1"
            seen = asyncio.run(asyncio.wait_for(_realtime_turn(ws_url), 120))
            completed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
            assert len(words(completed.transcript) & words(SAID)) >= 2, completed.transcript
            assert any(e.type == "response.output_audio.delta" for e in seen)
            assert seen[-1].response.status == "completed"

            served.workers |= descendants(served.process.pid)
            served.process.send_signal(signal.SIGTERM)
            assert served.process.wait(60) == 0
        assert left_behind(served, directory) == []
    finally:
        shutil.rmtree(directory, ignore_errors=True)
