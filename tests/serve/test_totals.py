"""The runtime totals of ``stats()`` (compute-seconds, bytes per edge) and their Prometheus counters.

Unit tests of the aggregation: replicas merge into their stage, the totals
survive a worker's stats reply, they are not state a request holds, and the
exported counters never go backwards when a worker restarts.
"""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import omni_trio as ot
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import decode, encode
from omni_trio.serve.totals import RuntimeTotals
from omni_trio.testing import busy_counters


def _stage(busy: float = 0.0, sent: dict[str, dict[str, int]] | None = None, *, healthy: bool = True) -> ot.StageStats:
    return ot.StageStats(0, 0, 0, 0, 0, 0, healthy=healthy, busy_seconds=busy, sent_bytes=sent or {})


def _pipeline(**stages: ot.StageStats) -> ot.PipelineStats:
    # Keyword names cannot hold "@": replicas are spelled voc_r0 here and renamed.
    return ot.PipelineStats(stages={name.replace("_r", "@r"): s for name, s in stages.items()}, live_requests=0)


def _samples(totals: RuntimeTotals) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(totals)
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.name != "omni_trio_streams_refused_total":
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _busy(stage: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("omni_trio_stage_busy_seconds_total", (("stage", stage),))


def _edge(src: str, dst: str, transport: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = (("from_stage", src), ("to_stage", dst), ("transport", transport))
    return ("omni_trio_edge_bytes_total", labels)


def test_replicas_merge_into_their_stage() -> None:
    stats = _pipeline(
        talker=_stage(0.5, {"voc@r0": {"inline": 10}, "voc@r1": {"inline": 5, "shm": 20_000}}),
        voc_r0=_stage(1.25, {"coordinator": {"inline": 100}}),
        voc_r1=_stage(2.0, {"coordinator": {"inline": 300}}),
    )
    stats = attrs.evolve(stats, sent_bytes={"talker": {"shm": 64_000}})  # what the coordinator submitted
    assert stats.busy_seconds == {"talker": 0.5, "voc": 3.25}
    assert stats.edge_bytes == {
        ("coordinator", "talker", "shm"): 64_000,
        ("talker", "voc", "inline"): 15,
        ("talker", "voc", "shm"): 20_000,
        ("voc", "coordinator", "inline"): 400,
    }


def test_the_totals_survive_a_workers_stats_reply() -> None:
    # What worker.py sends (attrs.asdict of each stage's stats) and directory.py rebuilds.
    stats = _stage(0.75, {"vocoder": {"inline": 256}, "coordinator": {"shm": 1 << 20}})
    reply = m.StatsReply(token=1, process="p_talker", stages={"talker": attrs.asdict(stats)})
    decoded = decode(encode(reply))
    assert isinstance(decoded, m.StatsReply)
    assert ot.StageStats(**decoded.stages["talker"]) == stats


def test_running_totals_are_not_state_a_request_holds() -> None:
    stats = _pipeline(thinker=_stage(3.0, {"talker": {"inline": 32}}))
    assert stats.idle
    assert busy_counters(stats) == []
    held = _pipeline(thinker=attrs.evolve(_stage(3.0), active_requests=1))
    assert busy_counters(held) == ["thinker.active_requests=1"]


def test_exported_counters_add_what_each_snapshot_gained_and_survive_a_restart() -> None:
    totals = RuntimeTotals()
    totals.observe(_pipeline(enc=_stage(0.0), voc=_stage(1.0, {"coordinator": {"inline": 100}})))
    assert _samples(totals) == {_busy("enc"): 0.0, _busy("voc"): 1.0, _edge("voc", "coordinator", "inline"): 100}
    totals.observe(_pipeline(enc=_stage(0.0), voc=_stage(1.5, {"coordinator": {"inline": 150}})))
    # The worker dies: its stages read zero (and no edges) while it restarts ...
    totals.observe(_pipeline(enc=_stage(0.0), voc=_stage(healthy=False)))
    assert _samples(totals)[_busy("voc")] == 1.5
    assert _samples(totals)[_edge("voc", "coordinator", "inline")] == 150
    # ... and its new incarnation counts from zero again: what it does adds on top.
    totals.observe(_pipeline(enc=_stage(0.0), voc=_stage(0.25, {"coordinator": {"inline": 40}})))
    last = _pipeline(enc=_stage(0.0), voc=_stage(0.5, {"coordinator": {"inline": 60, "shm": 7}}))
    totals.observe(attrs.evolve(last, sent_bytes={"enc": {"inline": 9}}))
    assert _samples(totals) == {
        _edge("coordinator", "enc", "inline"): 9,
        _busy("enc"): 0.0,
        _busy("voc"): 2.0,
        _edge("voc", "coordinator", "inline"): 210,
        _edge("voc", "coordinator", "shm"): 7,
    }


def test_replicas_are_counted_each_on_its_own_and_exported_as_one_stage() -> None:
    totals = RuntimeTotals()
    totals.observe(_pipeline(voc_r0=_stage(1.0), voc_r1=_stage(2.0)))
    totals.observe(_pipeline(voc_r0=_stage(healthy=False), voc_r1=_stage(2.5)))  # r0 restarting
    totals.observe(_pipeline(voc_r0=_stage(0.5), voc_r1=_stage(3.0)))
    assert _samples(totals) == {_busy("voc"): 1.0 + 0.5 + 3.0}


def test_the_unread_stream_bytes_are_a_gauge_of_the_last_snapshot() -> None:
    totals = RuntimeTotals()
    registry = CollectorRegistry()
    registry.register(totals)

    def gauge() -> float:
        families = text_string_to_metric_families(generate_latest(registry).decode())
        (value,) = [s.value for f in families for s in f.samples if s.name == "omni_trio_stream_backlog_bytes"]
        return value

    assert gauge() == 0
    totals.observe(attrs.evolve(_pipeline(voc=_stage()), stream_backlog_bytes=48 * 1024))
    assert gauge() == 48 * 1024
    totals.observe(_pipeline(voc=_stage()))  # read since: it goes down, as a gauge does
    assert gauge() == 0


def test_refused_connections_are_a_counter_per_process_across_worker_restarts() -> None:
    totals = RuntimeTotals()
    refused = ("omni_trio_refused_connections_total", (("process", "p_b"),))
    for counts in ({"main": 0, "p_b": 3}, {"main": 0, "p_b": 5}, {"main": 0, "p_b": 1}):  # then p_b restarted
        totals.observe(attrs.evolve(_pipeline(), refused_connections=counts))
    assert _samples(totals)[refused] == 6
    assert _samples(totals)[("omni_trio_refused_connections_total", (("process", "main"),))] == 0
