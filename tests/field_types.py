"""Whether a value parsed from untrusted input has the type its attrs field declares, exactly."""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import attrs


def conforms(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of the annotated type ``tp``: exact types (a bool is no int, a str subclass no
    str), finite floats, every item of a list, tuple or dict, every field of an attrs class."""
    if tp is Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, arg) for arg in args)
    if tp is type(None):
        return value is None
    if origin is dict:
        return type(value) is dict and all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin is tuple:
        return type(value) is tuple and all(conforms(item, args[0]) for item in value)
    if origin is list:
        return type(value) is list and all(conforms(item, args[0]) for item in value)
    if attrs.has(tp):
        return type(value) is tp and not fields_conform(value)
    if tp is float:
        return type(value) is float and math.isfinite(value)
    return type(value) is tp


def fields_conform(instance: Any) -> list[str]:
    """The fields of the attrs ``instance`` whose value does not conform to their annotation, as
    ``Class.field = value`` (empty when all do)."""
    hints = typing.get_type_hints(type(instance))
    return [
        f"{type(instance).__name__}.{field.name} = {getattr(instance, field.name)!r}"
        for field in attrs.fields(type(instance))
        if not conforms(getattr(instance, field.name), hints[field.name])
    ]
