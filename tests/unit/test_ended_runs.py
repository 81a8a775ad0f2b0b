"""A controller that sees many runs come and go: what it holds per target or run is dropped once the
run has been gone for its grace period, and the gauges of an ended run get a final value."""

from __future__ import annotations

from actors.controller.actor import Controller
from actors.controller.agents.registry import Worker
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.metrics import Metrics
from orchestrator.models.requests import ProfileRequest
from tests.support.fake_agents import MONITORED, FakeAgent, make_controller, run, until, wait_terminal, worker_info

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


class _Recorder:
    """Stands in for one ray.util.metrics object: what was recorded, with which tags."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, str]]] = []

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append((value, tags))

    inc = observe = set


def _recording_metrics() -> tuple[Metrics, dict[str, _Recorder]]:
    metrics = Metrics()
    recorders = {name: _Recorder() for name in metrics._m}
    metrics._m = recorders
    return metrics, recorders


def _worker(rank: int, target: str = "job") -> Worker:
    info = worker_info(rank, 2, target=target)
    return Worker(info=info, registered_at=0.0, secret="s", seen_at=0.0, step=10, step_time_s=0.1, advanced_at=0.0)


_STALLED = Health(stalled=True, stalled_s=120.0, threshold_s=60.0, median_step_s=0.1, behind={0: 0, 1: 5}, lagging=[1])
_ALERTS = (m.STALLED, m.LAGGING, m.RANKS, m.STEPS_BEHIND, m.SINCE_STEP)


def _last_values(recorders: dict[str, _Recorder], target: str) -> dict[tuple[str, str], float]:
    """The last value set per (metric, rank) of ``target``."""
    last: dict[tuple[str, str], float] = {}
    for metric in _ALERTS:
        for value, tags in recorders[metric.name].calls:
            if tags["target"] == target:
                last[(metric.name, tags.get("rank", ""))] = value
    return last


def test_an_ended_runs_gauges_get_a_final_value_and_are_set_no_more():
    # Ray 2.43 keeps a label set's last value for the life of the process: a run that ended
    # STALLED would keep rayprof_stalled at 1 forever, and an alert on it would never clear.
    metrics, recorders = _recording_metrics()
    metrics.run("job", {0: _worker(0), 1: _worker(1)}, _STALLED, 100.0)
    assert _last_values(recorders, "job")[(m.STALLED.name, "")] == 1.0
    metrics.forget(set())  # the run is gone
    final = _last_values(recorders, "job")
    assert final and all(v == 0.0 for v in final.values()), final
    assert {rank for _, rank in final} == {"", "0", "1"}
    calls = sum(len(r.calls) for r in recorders.values())
    for now in (101.0, 200.0, 1000.0):  # later ticks, other runs live
        metrics.run("other", {0: _worker(0, "other")}, _STALLED, now)
        metrics.forget({"other"})
    assert all(tags["target"] == "other" for r in recorders.values() for _, tags in r.calls[calls:])
    assert all(key[1][0] == "other" for key in metrics._last)


def test_a_rank_that_left_a_live_run_gets_final_values_too():
    metrics, recorders = _recording_metrics()
    metrics.run("job", {0: _worker(0), 1: _worker(1)}, _STALLED, 100.0)
    metrics.run("job", {0: _worker(0)}, _STALLED, 101.0)  # rank 1 left (an elastic job shrank)
    last = _last_values(recorders, "job")
    assert last[(m.STEPS_BEHIND.name, "1")] == 0.0 and last[(m.SINCE_STEP.name, "1")] == 0.0
    assert not [k for k in metrics._last if k[1] == ("job", "1")]
