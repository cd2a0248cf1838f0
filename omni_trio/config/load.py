"""Pipeline configs in files: TOML, JSON, and YAML when PyYAML is installed.

:func:`load_config` reads a file through cattrs into :class:`PipelineConfig`
(unknown keys are errors, every problem reported with its path);
:func:`~omni_trio.config.save.save_config` writes one back (``PipelineConfig.to_file``). Both pick
the format from the suffix.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import cattrs
from cattrs.errors import ForbiddenExtraKeysError

from omni_trio.config.pipeline import PipelineConfig
from omni_trio.config.save import converter, file_format, yaml_module
from omni_trio.errors import ConfigError, ConfigProblem


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
        return converter.structure(data, PipelineConfig)
    except Exception as exc:  # noqa: BLE001 - every structuring failure becomes a ConfigProblem
        raise ConfigError(_problems(exc)) from None


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read a pipeline config from a TOML, JSON or YAML file.

    A file that is not UTF-8 or does not parse is a :class:`ConfigError` naming it; ``OSError`` if it
    cannot be read."""
    file = Path(path)
    kind = file_format(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(str(file), f"cannot parse: not UTF-8 text: {exc}")]) from None
    try:
        if kind == "toml":
            data = tomllib.loads(text)
        elif kind == "json":
            data = json.loads(text)
        else:
            yaml = yaml_module()
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                # PyYAML's message spans lines (the mark, a caret): one line per problem.
                raise ConfigError([ConfigProblem(str(file), f"cannot parse: {' '.join(str(exc).split())}")]) from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError([ConfigProblem(str(file), f"cannot parse: {exc}")]) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(str(file), "cannot parse: nested too deeply")]) from None
    return config_from_dict(data)
