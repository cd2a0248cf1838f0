"""``WS /v1/realtime`` of the served voice pipeline, with the official openai client (AsyncOpenAI).

The user's speech is espeak-ng's (resampled to 24 kHz); the server's ASR
hears it, the responder repeats the words, and the TTS speaks them back. Each
test runs against the pipeline embedded and in worker processes.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import omni_trio as ot
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


#: Six sentences told apart by their words (tests/speech/test_real_voice.py measured the ASR on them).
SENTENCES = ["the weather is nice today", "please open the door", "i would like a cup of coffee",
             "how are you doing this morning", "we are going to the park", "turn on the light in the kitchen"]


@pytest.fixture(scope="module", params=["embedded", "processes"])
def server(request: pytest.FixtureRequest) -> Iterator[VoiceServer]:
    # Six sessions speaking and answered at once take this 2-core machine's CPU: an answer that falls
    # behind real time would rightly make stream admission refuse the next one (tested on its own in
    # tests/core/test_stream_admission.py); these tests are about the sessions, so it is off here.
    with voice_server(request.param, admission=ot.StreamAdmissionConfig(mode="off")) as running:
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


def test_one_append_holding_a_whole_utterance_is_heard(server: VoiceServer) -> None:
    """The detector's start and stop both fall inside one append: the speech between them is the turn."""
    async def main() -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", seen)
            whole = silence(0.5) + speech_pcm16(SAID) + silence(1.0)
            await connection.input_audio_buffer.append(audio=base64.b64encode(whole).decode())
            await until(connection, "response.done", seen)
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    completed = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert completed.usage.seconds > 1.0  # the speech, not only the prefix padding
    assert words(completed.transcript) & words(SAID), completed.transcript  # a recognizer of 0.7-0.8 recall


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


def test_six_concurrent_sessions_each_hear_their_own_words(server: VoiceServer) -> None:
    async def one(sentence: str) -> list[Any]:
        seen: list[Any] = []
        async with _client(server).realtime.connect(model=MODEL) as connection:
            await until(connection, "session.created", seen)
            await connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await until(connection, "session.updated", seen)
            await send_audio(connection, speech_pcm16(sentence))
            await connection.input_audio_buffer.commit()
            await connection.response.create()
            await until(connection, "response.done", seen)
        return seen

    async def main() -> list[list[Any]]:
        # A fresh pocketsphinx decoder hears its first utterance poorly (its cepstral mean starts cold,
        # "please open the door" -> "the o r"); the transcriber pools its decoders, so a first round
        # warms one for each session and the second round is the one checked.
        await asyncio.gather(*(one(sentence) for sentence in SENTENCES))
        return list(await asyncio.gather(*(one(sentence) for sentence in SENTENCES)))

    sessions = asyncio.run(asyncio.wait_for(main(), 240))
    found = total = 0
    for index, seen in enumerate(sessions):
        heard = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed").transcript
        reply = next(e for e in seen if e.type == "response.output_audio_transcript.done").transcript
        assert seen[-1].response.status == "completed"
        assert heard in reply, (heard, reply)  # the answer is to this session's own turn
        # The ASR hears some words wrong, so: no other sentence's words more than its own...
        hits = [len(words(heard) & (words(sentence) - {"the"})) for sentence in SENTENCES]
        assert hits[index] == max(hits), (SENTENCES[index], heard)
        found, total = found + hits[index], total + len(words(SENTENCES[index]) - {"the"})
    # ...and most of the words said, all sessions together.
    assert found / total >= 0.4, [e.transcript for seen in sessions for e in seen
                                  if e.type == "conversation.item.input_audio_transcription.completed"]
