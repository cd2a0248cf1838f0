"""Pipeline configuration: attrs classes, validation that reports every problem, and config files.

``PipelineConfig(...)`` validates the stage graph on construction and raises
:class:`~omni_trio.errors.ConfigError` listing every problem with its path
(:mod:`omni_trio.config.checks`). Hooks are dotted paths (``"pkg.module.attr"``)
so a config can cross into worker processes; a module-level function is
accepted too and stored as its dotted path. Whether the paths import is checked
by :func:`check_imports` when a pipeline opens. :func:`load_config` and
``PipelineConfig.to_file`` read and write TOML, JSON and YAML files.
"""

from omni_trio.config.load import load_config
from omni_trio.config.pipeline import PipelineConfig, check_imports, process_edges
from omni_trio.config.processes import DEFAULT_RESTART_BACKOFF_S, RESTART_POLICIES
from omni_trio.config.settings import (
    MIN_MESSAGE_BYTES,
    EndpointsConfig,
    ServeConfig,
    SocketLimits,
    StreamAdmissionConfig,
    StreamDeliveryConfig,
)
from omni_trio.config.stages import MAIN_PROCESS, REPLICA_PLACEHOLDER, REPLICA_SUFFIX, CommConfig, StageConfig

__all__ = [
    "DEFAULT_RESTART_BACKOFF_S",
    "MAIN_PROCESS",
    "MIN_MESSAGE_BYTES",
    "REPLICA_PLACEHOLDER",
    "REPLICA_SUFFIX",
    "RESTART_POLICIES",
    "CommConfig",
    "EndpointsConfig",
    "PipelineConfig",
    "ServeConfig",
    "SocketLimits",
    "StageConfig",
    "StreamAdmissionConfig",
    "StreamDeliveryConfig",
    "check_imports",
    "load_config",
    "process_edges",
]
