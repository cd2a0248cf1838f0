"""The checks of :class:`~omni_trio.config.PipelineConfig`'s pipeline-wide settings (admission, stream
delivery and admission, endpoints, start method, the ``serve`` section), each returning every problem
of its setting with the problem's path; the stages' and the graph's are in
:mod:`omni_trio.config.checks`.
"""

from __future__ import annotations

import math

from omni_trio.config.hooks import hook_path_problems
from omni_trio.config.settings import (
    MIN_MESSAGE_BYTES,
    STREAM_ADMISSION_MODES,
    EndpointsConfig,
    ServeConfig,
    SocketLimits,
    StreamAdmissionConfig,
    StreamDeliveryConfig,
)
from omni_trio.errors import ConfigProblem

#: The values of ``PipelineConfig.start_method`` (see :mod:`omni_trio.runtime.workers.launch`).
START_METHODS = ("template", "spawn")


def admission_problems(limit: object) -> list[ConfigProblem]:
    """The problems of ``max_in_flight`` (None, or a whole number >= 1)."""
    if limit is None or is_whole(limit, 1):
        return []
    return [ConfigProblem("max_in_flight", f"expected a whole number >= 1 or None (unlimited), got {limit!r}")]


def stream_delivery_problems(stream_delivery: StreamDeliveryConfig) -> list[ConfigProblem]:
    """The problems of ``stream_delivery`` (the unread stream output cap), with their paths."""
    backlog = stream_delivery.max_total_backlog_bytes
    if is_whole(backlog, 1):
        return []
    problem = f"expected a whole number of bytes >= 1, got {backlog!r}"
    return [ConfigProblem("stream_delivery.max_total_backlog_bytes", problem)]


def stream_admission_problems(admission: StreamAdmissionConfig) -> list[ConfigProblem]:
    """The problems of ``stream_admission`` (when new streams are refused), with their paths."""
    at = "stream_admission"
    if not isinstance(admission, StreamAdmissionConfig):
        return [ConfigProblem(at, f"expected a StreamAdmissionConfig, got {type(admission).__name__}")]
    problems = []
    if admission.mode not in STREAM_ADMISSION_MODES:
        modes = ", ".join(repr(mode) for mode in STREAM_ADMISSION_MODES)
        problems.append(ConfigProblem(f"{at}.mode", f"expected one of {modes}, got {admission.mode!r}"))
    cap = admission.max_streams
    if admission.mode == "fixed" and not is_whole(cap, 1):
        problems.append(ConfigProblem(f"{at}.max_streams", f"mode 'fixed' needs a whole number >= 1, got {cap!r}"))
    elif admission.mode != "fixed" and cap is not None:
        problems.append(ConfigProblem(f"{at}.max_streams", f"only mode 'fixed' uses it (mode is {admission.mode!r})"))
    for field in ("min_slack_s", "recover_s", "stall_tolerance_s", "cadence_tolerance"):
        value = getattr(admission, field)
        if not is_seconds(value):
            problems.append(ConfigProblem(f"{at}.{field}", f"expected a number >= 0, got {value!r}"))
    if not is_seconds(admission.max_pace) or admission.max_pace == 0:
        problems.append(ConfigProblem(f"{at}.max_pace", f"expected a number > 0, got {admission.max_pace!r}"))
    if not is_whole(admission.cadence_arrivals, 1):
        problems.append(ConfigProblem(f"{at}.cadence_arrivals",
                                      f"expected a whole number >= 1, got {admission.cadence_arrivals!r}"))
    return problems


def endpoints_problems(endpoints: EndpointsConfig) -> list[ConfigProblem]:
    """The problems of ``endpoints``: a ``max_message_bytes`` an inline message would not fit, and the
    inbox's limits (counts, times, bytes), with their paths."""
    problems = []
    size = endpoints.max_message_bytes
    if not is_whole(size, MIN_MESSAGE_BYTES):
        problems.append(ConfigProblem(
            "endpoints.max_message_bytes",
            f"expected a whole number of bytes >= {MIN_MESSAGE_BYTES} (inline messages must fit), got {size!r}",
        ))
    if not is_whole(endpoints.max_unproven_connections, 1):
        problems.append(ConfigProblem(
            "endpoints.max_unproven_connections",
            f"expected a whole number >= 1, got {endpoints.max_unproven_connections!r}",
        ))
    for name in ("proof_timeout_s", "message_timeout_s"):
        value = getattr(endpoints, name)
        if not is_seconds(value, positive=True):
            problems.append(ConfigProblem(f"endpoints.{name}", f"expected seconds > 0, got {value!r}"))
    unfinished = endpoints.max_unfinished_bytes
    if not is_whole(unfinished, size if is_whole(size, MIN_MESSAGE_BYTES) else MIN_MESSAGE_BYTES):
        problems.append(ConfigProblem(
            "endpoints.max_unfinished_bytes",
            f"expected a whole number of bytes >= max_message_bytes (one message must fit), got {unfinished!r}",
        ))
    return problems


def start_method_problems(method: object) -> list[ConfigProblem]:
    """The problem of ``start_method``, if it names no way of starting workers."""
    if method in START_METHODS:
        return []
    return [ConfigProblem(
        "start_method",
        f"expected 'template' (fork workers from one preloaded process, the default) or 'spawn' "
        f"(a fresh interpreter per worker), got {method!r}",
    )]


def is_seconds(value: object, *, positive: bool = False) -> bool:
    """A finite number of seconds (TOML has nan and inf literals; neither is a time), >= 0, or > 0 when
    ``positive``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def is_whole(value: object, minimum: int) -> bool:
    """A whole number >= ``minimum``."""
    # bool is an int subclass, but a count of True is surely a mistake.
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def serve_problems(serve: object) -> list[ConfigProblem]:
    """The problems of the ``serve`` section (None: not served): model id, adapter, body limit, time
    settings, retry hint, with their paths."""
    if serve is None:
        return []
    if not isinstance(serve, ServeConfig):
        return [ConfigProblem("serve", f"expected a ServeConfig, got {type(serve).__name__}")]
    problems = []
    if not isinstance(serve.model, str) or not serve.model:
        problems.append(ConfigProblem("serve.model", f"expected a non-empty model id, got {serve.model!r}"))
    problems += hook_path_problems("serve.adapter", serve.adapter)
    if not isinstance(serve.adapter_options, dict):
        problems.append(ConfigProblem("serve.adapter_options", "expected a table of keyword arguments"))
    body = serve.max_body_bytes
    if not is_whole(body, 1):
        problems.append(ConfigProblem("serve.max_body_bytes", f"expected a whole number >= 1, got {body!r}"))
    if not is_seconds(serve.grace_period_s):
        problems.append(ConfigProblem("serve.grace_period_s", f"expected seconds >= 0, got {serve.grace_period_s!r}"))
    if serve.deadline_s is not None and not is_seconds(serve.deadline_s, positive=True):
        problems.append(ConfigProblem("serve.deadline_s", f"expected seconds > 0 or None, got {serve.deadline_s!r}"))
    retry = serve.retry_after_s
    if not is_whole(retry, 0):
        problems.append(ConfigProblem("serve.retry_after_s", f"expected a whole number >= 0, got {retry!r}"))
    problems += socket_limits_problems(serve.sockets)
    return problems


def socket_limits_problems(limits: object, path: str = "serve.sockets") -> list[ConfigProblem]:
    """The problems of the WebSocket limits (``serve.sockets``), with their paths."""
    if not isinstance(limits, SocketLimits):
        return [ConfigProblem(path, f"expected a SocketLimits, got {type(limits).__name__}")]
    problems = []
    for name in ("max_message_bytes", "max_realtime_sessions", "max_text_chars"):
        value = getattr(limits, name)
        if not is_whole(value, 1):
            problems.append(ConfigProblem(f"{path}.{name}", f"expected a whole number >= 1, got {value!r}"))
    for name in ("max_turn_audio_s", "max_session_audio_s", "idle_timeout_s"):
        value = getattr(limits, name)
        if not is_seconds(value, positive=True):
            problems.append(ConfigProblem(f"{path}.{name}", f"expected seconds > 0, got {value!r}"))
    if not is_seconds(limits.output_lead_s):
        problems.append(ConfigProblem(f"{path}.output_lead_s", f"expected seconds >= 0, got {limits.output_lead_s!r}"))
    return problems
