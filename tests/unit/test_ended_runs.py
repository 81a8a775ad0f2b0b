"""A controller that sees many runs come and go: what it holds per target or run is dropped once the
run has been gone for its grace period, and the gauges of an ended run get a final value."""

from __future__ import annotations

from actors.controller.actor import Controller
from actors.controller.agents.registry import Worker
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.metrics import Metrics
from actors.controller.monitoring.series import REPLACE_EVERY
from orchestrator.models.requests import ProfileRequest
from tests.support.fake_agents import MONITORED, FakeAgent, make_controller, run, until, wait_terminal, worker_info
from tests.support.local_recorder import LocalRecorders

# Long enough for a run's windows and stall to happen while it is live, short enough for a test.
_GRACE_S = 0.5


def _held(c: Controller) -> dict[str, int]:
    """Everything the controller keys by target, run or agent: how many entries each holds."""
    return {
        "watch series": len(c._watches._series),
        "stall stacks": len(c._watches.stall_stacks),
        "queue slots": len(c._queue._slots),
        "queue lines": len(c._queue.waiting),
        "arm rounds": len(c._runner._arm_rounds),
        "gone agents": len(c._registry._gone),
        "retired agents": len(c._registry._retired),
        "histories": len(c._telemetry.history.runs),
        "profile saves": len(c._persistence._saves),
    }


async def _one_run(c: Controller, name: str) -> None:
    """A run of two ranks: a window, a stall (stacks taken by the stall detector), then it goes away."""
    agents = [FakeAgent(c, worker_info(rank, 2, target=name)) for rank in range(2)]
    for a in agents:
        await a.start()
    status = await c.submit(ProfileRequest(target=name, steps=3))
    await wait_terminal(c, status.id)
    for a in agents:
        a.training = False
    assert await until(lambda: any(k[0] == name for k in c._watches.stall_stacks), timeout_s=10)
    for a in agents:
        await a.stop()


def test_what_is_kept_per_target_is_dropped_once_the_run_has_been_gone_for_its_grace_period(home):
    async def scenario():
        c = make_controller(home, **MONITORED, ended_run_kept_s=_GRACE_S)
        await c.ping()
        for i in range(3):
            await _one_run(c, f"ray_train_run-{i}")
        assert c._watches._series and c._watches.stall_stacks and c._runner._arm_rounds
        assert await until(lambda: not c._registry.workers, timeout_s=10)
        emptied = await until(lambda: not any(_held(c).values()), timeout_s=10 * _GRACE_S + 5)
        assert emptied, _held(c)

    run(scenario(), timeout_s=90)


_HOLD_S = 150.0


def _recording_metrics() -> tuple[Metrics, LocalRecorders]:
    recorders = LocalRecorders()
    return Metrics(recorders, lambda: _HOLD_S), recorders


def _worker(rank: int, target: str = "job") -> Worker:
    info = worker_info(rank, 2, target=target)
    return Worker(info=info, registered_at=0.0, secret="s", seen_at=0.0, step=10, step_time_s=0.1, advanced_at=0.0)


_STALLED = Health(stalled=True, stalled_s=120.0, threshold_s=60.0, median_step_s=0.1, behind={0: 0, 1: 5}, lagging=[1])
_ALERTS = (m.STALLED, m.LAGGING, m.RANKS, m.STEPS_BEHIND, m.SINCE_STEP)


def _last_values(recorders: LocalRecorders, target: str) -> dict[tuple[str, str], float]:
    """The last value set per (metric, rank) of ``target``."""
    last: dict[tuple[str, str], float] = {}
    for metric in _ALERTS:
        for value, tags in recorders.calls(metric):
            if tags["target"] == target:
                last[(metric.name, tags.get("rank", ""))] = value
    return last


def _tick(metrics: Metrics, target: str, workers: dict[int, Worker], now: float) -> None:
    metrics.run(target, workers, _STALLED, now)
    metrics.forget({target}, now)
    metrics.flush(now)


def test_an_ended_runs_gauges_get_a_final_value_and_are_set_no_more():
    # Ray 2.43 keeps a label set's last value for the life of the process that set it: a run that
    # ended STALLED would keep rayprof_stalled at 1, and an alert on it would never clear.
    metrics, recorders = _recording_metrics()
    _tick(metrics, "job", {0: _worker(0), 1: _worker(1)}, 100.0)
    assert _last_values(recorders, "job")[(m.STALLED.name, "")] == 1.0
    metrics.forget(set(), 100.5)  # the run is gone
    metrics.flush(100.5)
    final = _last_values(recorders, "job")
    assert final and all(v == 0.0 for v in final.values()), final
    assert {rank for _, rank in final} == {"", "0", "1"}
    calls = {metric.name: len(recorders.calls(metric)) for metric in _ALERTS}
    for now in (101.0, 120.0, 140.0):  # later ticks, another run live
        _tick(metrics, "other", {0: _worker(0, "other")}, now)
        for r in recorders.running():
            r.recorder.refresh()
    later = [tags for metric in _ALERTS for _, tags in recorders.calls(metric)[calls[metric.name]:]]
    assert later and all(tags["target"] == "other" for tags in later)
    assert all(labels[0] == "other" for _, labels in metrics.series.live())


def test_a_rank_that_left_a_live_run_gets_final_values_too():
    metrics, recorders = _recording_metrics()
    _tick(metrics, "job", {0: _worker(0), 1: _worker(1)}, 100.0)
    _tick(metrics, "job", {0: _worker(0)}, 101.0)  # rank 1 left (an elastic job shrank)
    last = _last_values(recorders, "job")
    assert last[(m.STEPS_BEHIND.name, "1")] == 0.0 and last[(m.SINCE_STEP.name, "1")] == 0.0
    assert not [k for k in metrics.series.live() if k[1] == ("job", "1")]


def test_an_ended_runs_label_sets_leave_with_the_recorder_process_that_exported_them():
    # Ray 2.43 forgets a label set only when the process that set it ends: after the final value's
    # hold, the controller moves what is live to a fresh recorder and ends the old one.
    metrics, recorders = _recording_metrics()
    _tick(metrics, "job", {0: _worker(0), 1: _worker(1)}, 0.0)
    now = 1.0
    _tick(metrics, "other", {0: _worker(0, "other")}, now)  # "job" ended: only "other" is live
    first = recorders.started[0]
    while now < (REPLACE_EVERY + 1) * _HOLD_S and not first.closed:  # ticks, bounded
        now += 1.0
        _tick(metrics, "other", {0: _worker(0, "other")}, now)
    assert first.closed and now >= REPLACE_EVERY * _HOLD_S
    fresh = recorders.running()
    assert len(fresh) == 1 and fresh[0] is not first
    assert {dict(labels)["target"] for _, labels in fresh[0].exported()} == {"other"}
    assert {dict(labels)["target"] for _, labels in first.exported()} == {"job", "other"}
