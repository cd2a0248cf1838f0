"""The strict converter for untrusted wire maps (a DataRef's), and the text of what it refused.

Control messages are flat and checked by their classes' validators (:mod:`omni_trio.control.wire.codec`);
a DataRef's map nests (buffer, tensor entries), so :mod:`omni_trio.comm.dataref` structures it with
the converter built here, whose hooks take only the exact types.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable
from typing import Any

import cattrs
from cattrs.v import format_exception

from omni_trio.errors import describe_error

__all__ = ["describe_invalid", "strict_converter"]


def _strict(tp: type) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        # Exact type: bool is an int subclass, str(1) must not become "1".
        if type(value) is not tp:
            raise TypeError(f"expected {tp.__name__}, got {type(value).__name__}")
        return value

    return hook


def _structure_float(value: Any, _: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise TypeError(f"expected float, got {type(value).__name__}")


def strict_converter() -> cattrs.Converter:
    """A cattrs converter that takes only the exact types: no ``"1"`` for an int, no ``True`` for an
    int, no string for a list, extra keys refused, enums by value; defaults left off the wire."""
    conv = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True)
    for tp in (str, bytes, int, bool):
        conv.register_structure_hook(tp, _strict(tp))
    conv.register_structure_hook(float, _structure_float)

    def is_list(tp: Any) -> bool:
        return typing.get_origin(tp) is list

    def list_factory(tp: Any) -> Callable[[Any, Any], Any]:
        (item_type,) = typing.get_args(tp) or (Any,)
        item_hook = conv.get_structure_hook(item_type)

        def hook(value: Any, _: Any) -> list[Any]:
            if type(value) is not list:
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return [item_hook(v, item_type) for v in value]

        return hook

    def is_var_tuple(tp: Any) -> bool:
        args = typing.get_args(tp)
        return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis

    def tuple_factory(tp: Any) -> Callable[[Any, Any], Any]:
        item_type = typing.get_args(tp)[0]
        item_hook = conv.get_structure_hook(item_type)

        def hook(value: Any, _: Any) -> tuple[Any, ...]:
            # msgpack arrays decode as lists; tuples come from in-process use.
            if type(value) is not list and type(value) is not tuple:
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return tuple(item_hook(v, item_type) for v in value)

        return hook

    def is_dict(tp: Any) -> bool:
        return tp is dict or typing.get_origin(tp) is dict

    def dict_factory(tp: Any) -> Callable[[Any, Any], Any]:
        args = typing.get_args(tp)
        key_type, value_type = args if args else (Any, Any)
        key_hook = conv.get_structure_hook(key_type) if key_type is not Any else None
        value_hook = conv.get_structure_hook(value_type) if value_type is not Any else None

        def hook(value: Any, _: Any) -> dict[Any, Any]:
            if type(value) is not dict:
                raise TypeError(f"expected a map, got {type(value).__name__}")
            if key_hook is None and value_hook is None:
                return value
            return {
                (key_hook(k, key_type) if key_hook else k): (value_hook(v, value_type) if value_hook else v)
                for k, v in value.items()
            }

        return hook

    def structure_enum(value: Any, tp: Any) -> Any:
        if isinstance(value, tp):
            return value
        if type(value) is str or type(value) is int:
            try:
                return tp(value)
            except ValueError:
                pass
        raise ValueError(f"{value!r} is not a valid {tp.__name__}")

    def unstructure_enum(value: enum.Enum) -> Any:
        return value.value

    # Registered for StrEnum/IntEnum too: they are str/int subclasses and
    # dispatch (by MRO) would otherwise pick the strict str/int hooks.
    for base in (enum.Enum, enum.StrEnum, enum.IntEnum):
        conv.register_structure_hook(base, structure_enum)
        conv.register_unstructure_hook(base, unstructure_enum)

    conv.register_structure_hook_factory(is_list, list_factory)
    conv.register_structure_hook_factory(is_var_tuple, tuple_factory)
    conv.register_structure_hook_factory(is_dict, dict_factory)
    return conv


def _format_leaf(exc: BaseException, type_: Any) -> str:
    base = format_exception(exc, type_)
    detail = str(exc)
    # cattrs' generic text ("invalid value") hides our validators' reasons.
    if detail and detail not in base and not isinstance(exc, KeyError):
        return f"{base} ({detail[:200]})"
    return base


def describe_invalid(exc: BaseException) -> str:
    """One line on what was wrong with a structured map: each field's problem, with its path, for a
    cattrs validation error; :func:`~omni_trio.errors.describe_error`'s text for anything else."""
    if isinstance(exc, cattrs.BaseValidationError):
        try:
            return "; ".join(cattrs.transform_error(exc, format_exception=_format_leaf))
        except Exception:  # noqa: BLE001 - describing must never fail the decode
            pass
    return describe_error(exc)
