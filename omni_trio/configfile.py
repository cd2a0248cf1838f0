"""Pipeline configs in files: TOML, JSON, and YAML when PyYAML is installed.

:func:`load_config` reads a file through cattrs into :class:`PipelineConfig`
(unknown keys are errors, every problem reported with its path);
:func:`save_config` writes one back. Both pick the format from the suffix.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import cattrs
from cattrs.errors import ForbiddenExtraKeysError

from omni_trio.config import PipelineConfig
from omni_trio.errors import ConfigError, ConfigProblem

_converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True)

_SUFFIXES = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def _format(path: Path) -> str:
    try:
        return _SUFFIXES[path.suffix.lower()]
    except KeyError:
        problem = ConfigProblem(str(path), f"unknown config format {path.suffix!r}; use .toml, .json or .yaml")
        raise ConfigError([problem]) from None


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError([ConfigProblem("", "YAML configs need PyYAML: pip install pyyaml")]) from None
    return yaml


def _describe(error: BaseException, type_: Any) -> str:
    if isinstance(error, ConfigError):
        return "\x00".join(f"{p.message} @@{p.path}" for p in error.problems)
    if isinstance(error, ForbiddenExtraKeysError):
        return f"unknown key(s) {sorted(error.extra_fields)}"
    if isinstance(error, KeyError):
        return "required key is missing"
    return f"{type(error).__name__}: {error}"


def _problems(error: BaseException) -> list[ConfigProblem]:
    """Flatten a cattrs structuring error into problems with config paths."""
    if isinstance(error, ConfigError):
        return error.problems
    problems = []
    for line in cattrs.transform_error(error, format_exception=_describe):
        message, _, where = line.rpartition(" @ $")
        where = where.lstrip(".")
        for part in message.split("\x00"):
            text, _, inner = part.partition(" @@")
            problems.append(ConfigProblem(".".join(p for p in (where, inner) if p) or "(top level)", text))
    return problems


def config_from_dict(data: dict[str, Any]) -> PipelineConfig:
    """Build a PipelineConfig from plain data; raise ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem("", f"a config is a table/object, got {type(data).__name__}")])
    try:
        return _converter.structure(data, PipelineConfig)
    except Exception as exc:  # noqa: BLE001 - every structuring failure becomes a ConfigProblem
        raise ConfigError(_problems(exc)) from None


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read a pipeline config from a TOML, JSON or YAML file."""
    file = Path(path)
    kind = _format(file)
    text = file.read_text(encoding="utf-8")
    try:
        if kind == "toml":
            data = tomllib.loads(text)
        elif kind == "json":
            data = json.loads(text)
        else:
            data = _yaml().safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError([ConfigProblem(str(file), f"cannot parse: {exc}")]) from None
    return config_from_dict(data)


def config_to_dict(config: PipelineConfig) -> dict[str, Any]:
    """Plain data for ``config`` (fields left at their defaults are omitted)."""
    data: dict[str, Any] = _converter.unstructure(config)
    return data


def save_config(config: PipelineConfig, path: str | os.PathLike[str]) -> None:
    """Write ``config`` to a TOML (simple values only), JSON or YAML file."""
    file = Path(path)
    kind = _format(file)
    data = config_to_dict(config)
    if kind == "json":
        text = json.dumps(data, indent=2) + "\n"
    elif kind == "yaml":
        text = _yaml().safe_dump(data, sort_keys=False)
    else:
        text = _dump_toml(data)
    file.write_text(text, encoding="utf-8")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError([ConfigProblem("", f"cannot write {type(value).__name__} values to TOML; use JSON")])


def _dump_toml(data: dict[str, Any]) -> str:
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items() if key != "stages"]
    for stage in data.get("stages", []):
        lines += ["", "[[stages]]"] + [f"{key} = {_toml_value(value)}" for key, value in stage.items()]
    return "\n".join(lines) + "\n"
