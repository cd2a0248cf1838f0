"""The request schemas on untrusted bodies: every body is a 400 naming what is wrong, or a request whose
every field has its declared type (finite numbers included)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from omni_trio.serve import schemas
from tests.field_types import fields_conform

WEIRD: list[Any] = [
    None, True, False, 0, -1, 1.5, 2**70, float("nan"), float("inf"), -float("inf"), "", "x", "audio", "text",
    "pcm16", "wav", "user", [], ["audio"], ["text", "audio"], [1], {}, {"a": 1},
    [{"type": "text", "text": "hi"}], [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}],
]

CHAT = {
    "model": "m", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"],
    "audio": {"voice": "v", "format": "pcm16"}, "stream": True, "stream_options": {"include_usage": True},
    "max_tokens": 5, "deadline": 3,
}
SPEECH = {"model": "m", "input": "hi", "voice": "v", "response_format": "pcm", "stream_format": "audio",
          "speed": 1.0, "deadline": 2}


def _mutated(base: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    body = copy.deepcopy(base)
    for _ in range(rng.randint(1, 3)):
        target = body
        messages = body.get("messages")
        if rng.random() < 0.3 and isinstance(messages, list) and messages and isinstance(messages[0], dict):
            target = messages[0]
        elif rng.random() < 0.2 and isinstance(body.get("audio"), dict):
            target = body["audio"]
        key = rng.choice([*target, "extra", "content", "role"])
        if rng.random() < 0.2:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(rng.choice(WEIRD))
    return body


@pytest.mark.parametrize(("parse", "base"), [(schemas.chat_request, CHAT), (schemas.speech_request, SPEECH)],
                         ids=["chat", "speech"])
def test_fuzzed_bodies_are_a_bad_request_or_a_request_of_declared_types(
    parse: Callable[[dict[str, Any]], Any], base: dict[str, Any]
) -> None:
    rng = random.Random(11)
    parsed = 0
    for _ in range(3000):
        body = _mutated(base, rng)
        try:
            request = parse(body)
        except schemas.BadRequest as error:
            assert error.body()["error"]["message"], body
            continue
        parsed += 1
        assert fields_conform(request) == [], body
    assert parsed > 100  # the fuzzing kept valid bodies too, not only broken ones


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), 0, -1])
def test_a_deadline_must_be_a_finite_number_of_seconds_over_zero(deadline: float) -> None:
    with pytest.raises(schemas.BadRequest) as caught:
        schemas.speech_request({**SPEECH, "deadline": deadline})
    assert caught.value.body()["error"]["param"] == "deadline"
