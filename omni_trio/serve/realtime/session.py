"""A realtime session's settings: what ``session.update`` may change, checked, and the session object sent back."""

from __future__ import annotations

from typing import Any

import attrs

from omni_trio.serve.adapter import ResponseSettings
from omni_trio.serve.events import BadEvent

#: The one input and output audio format: PCM16 mono at 24 kHz, as OpenAI's default.
RATE = 24_000
PCM = {"type": "audio/pcm", "rate": RATE}


@attrs.frozen
class TurnDetection:
    """``server_vad``'s settings (OpenAI's names and defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The ``turn_detection`` object."""
        return {"type": "server_vad", **attrs.asdict(self)}


@attrs.frozen
class Settings:
    """The session as the client configured it: ``turn_detection`` None is manual turns."""

    model: str
    output_modalities: tuple[str, ...] = ("audio",)
    instructions: str = ""
    voice: str = "alloy"
    turn_detection: TurnDetection | None = attrs.field(factory=TurnDetection)

    def response(self) -> ResponseSettings:
        """What the adapter hears of these settings when it makes an answer."""
        return ResponseSettings(voice=self.voice, instructions=self.instructions,
                                audio="audio" in self.output_modalities)

    def as_dict(self, session_id: str) -> dict[str, Any]:
        """The ``session`` object of ``session.created`` and ``session.updated``."""
        detection = None if self.turn_detection is None else self.turn_detection.as_dict()
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": self.model,
            "output_modalities": list(self.output_modalities), "instructions": self.instructions,
            "audio": {"input": {"format": PCM, "turn_detection": detection},
                      "output": {"format": PCM, "voice": self.voice}},
        }


def _typed(value: Any, kind: type | tuple[type, ...], param: str) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise BadEvent(f"'{param}' has the wrong type", param=param)
    if not isinstance(value, kind):
        raise BadEvent(f"'{param}' has the wrong type: {type(value).__name__}", param=param)
    return value


def _check_format(value: Any, param: str) -> None:
    if value is None:
        return
    _typed(value, dict, param)
    if value.get("type") != "audio/pcm" or value.get("rate", RATE) != RATE:
        raise BadEvent(f"'{param}' must be {{'type': 'audio/pcm', 'rate': {RATE}}}: this server speaks PCM16 at "
                       f"24 kHz, got {value!r}", code="unsupported_audio_format", param=param)


def _turn_detection(value: Any, current: TurnDetection | None) -> TurnDetection | None:
    param = "session.audio.input.turn_detection"
    if value is None:
        return None
    _typed(value, dict, param)
    if value.get("type", "server_vad") != "server_vad":
        raise BadEvent(f"turn detection {value.get('type')!r} is not supported (server_vad, or null for manual "
                       "turns)", code="unsupported_turn_detection", param=f"{param}.type")
    base = current or TurnDetection()
    changes: dict[str, Any] = {}
    for field, kind in (("threshold", (int, float)), ("prefix_padding_ms", int), ("silence_duration_ms", int),
                        ("create_response", bool), ("interrupt_response", bool)):
        if value.get(field) is not None:
            changes[field] = _typed(value[field], kind, f"{param}.{field}")
    detection = attrs.evolve(base, **changes)
    if not 0.0 <= detection.threshold <= 1.0:
        raise BadEvent("'threshold' must be in [0, 1]", param=f"{param}.threshold")
    if not 0 <= detection.prefix_padding_ms <= 5000 or not 20 <= detection.silence_duration_ms <= 10_000:
        raise BadEvent("prefix_padding_ms must be in [0, 5000] and silence_duration_ms in [20, 10000]", param=param)
    return detection


def updated(settings: Settings, session: Any) -> Settings:
    """``settings`` with a ``session.update``'s ``session`` applied (nothing changes if any of it is bad)."""
    _typed(session, dict, "session")
    if session.get("type", "realtime") != "realtime":
        raise BadEvent("only 'realtime' sessions are served here", param="session.type")
    changes: dict[str, Any] = {}
    if "output_modalities" in session:
        modalities = tuple(_typed(session["output_modalities"], list, "session.output_modalities"))
        if modalities not in (("audio",), ("text",)):
            raise BadEvent("'output_modalities' must be ['audio'] or ['text']", param="session.output_modalities")
        changes["output_modalities"] = modalities
    if "instructions" in session:
        changes["instructions"] = _typed(session["instructions"], str, "session.instructions")
    audio = _typed(session.get("audio", {}), dict, "session.audio")
    audio_in = _typed(audio.get("input", {}), dict, "session.audio.input")
    audio_out = _typed(audio.get("output", {}), dict, "session.audio.output")
    _check_format(audio_in.get("format"), "session.audio.input.format")
    _check_format(audio_out.get("format"), "session.audio.output.format")
    if "turn_detection" in audio_in:
        changes["turn_detection"] = _turn_detection(audio_in["turn_detection"], settings.turn_detection)
    if "voice" in audio_out:
        changes["voice"] = _typed(audio_out["voice"], str, "session.audio.output.voice")
    return attrs.evolve(settings, **changes)
