"""``WS /v1/realtime?model=M``: admission (the model, the transcription stages, the session limit), then a
:class:`~omni_trio.serve.realtime.connection.Connection` over a fresh transcription session."""

from __future__ import annotations

from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_trio.config import ServeConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import OmniTrioError, describe_error
from omni_trio.serve.adapter import ServeAdapter
from omni_trio.serve.events import dumps
from omni_trio.serve.limits import TRY_AGAIN_LATER, SocketLimits
from omni_trio.serve.listening import Listener, not_transcribing
from omni_trio.serve.metrics import Metrics
from omni_trio.serve.realtime.connection import Connection
from omni_trio.serve.realtime.session import RATE


class Realtime:
    """The realtime endpoint of one server; counts its open sessions."""

    def __init__(self, pipeline: Pipeline, config: ServeConfig, adapter: ServeAdapter, limits: SocketLimits,
                 metrics: Metrics) -> None:
        self._pipeline = pipeline
        self._config = config
        self._adapter = adapter
        self._limits = limits
        self._metrics = metrics
        self.open_sessions = 0

    async def _refuse(self, websocket: WebSocket, code: str, message: str, close_code: int) -> None:
        await websocket.send_text(dumps({"type": "error", "event_id": "event_refused", "error": {
            "type": "invalid_request_error", "code": code, "message": message, "param": None, "event_id": None}}))
        await websocket.close(close_code)

    async def connect(self, websocket: WebSocket) -> None:
        """One connection, from accept to close."""
        await websocket.accept()
        model = websocket.query_params.get("model", self._config.model)
        if model != self._config.model:
            await self._refuse(websocket, "model_not_found", f"the model {model!r} does not exist; this server "
                               f"serves {self._config.model!r}", 1008)
            return
        unsupported = not_transcribing(self._adapter, model)
        if unsupported is not None:
            await self._refuse(websocket, "unsupported_model", unsupported.message, 1008)
            return
        if self.open_sessions >= self._limits.max_realtime_sessions:
            await self._refuse(websocket, "session_limit_reached", f"{self.open_sessions} realtime sessions are "
                               "open, the server's limit; try again later", TRY_AGAIN_LATER)
            return
        self.open_sessions += 1
        self._metrics.realtime_sessions.inc()
        try:
            async with Listener.open(self._pipeline, self._adapter, "realtime") as session:
                listener = Listener(session, self._adapter, RATE)
                await Connection(websocket, self._pipeline, self._config, self._adapter, self._limits,
                                 self._metrics, listener).run()
        except WebSocketDisconnect:
            pass
        except OmniTrioError as exc:
            await self._refuse(websocket, "session_failed", describe_error(exc), 1011)
        finally:
            self.open_sessions -= 1
            self._metrics.realtime_sessions.dec()
