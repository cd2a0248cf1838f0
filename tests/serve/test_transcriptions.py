"""``POST /v1/audio/transcriptions`` of the served voice pipeline, with the official openai client and httpx.

Real speech (espeak-ng) is recognised by the real ASR (pocketsphinx) in a
transcription session; recognition is not perfect, so the checks ask for most
of the spoken words.
"""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Iterator

import httpx
import openai
import pytest

from omni_trio.serve import wav_header
from tests.serve.voice_server import MODEL, VoiceServer, speech_pcm16, voice_server, words

SAID = "one two three four five"


@pytest.fixture(scope="module", params=["embedded", "processes"])
def server(request: pytest.FixtureRequest) -> Iterator[VoiceServer]:
    with voice_server(request.param) as running:
        yield running


def _wav(pcm: bytes, rate: int, channels: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


def _heard(text: str) -> int:
    """How many of the words of :data:`SAID` were recognised (the ASR hears some of them wrong)."""
    return len(words(text) & words(SAID))


@pytest.fixture(scope="module")
def client(server: VoiceServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("rate", [16_000, 24_000, 44_100])
def test_a_wav_at_any_common_rate_is_transcribed(client: openai.OpenAI, rate: int) -> None:
    audio = ("said.wav", _wav(speech_pcm16(SAID, rate), rate))
    transcript = client.audio.transcriptions.create(model=MODEL, file=audio)
    assert _heard(transcript.text) >= 2, transcript.text


def test_text_and_verbose_json_formats(client: openai.OpenAI) -> None:
    audio = ("said.wav", _wav(speech_pcm16(SAID, 16_000), 16_000))
    text = client.audio.transcriptions.create(model=MODEL, file=audio, response_format="text")
    assert isinstance(text, str) and _heard(text) >= 2
    verbose = client.audio.transcriptions.create(model=MODEL, file=audio, response_format="verbose_json",
                                                 language="en")
    assert verbose.language == "en" and _heard(verbose.text) >= 2
    assert verbose.duration == pytest.approx(len(speech_pcm16(SAID, 16_000)) / 32_000, abs=0.01)


def test_a_stereo_wav_is_mixed_down(client: openai.OpenAI) -> None:
    mono = speech_pcm16(SAID, 16_000)
    stereo = b"".join(mono[i:i + 2] * 2 for i in range(0, len(mono), 2))
    transcript = client.audio.transcriptions.create(model=MODEL, file=("s.wav", _wav(stereo, 16_000, channels=2)))
    assert _heard(transcript.text) >= 2


def test_raw_pcm_with_a_declared_rate(client: openai.OpenAI) -> None:
    transcript = client.audio.transcriptions.create(model=MODEL, file=("said.pcm", speech_pcm16(SAID, 24_000)),
                                                    extra_body={"sample_rate": "24000"})
    assert _heard(transcript.text) >= 2


def test_streamed_deltas_add_up_then_done_gives_the_text(client: openai.OpenAI) -> None:
    long_said = f"{SAID}, six seven eight nine ten"
    audio = ("said.wav", _wav(speech_pcm16(long_said, 16_000), 16_000))
    events = list(client.audio.transcriptions.create(model=MODEL, file=audio, stream=True))
    kinds = [event.type for event in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    deltas = [event.delta for event in events if event.type == "transcript.text.delta"]
    assert len(deltas) >= 2, "partial transcripts arrive while the audio is decoded"
    assert len(words(events[-1].text) & words(long_said)) >= 3, events[-1].text


def _post(server: VoiceServer, files: dict, data: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/transcriptions", files=files, data=data, timeout=60)


@pytest.mark.parametrize(
    ("files", "data", "param"),
    [
        ({"audio": ("a.wav", _wav(b"\0\0" * 1600, 16_000))}, {"model": MODEL}, "file"),
        ({"file": ("a.wav", _wav(b"\0\0" * 1600, 16_000))}, {}, "model"),
        ({"file": ("a.wav", _wav(b"\0\0" * 1600, 16_000))}, {"model": MODEL, "response_format": "srt"},
         "response_format"),
        ({"file": ("a.mp3", b"ID3\x03garbage")}, {"model": MODEL}, "file"),
        ({"file": ("a.pcm", b"\0\0" * 100)}, {"model": MODEL, "sample_rate": "fast"}, "sample_rate"),
        ({"file": ("a.wav", wav_header(16_000, 0))}, {"model": MODEL}, "file"),
        ({"file": ("a.wav", _wav(b"\0\0" * 1600, 16_000))}, {"model": MODEL, "stream": "maybe"}, "stream"),
    ],
)
def test_bad_forms_are_400s_naming_the_field(server: VoiceServer, files: dict, data: dict, param: str) -> None:
    response = _post(server, files, data)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_unknown_model_is_404_and_a_json_body_is_400(server: VoiceServer) -> None:
    response = _post(server, {"file": ("a.wav", _wav(b"\0\0" * 1600, 16_000))}, {"model": "whisper-1"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", content=json.dumps({"model": MODEL}),
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400


def test_silence_transcribes_to_nothing(client: openai.OpenAI) -> None:
    transcript = client.audio.transcriptions.create(model=MODEL, file=("quiet.wav", _wav(b"\0\0" * 16_000, 16_000)))
    assert transcript.text == ""
