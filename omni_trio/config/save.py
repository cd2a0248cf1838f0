"""Writing pipeline configs to files, and what reading them (:mod:`omni_trio.config.load`) shares:
the cattrs converter and the formats by suffix (TOML, JSON, and YAML when PyYAML is installed).

It knows no config class (:class:`~omni_trio.config.PipelineConfig` writes itself through it), so
the config module can use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cattrs
from attrs import AttrsInstance

from omni_trio.errors import ConfigError, ConfigProblem

__all__ = ["config_to_dict", "converter", "file_format", "save_config", "yaml_module"]

converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True)

_SUFFIXES = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def file_format(path: Path) -> str:
    """The format a config file at ``path`` is in, from its suffix (ConfigError if none fits)."""
    try:
        return _SUFFIXES[path.suffix.lower()]
    except KeyError:
        problem = ConfigProblem(str(path), f"unknown config format {path.suffix!r}; use .toml, .json or .yaml")
        raise ConfigError([problem]) from None


def yaml_module() -> Any:
    """The ``yaml`` module (ConfigError saying how to install it if it is missing)."""
    try:
        import yaml
    except ImportError:
        raise ConfigError([ConfigProblem("", "YAML configs need PyYAML: pip install pyyaml")]) from None
    return yaml


def config_to_dict(config: AttrsInstance) -> dict[str, Any]:
    """Plain data for ``config`` (fields left at their defaults are omitted)."""
    data: dict[str, Any] = converter.unstructure(config)
    return data


def save_config(config: AttrsInstance, path: str | os.PathLike[str]) -> None:
    """Write ``config`` to a TOML (simple values only), JSON or YAML file."""
    file = Path(path)
    kind = file_format(file)
    data = config_to_dict(config)
    if kind == "json":
        text = json.dumps(data, indent=2) + "\n"
    elif kind == "yaml":
        text = yaml_module().safe_dump(data, sort_keys=False)
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
