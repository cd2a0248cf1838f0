"""``WS /v1/realtime`` of the served voice pipeline, with the official openai client (AsyncOpenAI).

The user's speech is espeak-ng's (resampled to 24 kHz); the server's ASR
hears it, the responder repeats the words, and the TTS speaks them back.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.serve.voice_server import MODEL, VoiceServer, speech_pcm16, voice_server, words

SAID = "one two three four five"
CHUNK = 24_000 * 2 // 10  # 100 ms of PCM16 at 24 kHz


@pytest.fixture(scope="module")
def server() -> Iterator[VoiceServer]:
    with voice_server() as running:
        yield running


def _client(server: VoiceServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="unused", websocket_base_url=server.ws_url, max_retries=0)


async def _until(connection: Any, kind: str, seen: list[Any]) -> Any:
    async for event in connection:
        seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"the connection closed before {kind}")


async def _send_audio(connection: Any, pcm: bytes) -> None:
    for start in range(0, len(pcm), CHUNK):
        await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + CHUNK]).decode())


def test_a_manual_turn_is_transcribed_and_answered_in_speech(server: VoiceServer) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            created = await _until(connection, "session.created", seen)
            assert created.session.model == MODEL
            await connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await _until(connection, "session.updated", seen)
            await _send_audio(connection, speech_pcm16(SAID))
            await connection.input_audio_buffer.commit()
            await connection.response.create()
            await _until(connection, "response.done", seen)
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    kinds = [event.type for event in seen]
    assert "input_audio_buffer.committed" in kinds and "response.created" in kinds
    completed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert len(words(completed.transcript) & words(SAID)) >= 2, completed.transcript
    audio = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
    assert len(audio) > 24_000 * 2, "over a second of spoken answer"
    transcript = next(e for e in seen if e.type == "response.output_audio_transcript.done").transcript
    assert completed.transcript in transcript
    assert seen[-1].response.status == "completed"
