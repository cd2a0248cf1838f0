"""The demo pipeline over HTTP, with the real openai client (sync and async) and httpx.

One server for the module (conftest.py); each answer's PCM is compared with
what ``pipeline.stream`` gives for the same input.
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import openai
import trio

from examples.omni_speech import models
from examples.omni_speech.pipeline import write_wav
from omni_trio.serve import decode_wav, wav_header
from tests.serve.conftest import MODEL, TOKENS, SpeechServer

CHUNKS = TOKENS * 4  # the talker makes 4 frames per token, the vocoder one chunk per frame


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_speech_streams_pcm_with_the_sync_client(speech_server: SpeechServer) -> None:
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input="hello there", voice="alloy", response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        pcm = b"".join(response.iter_bytes())
    assert pcm == speech_server.expected_pcm("hello there")
    assert len(pcm) == CHUNKS * models.SAMPLES_PER_FRAME * 2


def test_speech_sse_sends_a_delta_per_vocoder_chunk_then_done(speech_server: SpeechServer) -> None:
    body = {"model": MODEL, "input": "one more", "voice": "echo", "response_format": "wav", "stream_format": "sse"}
    with httpx.stream("POST", f"{speech_server.url}/v1/audio/speech", json=body,
                      headers={"accept": "application/octet-stream"}, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) == CHUNKS
    assert events[-1] == {"type": "speech.audio.done",
                          "usage": {"input_tokens": 0, "output_tokens": TOKENS, "total_tokens": TOKENS}}
    wav = b"".join(deltas)
    assert wav[:44] == wav_header(models.SAMPLE_RATE)
    assert wav[44:] == speech_server.expected_pcm("one more", voice="echo")


async def test_chat_streams_text_and_audio_with_the_async_client(speech_server: SpeechServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    audio, transcript, content, finish = b"", "", "", None
    with trio.fail_after(60):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi there"}], stream=True,
            modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
        )
        async for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            if delta.audio is not None:
                audio += base64.b64decode(delta.audio.data or "")
                transcript += delta.audio.transcript or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert content and transcript == content
    assert audio == await trio.to_thread.run_sync(speech_server.expected_pcm, "hi there")
    await client.close()


def test_chat_with_input_audio_answers_with_a_wav(speech_server: SpeechServer, tmp_path) -> None:
    path = tmp_path / "tone.wav"
    write_wav(path, models.synthesize_audio(0.5, 330.0), models.SAMPLE_RATE)
    encoded = base64.b64encode(path.read_bytes()).decode()
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    answer = client.chat.completions.create(
        model=MODEL, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What do you hear?"},
            {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}},
        ]}],
    )
    message = answer.choices[0].message
    assert message.audio is not None and message.audio.transcript == message.content
    wav = base64.b64decode(message.audio.data)
    samples, _ = decode_wav(path.read_bytes())
    expected = speech_server.expected_pcm("What do you hear?", audio_pcm=samples)
    assert wav == wav_header(models.SAMPLE_RATE, len(expected)) + expected
    assert answer.usage is not None and answer.usage.completion_tokens == TOKENS


async def test_eight_concurrent_streaming_clients_get_the_same_audio(speech_server: SpeechServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    results: dict[int, bytes] = {}

    async def speak(i: int) -> None:
        async with client.audio.speech.with_streaming_response.create(
            model=MODEL, input="all together", voice="alloy", response_format="pcm"
        ) as response:
            results[i] = b"".join([chunk async for chunk in response.iter_bytes()])

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(speak, i)
    expected = await trio.to_thread.run_sync(speech_server.expected_pcm, "all together")
    assert [results[i] == expected for i in range(8)] == [True] * 8
    await client.close()


def test_a_client_leaving_mid_stream_leaves_nothing_behind(speech_server: SpeechServer) -> None:
    before = _metric(httpx.get(f"{speech_server.url}/metrics").text, 'omni_trio_requests_total{outcome="disconnected"}')
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long answer"}], "stream": True,
            "max_tokens": 1000, "modalities": ["text", "audio"], "audio": {"voice": "nova", "format": "pcm16"}}
    with httpx.stream("POST", f"{speech_server.url}/v1/chat/completions", json=body, timeout=60) as response:
        next(response.iter_lines())  # (test_errors.py shows the abort on a request that cannot end by itself)
    # The abort reaches every stage at once: within a bounded wait nothing of it is left anywhere, and
    # the request is counted as disconnected.

    async def settled() -> None:
        with trio.fail_after(20):
            while not (await speech_server.pipeline.stats()).idle:
                await trio.sleep(0.01)

    speech_server.call(settled)
    metrics_url = f"{speech_server.url}/metrics"
    outcome = 'omni_trio_requests_total{outcome="disconnected"}'
    deadline = time.monotonic() + 20
    while _metric(httpx.get(metrics_url).text, outcome) != before + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _metric(httpx.get(metrics_url).text, outcome) == before + 1


def test_models_health_and_metrics(speech_server: SpeechServer) -> None:
    models_list = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused").models.list()
    assert [m.id for m in models_list.data] == [MODEL]
    health = httpx.get(f"{speech_server.url}/health")
    assert health.status_code == 200 and health.json() == {"status": "ok", "processes": {"main": "ready"}}
    metrics = httpx.get(f"{speech_server.url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for name in ("omni_trio_requests_total", "omni_trio_requests_in_flight", "omni_trio_request_duration_seconds",
                 "omni_trio_time_to_first_audio_seconds"):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    first_audio = _metric(text, "omni_trio_time_to_first_audio_seconds_count")
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    client.audio.speech.create(model=MODEL, input="count me", voice="alloy", response_format="pcm").read()
    again = httpx.get(f"{speech_server.url}/metrics").text
    assert _metric(again, "omni_trio_time_to_first_audio_seconds_count") == first_audio + 1
    ok = 'omni_trio_requests_total{outcome="ok"}'
    assert _metric(again, ok) > _metric(text, ok)


def test_a_wav_stream_starts_with_a_streaming_header(speech_server: SpeechServer) -> None:
    body = {"model": MODEL, "input": "wave at me", "voice": "alloy", "response_format": "wav"}
    with httpx.stream("POST", f"{speech_server.url}/v1/audio/speech", json=body,
                      headers={"accept": "application/octet-stream"}, timeout=60) as response:
        assert response.headers["content-type"] == "audio/wav"
        parts = list(response.iter_raw())
    wav = b"".join(parts)
    # The header has no length (the audio is still being made), and arrives with the first samples.
    assert parts[0].startswith(wav_header(models.SAMPLE_RATE)) and len(parts[0]) > 44
    assert wav[44:] == speech_server.expected_pcm("wave at me")


def test_voice_and_speed_change_the_audio(speech_server: SpeechServer) -> None:
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def speak(voice: str, speed: float = 1.0) -> bytes:
        return client.audio.speech.create(model=MODEL, input="in my voice", voice=voice, speed=speed,
                                          response_format="pcm").read()

    alloy, onyx = speak("alloy"), speak("onyx")
    assert alloy == speech_server.expected_pcm("in my voice")  # alloy is the model's own voice
    assert onyx == speech_server.expected_pcm("in my voice", voice="onyx")
    assert len(onyx) == len(alloy) and onyx != alloy
    assert len(speak("alloy", 2.0)) == len(alloy) // 2
    assert len(speak("alloy", 0.5)) == len(alloy) * 2
    for bad, param in [({"voice": "nobody"}, "voice"), ({"speed": 9}, "speed")]:
        body = {"model": MODEL, "input": "hi", "voice": "alloy", **bad}
        response = httpx.post(f"{speech_server.url}/v1/audio/speech", json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"],
            "audio": {"voice": "nobody", "format": "pcm16"}}
    response = httpx.post(f"{speech_server.url}/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "audio.voice", response.text
    assert "onyx" in response.json()["error"]["message"]  # it says which voices there are


def test_metrics_show_busy_stages_and_the_bytes_each_edge_carried(speech_server: SpeechServer) -> None:
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    before = httpx.get(f"{speech_server.url}/metrics").text
    pcm = client.audio.speech.create(model=MODEL, input="measure me", voice="alloy", response_format="pcm").read()
    after = httpx.get(f"{speech_server.url}/metrics").text
    for stage in ("preprocess", "text_encoder", "thinker", "talker", "vocoder"):
        assert _metric(after, f'omni_trio_stage_busy_seconds_total{{stage="{stage}"}}') > _metric(
            before, f'omni_trio_stage_busy_seconds_total{{stage="{stage}"}}'), stage
    to_caller = 'omni_trio_edge_bytes_total{from_stage="vocoder",to_stage="coordinator",transport="local_object"}'
    assert _metric(after, to_caller) - _metric(before, to_caller) == 2 * len(pcm)  # float32 made, PCM16 sent
