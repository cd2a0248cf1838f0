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
import trio

from tests.serve.voice_server import (
    MODEL,
    VoiceServer,
    realtime_client,
    send_audio,
    silence,
    speech_pcm16,
    until,
    voice_server,
    words,
)

SAID = "one two three four five"


@pytest.fixture(scope="module")
def server() -> Iterator[VoiceServer]:
    with voice_server() as running:
        yield running


def _client(server: VoiceServer) -> openai.AsyncOpenAI:
    return realtime_client(server.ws_url)


def test_a_manual_turn_is_transcribed_and_answered_in_speech(server: VoiceServer) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            created = await until(connection, "session.created", seen)
            assert created.session.model == MODEL
            await connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await until(connection, "session.updated", seen)
            await send_audio(connection, speech_pcm16(SAID))
            await connection.input_audio_buffer.commit()
            await connection.response.create()
            await until(connection, "response.done", seen)
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


def test_server_vad_commits_the_turn_and_answers(server: VoiceServer) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", seen)
            await send_audio(connection, silence(0.5) + speech_pcm16(SAID) + silence(1.0))
            await until(connection, "response.done", seen)
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    kinds = [event.type for event in seen]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped")
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
    completed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert len(words(completed.transcript) & words(SAID)) >= 2, completed.transcript
    assert seen[-1].response.status == "completed"


def test_speech_during_an_answer_cancels_it(server: VoiceServer) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", seen)
            await send_audio(connection, speech_pcm16(SAID) + silence(1.0))
            await until(connection, "response.output_audio.delta", seen)
            await send_audio(connection, speech_pcm16("stop"))
            done = await until(connection, "response.done", seen)
            assert done.response.status == "cancelled"
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    kinds = [event.type for event in seen]
    assert kinds.count("input_audio_buffer.speech_started") == 2


def test_bad_events_get_errors_and_the_session_goes_on(server: VoiceServer) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", seen)
            await connection.send({"type": "input_audio_buffer.append", "audio": "not base64!", "event_id": "e1"})
            seen.append(await until(connection, "error", []))
            await connection.send({"type": "input_audio_buffer.commit", "event_id": "e2"})
            seen.append(await until(connection, "error", []))
            await connection.send({"type": "response.cancel", "event_id": "e3"})
            seen.append(await until(connection, "error", []))
            await connection.session.update(session={"type": "realtime", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}}}}, event_id="e4")
            seen.append(await until(connection, "error", []))
            await connection.send({"type": "no.such.event", "event_id": "e5"})
            seen.append(await until(connection, "error", []))
            await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            seen.append(await until(connection, "session.updated", []))
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 60))
    assert [(e.error.event_id, e.error.code) for e in seen[1:6]] == [
        ("e1", "invalid_base64"), ("e2", "input_audio_buffer_commit_empty"), ("e3", "response_cancel_not_active"),
        ("e4", "unsupported_audio_format"), ("e5", "invalid_event_type")]
    assert seen[-1].session.output_modalities == ["text"]


def test_disconnect_closes_the_session_and_aborts_the_answer(server: VoiceServer) -> None:
    async def main() -> None:
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", [])
            await send_audio(connection, speech_pcm16(SAID) + silence(1.0))
            await until(connection, "response.output_audio.delta", [])

    asyncio.run(asyncio.wait_for(main(), 60))

    async def settled() -> int:
        # The server notices the close asynchronously; its cleanup is bounded, not awaited by the client.
        with trio.fail_after(30):
            while (stats := await server.pipeline.stats()).live_requests:
                await trio.sleep(0.1)
        return int(stats.live_requests)

    assert server.call(settled) == 0
