"""The bounds of ``WS /v1/realtime`` (:class:`omni_trio.SocketLimits`), bad events, and its /metrics series.

A raw ``websockets`` client, so close codes and malformed messages can be
seen and sent as they are.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from omni_trio.serve import SocketLimits
from tests.serve.voice_server import MODEL, VoiceServer, silence, speech_pcm16, voice_server

LIMITS = SocketLimits(max_message_bytes=256 * 1024, max_turn_audio_s=3.0, max_session_audio_s=6.0,
                      idle_timeout_s=6.0)


@pytest.fixture(scope="module")
def server() -> Iterator[VoiceServer]:
    with voice_server(limits=LIMITS) as running:
        yield running


@contextlib.contextmanager
def _open(server: VoiceServer) -> Iterator[ClientConnection]:
    with connect(f"{server.ws_url}/realtime?model={MODEL}", open_timeout=30, max_size=None) as ws:
        assert _next(ws)["type"] == "session.created"
        yield ws


def _next(ws: ClientConnection, kind: str | None = None) -> dict[str, Any]:
    while True:
        event = json.loads(ws.recv(timeout=60))
        if kind is None or event["type"] == kind:
            return dict(event)


def _send(ws: ClientConnection, **event: Any) -> None:
    ws.send(json.dumps(event))


def _append(ws: ClientConnection, pcm: bytes) -> None:
    _send(ws, type="input_audio_buffer.append", audio=base64.b64encode(pcm).decode())


def _manual(ws: ClientConnection) -> None:
    _send(ws, type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    _next(ws, "session.updated")


def test_bad_events_name_the_problem_and_the_session_goes_on(server: VoiceServer) -> None:
    with _open(server) as ws:
        sent = ["{not json", "[" * 100_000 + "]" * 100_000, json.dumps([1]), json.dumps({"no": "type"}),
                json.dumps({"type": "input_audio_buffer.append", "audio": "***"}),
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
                json.dumps({"type": "response.create"}), json.dumps({"type": "input_audio_buffer.commit"})]
        codes = []
        for text in sent:
            ws.send(text)
            codes.append(_next(ws)["error"]["code"])
        ws.send(b"binary")
        codes.append(_next(ws)["error"]["code"])
        assert codes == ["invalid_json", "invalid_json", "invalid_event", "invalid_event", "invalid_base64",
                         "invalid_audio", "response_without_input", "input_audio_buffer_commit_empty",
                         "invalid_event"]
        _manual(ws)  # still served


def test_audio_per_turn_and_per_session_is_bounded(server: VoiceServer) -> None:
    with _open(server) as ws:
        _manual(ws)
        _append(ws, silence(2.9))
        _append(ws, silence(0.2))
        turn = _next(ws, "error")["error"]
        assert turn["code"] == "turn_audio_limit" and turn["param"] == "audio"
        _send(ws, type="input_audio_buffer.commit")
        _next(ws, "input_audio_buffer.committed")
        _append(ws, silence(2.9))
        _send(ws, type="input_audio_buffer.commit")
        _next(ws, "input_audio_buffer.committed")
        _append(ws, silence(0.4))  # 6.2 s in all, over 6
        assert _next(ws, "error")["error"]["code"] == "session_audio_limit"


def test_a_message_over_the_size_limit_closes_with_1009(server: VoiceServer) -> None:
    with _open(server) as ws:
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * LIMITS.max_message_bytes}))
        with pytest.raises(ConnectionClosed) as closed:
            _next(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_an_idle_connection_is_told_and_closed(server: VoiceServer) -> None:
    with _open(server) as ws:
        assert _next(ws)["error"]["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed) as closed:
            _next(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_metrics_show_sessions_turns_barge_ins_and_latency(server: VoiceServer) -> None:
    with _open(server) as ws:
        turn = speech_pcm16("one two three") + silence(0.8)  # under the limits; server VAD ends it
        for start in range(0, len(turn), 9600):
            _append(ws, turn[start:start + 9600])
        _next(ws, "response.output_audio.delta")
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        done = _next(ws, "response.done")
        assert done["response"]["status"] == "completed"
    series = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("omni_trio_realtime")}
    assert series["omni_trio_realtime_sessions_active"] == 1.0
    assert series["omni_trio_realtime_turns_total"] >= 1.0
    assert series["omni_trio_realtime_barge_ins_total"] >= 0.0
    count = series["omni_trio_realtime_speech_end_to_first_audio_seconds_count"]
    total = series["omni_trio_realtime_speech_end_to_first_audio_seconds_sum"]
    assert count >= 1.0 and 0.0 < total / count < 30.0


def test_one_session_over_the_limit_is_refused_with_1013() -> None:
    with (voice_server(limits=SocketLimits(max_realtime_sessions=1)) as server, _open(server),
          connect(f"{server.ws_url}/realtime?model={MODEL}", open_timeout=30) as refused):
        assert json.loads(refused.recv(timeout=30))["error"]["code"] == "session_limit_reached"
        with pytest.raises(ConnectionClosed) as closed:
            refused.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
