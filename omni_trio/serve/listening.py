"""Speech in: a transcription session of the pipeline (see :mod:`omni_trio.serve.adapter`).

:class:`Listener` is one client's transcription session: ``hear`` appends
audio and ``end_utterance`` ends an utterance; each returns the transcripts
that its append's stream chunks carried. Appends run one at a time (the
session's order is the audio's order), so no task needs to read the session's
events alongside. ``/v1/audio/transcriptions``
uses one per request, ``/v1/realtime`` one per connection.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import trio

from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.coordinator.sessions import Session
from omni_trio.events import StreamMessage
from omni_trio.serve.adapter import ServeAdapter, Transcript
from omni_trio.serve.schemas import HTTPError

#: Audio appended at once when a whole file is transcribed: long enough to keep the operations few,
#: short enough that partial transcripts arrive while the rest is decoded.
FILE_CHUNK_S = 1.0


def not_transcribing(adapter: ServeAdapter, model: str) -> HTTPError | None:
    """The 400 for a model whose adapter has no transcription stages (None when it has)."""
    if adapter.transcription_stages:
        return None
    return HTTPError(400, f"the model {model!r} does not transcribe speech (its adapter has no transcription_stages)",
                     type="invalid_request_error", param="model", code="unsupported_model")


class Listener:
    """One open transcription session at ``sample_rate`` (PCM16 mono in)."""

    def __init__(self, session: Session, adapter: ServeAdapter, sample_rate: int) -> None:
        self.session = session
        self._adapter = adapter
        self.sample_rate = sample_rate

    @staticmethod
    def open(pipeline: Pipeline, adapter: ServeAdapter, kind: str) -> Session:
        """A fresh transcription session (enter it with ``async with``), its id naming ``kind``."""
        return pipeline.session(f"{kind}-{secrets.token_hex(6)}", stages=list(adapter.transcription_stages))

    async def hear(self, pcm: bytes) -> list[Transcript]:
        """Append PCM16 audio to the open utterance; the transcripts so far that it gave."""
        await self.session.append(self._adapter.transcription_chunk(pcm, self.sample_rate))
        return self._said()

    async def end_utterance(self) -> list[Transcript]:
        """End the open utterance; its transcripts, the last one final."""
        await self.session.append(self._adapter.transcription_end(self.sample_rate))
        return self._said()

    def _said(self) -> list[Transcript]:
        # The append returned once its output was queued, so everything it said is here now.
        said: list[Transcript] = []
        while True:
            try:
                event = self.session.events().receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return said
            if isinstance(event, StreamMessage):
                transcript = self._adapter.transcript(event)
                if transcript is not None:
                    said.append(transcript)


def appended_text(before: str, now: str) -> str:
    """What ``now`` adds to ``before`` (empty when ``now`` revised earlier words: deltas only append)."""
    return now[len(before):] if now.startswith(before) else ""


async def transcribe_file(listener: Listener, pcm: bytes,
                          on_delta: Callable[[str], Awaitable[None]] | None = None) -> str:
    """Transcribe a whole file's audio, appended in :data:`FILE_CHUNK_S` pieces; ``on_delta`` hears the text
    as it grows. Returns the final transcript."""
    step = 2 * round(FILE_CHUNK_S * listener.sample_rate)
    text = ""
    final = None
    pieces = [pcm[start:start + step] for start in range(0, len(pcm), step)]
    for piece in [*pieces, None]:
        for transcript in await (listener.hear(piece) if piece is not None else listener.end_utterance()):
            delta = appended_text(text, transcript.text)
            text = transcript.text
            if delta and on_delta is not None:
                await on_delta(delta)
            if transcript.final:
                final = transcript.text
    return text if final is None else final
