"""A controller that sees many runs come and go: what it holds per target or run is dropped once the
run has been gone for its grace period, and the gauges of an ended run get a final value."""

from __future__ import annotations

from actors.controller import metric_names as m
from actors.controller.actor import Controller
from orchestrator.models.requests import ProfileRequest
from tests.fake_agents import MONITORED, FakeAgent, make_controller, run, until, wait_terminal, worker_info

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
        c = make_controller(home, **MONITORED)
        c._config = c._config.model_copy(update={"ended_run_kept_s": _GRACE_S})
        await c.ping()
        for i in range(3):
            await _one_run(c, f"ray_train_run-{i}")
        assert c._watches._series and c._watches.stall_stacks and c._runner._arm_rounds
        assert await until(lambda: not c._registry.workers, timeout_s=10)
        emptied = await until(lambda: not any(_held(c).values()), timeout_s=10 * _GRACE_S + 5)
        assert emptied, _held(c)

    run(scenario(), timeout_s=90)
