"""/metrics against the demo pipeline, in-process and one worker process per model.

After real requests through the openai client, every stage that computed
shows busy seconds, and the bytes per edge equal what ``stats()`` counted,
what the trace logged for the edges between processes, and (to the caller)
twice the PCM16 bytes the clients received (the vocoder makes float32). A
client that leaves mid-stream leaves nothing behind, /dev/shm included.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import omni_trio as ot
from examples.omni_speech import models
from examples.omni_speech.pipeline import STAGES, make_config, write_wav
from omni_trio.comm.segments import is_pooled_slot
from tests.process import helpers

MODEL = "omni-speech-metrics"
Edge = tuple[str, str, str]


@contextlib.contextmanager
def _short_dir() -> Iterator[Path]:
    # Unix socket paths are at most ~100 bytes: pytest's tmp_path is too long for the IPC directory.
    path = Path(tempfile.mkdtemp(prefix="otm-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _totals(text: str) -> tuple[dict[str, float], dict[Edge, float]]:
    busy: dict[str, float] = {}
    edges: dict[Edge, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "omni_trio_stage_busy_seconds_total":
                busy[sample.labels["stage"]] = sample.value
            elif sample.name == "omni_trio_edge_bytes_total":
                labels = sample.labels
                edges[(labels["from_stage"], labels["to_stage"], labels["transport"])] = sample.value
    return busy, edges


def _traced_bytes(trace: Path) -> dict[Edge, int]:
    """Tensor bytes the trace logged per edge between processes (local edges log no sends)."""
    sent: dict[Edge, int] = defaultdict(int)
    for event in ot.read_trace(trace):
        if event["event"] in ("comm_payload_send", "comm_stream_send"):
            sent[(event["from_stage"], event["to_stage"], event["transport"])] += event["bytes"]
    return dict(sent)


@pytest.mark.parametrize("placement", ["embedded", "processes"])
async def test_metrics_count_each_stages_compute_and_each_edges_bytes(placement: str) -> None:
    with _short_dir() as base, helpers.nothing_left_behind(base):
        config = attrs.evolve(
            make_config(placement, base_path=str(base)),
            serve=ot.ServeConfig(model=MODEL, adapter="examples.omni_speech.serve.SpeechAdapter",
                                 adapter_options={"max_new_tokens": 6}),
        )
        wav = base / "tone.wav"
        # Two seconds of audio: its log-mel features (32 KB) are too big to travel inline.
        write_wav(wav, models.synthesize_audio(2.0, 330.0), models.SAMPLE_RATE)
        trace = base / "run.jsonl"
        with trio.fail_after(240):
            async with ot.open_pipeline(config, trace=trace) as pipeline, trio.open_nursery() as nursery:
                address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
                client = openai.AsyncOpenAI(base_url=f"{address.url}/v1", api_key="unused", max_retries=0,
                                            timeout=120)
                async with client.audio.speech.with_streaming_response.create(
                    model=MODEL, input="count my bytes", voice="alloy", response_format="pcm"
                ) as response:
                    received = len(b"".join([chunk async for chunk in response.iter_bytes()]))
                answer = await client.chat.completions.create(
                    model=MODEL, modalities=["text", "audio"], audio={"voice": "nova", "format": "pcm16"},
                    messages=[{"role": "user", "content": [
                        {"type": "text", "text": "and these"},
                        {"type": "input_audio",
                         "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"}},
                    ]}],
                )
                assert answer.choices[0].message.audio is not None
                received += len(base64.b64decode(answer.choices[0].message.audio.data))
                await client.close()
                async with httpx.AsyncClient(base_url=address.url) as http:
                    busy, edges = _totals((await http.get("/metrics")).text)
                stats = await pipeline.stats()
                nursery.cancel_scope.cancel()
        traced = _traced_bytes(trace)  # every process has closed its file

    # Every stage computed (the chat request needed the audio encoder too).
    assert set(busy) == set(STAGES)
    assert all(seconds > 0 for seconds in busy.values()), busy
    assert busy == pytest.approx(stats.busy_seconds)
    # Nothing moved between the scrape and stats(): the same bytes on the same edges.
    assert edges == {edge: float(nbytes) for edge, nbytes in stats.edge_bytes.items()}
    # The caller received every sample the vocoder made: float32 there, PCM16 on the wire.
    assert {edge: n for edge, n in edges.items() if edge[1] == "coordinator"} == {
        ("vocoder", "coordinator", "local_object" if placement == "embedded" else "inline"): 2 * received
    }
    transports: dict[tuple[str, str], set[str]] = defaultdict(set)
    for src, dst, transport in edges:
        transports[(src, dst)].add(transport)
    if placement == "embedded":
        assert set().union(*transports.values()) == {"local_object"}
        return
    # The chat request's 2 s of audio travels in its params with every payload after preprocess: by
    # shared memory; the speech request's payloads and the small stream chunks go inline.
    assert transports == {
        ("coordinator", "preprocess"): {"inline", "shm"},  # the submits
        ("preprocess", "text_encoder"): {"local_object"},  # both in p_text
        ("preprocess", "audio_encoder"): {"shm"},
        ("text_encoder", "thinker"): {"inline", "shm"},
        ("audio_encoder", "thinker"): {"shm"},
        ("thinker", "talker"): {"inline", "shm"},
        ("talker", "vocoder"): {"inline", "shm"},
        ("vocoder", "coordinator"): {"inline"},  # chunks, and a result without the request
    }
    # The edges between processes are exactly what their sends logged.
    cross = {edge: int(n) for edge, n in edges.items() if edge[2] != "local_object"}
    assert cross == traced


async def test_a_client_leaving_mid_stream_leaves_no_shared_memory() -> None:
    with _short_dir() as base, helpers.nothing_left_behind(base):
        config = attrs.evolve(
            make_config("processes", base_path=str(base)),
            serve=ot.ServeConfig(model=MODEL, adapter="examples.omni_speech.serve.SpeechAdapter",
                                 adapter_options={"max_tokens_limit": 1000}),
        )
        wav = base / "tone.wav"
        write_wav(wav, models.synthesize_audio(2.0, 220.0), models.SAMPLE_RATE)
        body = {
            "model": MODEL, "stream": True, "max_tokens": 600, "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": "pcm16"},
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "a long answer"},
                {"type": "input_audio",
                 "input_audio": {"data": base64.b64encode(wav.read_bytes()).decode(), "format": "wav"}},
            ]}],
        }
        with trio.fail_after(240):
            async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
                async with httpx.AsyncClient(base_url=address.url, timeout=None) as client:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                        lines = response.aiter_lines()
                        while '"audio":{"id"' not in await anext(lines):
                            pass
                        # Audio is streaming while the request is still live everywhere.
                        assert (await pipeline.stats()).live_requests == 1
                    # Hung up: the abort reaches every stage.
                    with trio.fail_after(20):
                        while not (await pipeline.stats()).idle:
                            await trio.sleep(0.01)
                prefix = helpers.run_prefix(helpers.ipc_dir(base))
                left = [s for s in helpers.shm_segments() if s.startswith(f"{prefix}-") and not is_pooled_slot(s)]
                assert left == []
                nursery.cancel_scope.cancel()
