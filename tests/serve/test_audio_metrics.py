"""The server's audio series: the gap arithmetic on hand-made times, then /metrics after real streams.

The server is the module's demo (omni_speech) server (conftest.py), driven with the openai client;
a fresh module server, so the audio series count only this module's streams.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from examples.omni_speech import models
from omni_trio.serve.metrics import Playback
from tests.serve.conftest import MODEL, TOKENS, SpeechServer

STREAM_S = TOKENS * 4 * models.SAMPLES_PER_FRAME / 24_000  # the audio of one answer, in seconds


def test_a_chunk_sent_after_the_audio_before_it_played_is_a_gap() -> None:
    playback = Playback()
    assert playback.sent(10.0, 0.5) == 0.0  # playback starts: the next chunk is due at 10.5
    assert playback.sent(10.25, 0.5) == 0.0  # early: due at 11.0
    assert playback.sent(11.0, 0.25) == 0.0  # exactly on time: due at 11.25
    assert playback.sent(11.5, 0.5) == 0.25  # a gap: the player waited 0.25 s, so the next is due at 12.0
    assert playback.sent(11.75, 1.0) == 0.0  # due at 13.0
    assert playback.sent(13.5, 0.5) == 0.5  # another gap
    assert (playback.start, playback.sent_s, playback.gaps, playback.underrun_s) == (10.75, 3.25, 2, 0.75)


def _samples(text: str) -> dict[str, float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("omni_trio_audio_"):
                assert sample.labels.get("model") == MODEL, sample
                if sample.name.endswith("_bucket"):
                    continue
                found[sample.name] = sample.value
    return found


@pytest.mark.parametrize("streams", [3])
def test_the_audio_series_after_real_streams(speech_server: SpeechServer, streams: int) -> None:
    client = openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    for i in range(streams):
        with client.audio.speech.with_streaming_response.create(
            model=MODEL, input=f"measure me {i}", voice="alloy", response_format="pcm"
        ) as response:
            assert len(b"".join(response.iter_bytes())) == round(STREAM_S * 24_000 * 2)
    series = _samples(httpx.get(f"{speech_server.url}/metrics").text)
    assert series["omni_trio_audio_ttfp_seconds_count"] == streams
    assert 0 < series["omni_trio_audio_ttfp_seconds_sum"] < 60
    assert series["omni_trio_audio_rtf_count"] == streams
    assert series["omni_trio_audio_rtf_sum"] > 0
    assert series["omni_trio_audio_streams_active"] == 0
    gaps = series["omni_trio_audio_stream_gaps_total"]
    underrun = series["omni_trio_audio_underrun_seconds_total"]
    assert gaps >= 0 and underrun >= 0 and (underrun > 0) == (gaps > 0)
