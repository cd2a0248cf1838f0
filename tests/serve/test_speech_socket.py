"""``WS /v1/audio/speech/stream`` of the served voice pipeline, with the ``websockets`` client.

Text goes in piece by piece; each sentence is spoken as soon as it is
complete (its audio starts before the next sentence is sent), and what comes
back is real speech: the server's own transcription endpoint hears its words.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import websockets

from omni_trio.serve.speech_socket import split_ready
from tests.serve.voice_server import MODEL, VoiceServer, voice_server, words


@pytest.fixture(scope="module", params=["embedded", "processes"])
def server(request: pytest.FixtureRequest) -> Iterator[VoiceServer]:
    with voice_server(request.param) as running:
        yield running


def _url(server: VoiceServer) -> str:
    return f"{server.ws_url}/audio/speech/stream"


async def _next_json(ws: Any) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(message, str):
            return json.loads(message)


def test_split_ready_cuts_after_a_mark_and_keeps_the_rest() -> None:
    assert split_ready("One. Two! Three is 3.5 long", "sentence") == (["One.", "Two!"], "Three is 3.5 long")
    assert split_ready("Yes, and then; more", "clause") == (["Yes,", "and then;"], "more")
    assert split_ready("No end yet", "sentence") == ([], "No end yet")


def test_sentences_are_spoken_while_the_text_is_still_coming(server: VoiceServer) -> None:
    async def main() -> tuple[list[dict[str, Any]], dict[int, bytes]]:
        events: list[dict[str, Any]] = []
        audio: dict[int, bytes] = {}
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", "session": {"model": MODEL, "voice": "alloy"}}))
            configured = await _next_json(ws)
            assert configured["type"] == "session.configured" and configured["sample_rate"] == 24_000
            await ws.send(json.dumps({"type": "input.text", "text": "One two three four five. "}))
            await ws.send(json.dumps({"type": "input.text", "text": "Six seven"}))
            start = await _next_json(ws)  # the first sentence is spoken before the second one is finished
            assert start["type"] == "audio.start" and start["sentence_text"] == "One two three four five."
            events.append(start)
            await ws.send(json.dumps({"type": "input.text", "text": " eight nine ten"}))
            await ws.send(json.dumps({"type": "input.done"}))
            current = 0
            async for message in ws:
                if isinstance(message, bytes):
                    audio[current] = audio.get(current, b"") + message
                    continue
                event = json.loads(message)
                events.append(event)
                if event["type"] == "audio.start":
                    current = event["sentence_index"]
        return events, audio

    events, audio = asyncio.run(asyncio.wait_for(main(), 120))
    kinds = [e["type"] for e in events]
    assert kinds == ["audio.start", "audio.done", "audio.start", "audio.done", "session.done"]
    assert events[2]["sentence_text"] == "Six seven eight nine ten"
    assert events[-1]["total_sentences"] == 2
    for done in (events[1], events[3]):
        assert not done["error"] and done["total_bytes"] == len(audio[done["sentence_index"]]) > 24_000
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    heard = client.audio.transcriptions.create(model=MODEL, file=("a.pcm", audio[0]),
                                               extra_body={"sample_rate": "24000"})
    assert len(words(heard.text) & {"one", "two", "three", "four", "five"}) >= 2, heard.text


def test_commit_speaks_the_buffer_and_bad_messages_get_errors(server: VoiceServer) -> None:
    async def main() -> list[dict[str, Any]]:
        seen = []
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "input.text", "text": "too early"}))
            seen.append(await _next_json(ws))  # an error: session.config comes first
            await ws.send(json.dumps({"type": "session.config", "session": {"speed": 9}}))
            seen.append(await _next_json(ws))
            await ws.send(json.dumps({"type": "session.config", "session": {"split_granularity": "clause"}}))
            seen.append(await _next_json(ws))
            await ws.send("[" * 100_000 + "]" * 100_000)
            seen.append(await _next_json(ws))
            await ws.send(json.dumps({"type": "input.nonsense"}))
            seen.append(await _next_json(ws))
            await ws.send(json.dumps({"type": "input.text", "text": "no mark here"}))
            await ws.send(json.dumps({"type": "input.commit"}))
            seen.append(await _next_json(ws))
            seen.append(await _next_json(ws))
            await ws.send(json.dumps({"type": "input.done"}))
            seen.append(await _next_json(ws))
            await asyncio.wait_for(ws.wait_closed(), 30)
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    assert [e["type"] for e in seen] == ["error", "error", "session.configured", "error", "error", "audio.start",
                                         "audio.done", "session.done"]
    assert seen[1]["param"] == "session.speed"
    assert seen[3]["code"] == "invalid_json" and "nested deeper than 64 levels" in seen[3]["message"]
    assert seen[5]["sentence_text"] == "no mark here" and seen[6]["total_bytes"] > 0
