"""The omni_speech example end to end, in both placements (see conftest.py for the scenarios)."""

from __future__ import annotations

import torch

from examples.omni_speech import models
from tests.speech.conftest import TOKENS, Recording


def dispatched(recording: Recording, request_id: str) -> list[str]:
    """The stages a request was dispatched to, from the trace, in order."""
    return [e["stage"] for e in recording.events
            if e["event"] == "stage_dispatch" and e.get("request_id") == request_id]


def test_audio_length_matches_generated_frames(speech_run: Recording) -> None:
    for speech in (speech_run.with_audio, speech_run.text_only, speech_run.after_abort):
        result = speech.result
        assert result is not None
        assert result["tokens"] == TOKENS
        assert result["frames"] == TOKENS * models.FRAMES_PER_TOKEN
        assert result["samples_per_frame"] == models.SAMPLES_PER_FRAME
        assert result["samples"] == result["frames"] * models.SAMPLES_PER_FRAME
        assert result["sample_rate"] == models.SAMPLE_RATE
        assert speech.pcm.numel() == result["samples"]


def test_pcm_chunks_arrive_in_order_and_add_up(speech_run: Recording) -> None:
    for speech in (speech_run.with_audio, speech_run.text_only, *speech_run.concurrent):
        assert speech.result is not None
        assert speech.chunk_ids == list(range(speech.result["frames"]))
        assert all(chunk.dtype == torch.float32 and chunk.shape == (models.SAMPLES_PER_FRAME,)
                   for chunk in speech.pcm_chunks)
        assert sum(chunk.numel() for chunk in speech.pcm_chunks) == speech.result["samples"]
        assert speech.chunk_ns == sorted(speech.chunk_ns)


def test_same_pcm_in_both_placements(embedded_run: Recording, processes_run: Recording) -> None:
    for name in ("with_audio", "text_only", "after_abort"):
        embedded, processes = getattr(embedded_run, name), getattr(processes_run, name)
        assert embedded.result == processes.result, name
        assert torch.equal(embedded.pcm, processes.pcm), name
    # The audio changes what the thinker says, hence the speech.
    assert not torch.equal(embedded_run.with_audio.pcm, embedded_run.text_only.pcm)


def test_request_without_audio_skips_audio_encoder(speech_run: Recording) -> None:
    with_audio = dispatched(speech_run, "with-audio")
    # The encoders run in parallel: either may be dispatched first.
    assert with_audio[0] == "preprocess" and with_audio[3:] == ["thinker", "talker", "vocoder"]
    assert sorted(with_audio[1:3]) == ["audio_encoder", "text_encoder"]
    assert dispatched(speech_run, "text-only") == ["preprocess", "text_encoder", "thinker", "talker", "vocoder"]
    assert speech_run.with_audio.result is not None and speech_run.with_audio.result["audio_batch"] == 1
    assert speech_run.text_only.result is not None and speech_run.text_only.result["audio_batch"] == 0


def test_abort_mid_stream_leaves_nothing_behind(speech_run: Recording) -> None:
    aborted = speech_run.aborted
    assert aborted.chunks == 1
    assert aborted.idle_after, aborted.stats_after
    assert aborted.abort_again is False
    events = [e["event"] for e in speech_run.events if e.get("request_id") == "abort-me"]
    assert "request_aborted" in events and "request_completed" not in events
    # The pipeline still serves, and the abort did not disturb the next request.
    assert torch.equal(speech_run.after_abort.pcm, speech_run.text_only.pcm)


def test_concurrent_requests_match_a_lone_one(speech_run: Recording) -> None:
    # The audio encoder batches concurrent requests; padding is masked, so batching changes nothing.
    lone = speech_run.with_audio.result
    for speech in speech_run.concurrent:
        assert speech.result is not None and lone is not None
        assert speech.result["text"] == lone["text"] and speech.result["samples"] == lone["samples"]
        assert torch.equal(speech.pcm, speech_run.with_audio.pcm)
