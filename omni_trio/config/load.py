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

from omni_trio.config.pipeline import PipelineConfig, check_imports, settings_import_problems, stage_import_problems
from omni_trio.config.save import converter, file_format, yaml_module
from omni_trio.config.settings import ServeConfig
from omni_trio.config.stages import StageConfig
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


def load_config(path: str | os.PathLike[str], *, imports: bool = False) -> PipelineConfig:
    """Read a pipeline config from a TOML, JSON or YAML file.

    A file that is not UTF-8 or does not parse is a :class:`ConfigError` naming it; ``OSError`` if it
    cannot be read. With ``imports``, its hooks are imported too (:func:`check_imports`), and one
    ConfigError lists every problem: those of the structure first, then the imports of every part
    that could be read (a config with both kinds needs one round of fixes, not two).
    """
    data = _read_data(Path(path))
    if not imports:
        return config_from_dict(data)
    try:
        config = config_from_dict(data)
    except ConfigError as error:
        found = {problem.path for problem in error.problems}
        extra = [problem for problem in _import_problems_of_parts(data) if problem.path not in found]
        raise ConfigError(error.problems + extra) from None
    check_imports(config)
    return config


def _import_problems_of_parts(data: dict[str, Any]) -> list[ConfigProblem]:
    """The import problems of each stage and setting of ``data`` that reads as one on its own."""
    problems: list[ConfigProblem] = []
    stages = data.get("stages")
    for i, raw in enumerate(stages if isinstance(stages, list) else []):
        try:
            stage = converter.structure(raw, StageConfig)
        except Exception:  # noqa: BLE001 - its structural problems are listed already
            continue
        problems += stage_import_problems(i, stage)
    serve = None
    if data.get("serve") is not None:
        try:
            serve = converter.structure(data["serve"], ServeConfig)
        except Exception:  # noqa: BLE001 - listed already
            serve = None
    hooks = [data.get(field) for field in ("terminal_stages_fn", "replica_policy")]
    strings = [hook if isinstance(hook, str) else None for hook in hooks]
    return problems + settings_import_problems(strings[0], strings[1], serve)


def _read_data(file: Path) -> Any:
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
    return data
