"""Ranks that poll through their node's relay: the real ``RelayCore`` in front of the real
``Controller`` class, on one event loop without Ray (``Upstream`` stands in for an actor handle)."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.controller.actor import Controller
from actors.controller.agents.registry import Registry
from actors.relay import RelayCore
from orchestrator.errors import ForbiddenError
from orchestrator.models.agent_protocol import Heartbeat, NodePoll
from orchestrator.models.profile import RankEvent
from orchestrator.models.requests import ProfileRequest, ProfileState, RankState
from tests.support.fake_agents import FakeAgent, make_controller, run, start_agents, until, wait_terminal, worker_info

RANKS_PER_NODE = 4


class _Method:
    def __init__(self, upstream: Upstream, name: str) -> None:
        self._upstream, self._name = upstream, name

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = await getattr(self._upstream.controller, self._name)(*args, **kwargs)
        if self._upstream.dead:
            raise RuntimeError("the actor died")  # what a call to a killed actor raises, in kind
        return result


class Upstream:
    """A controller reached as through a Ray handle: ``handle.method.remote(...)`` is awaitable;
    once ``dead``, every call raises, as calls to a killed actor do."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.dead = False

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


async def start_relayed(c: Controller, world_size: int) -> tuple[list[FakeAgent], list[RelayCore]]:
    upstream = Upstream(c)
    relays = [
        RelayCore(f"node{n}", lambda: upstream, c._settings().poll_timeout_s)
        for n in range(-(-world_size // RANKS_PER_NODE))
    ]
    agents = [FakeAgent(relays[r // RANKS_PER_NODE], worker_info(r, world_size)) for r in range(world_size)]  # type: ignore[arg-type]
    for agent in agents:
        await agent.start()
    return agents, relays


def calls(relays: list[RelayCore], method: str) -> int:
    return sum(r.upstream_calls[method] for r in relays)


def settled(c: Controller, relays: list[RelayCore], world_size: int) -> bool:
    """Every rank is registered at ``c`` and every relay holds its node's long-poll there."""
    return len(c._registry.workers) == world_size and all(r.upstream_calls["poll_node"] >= 1 for r in relays)


def test_ranks_behind_relays_all_capture_the_same_window(home):
    async def go():
        c = make_controller(home)
        agents, _ = await start_relayed(c, 8)
        submitted = await c.submit(ProfileRequest(target="run", steps=5))
        status, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return status, agents

    status, agents = run(go())
    assert status.state == ProfileState.DONE
    assert [r.state for r in status.ranks] == [RankState.DONE] * 8
    assert {(a.windows[0].start_step, a.windows[0].steps) for a in agents} == {(status.start_step, 5)}


def test_a_window_costs_the_controller_a_few_calls_per_node_not_per_rank(home):
    async def go():
        c = make_controller(home, poll_timeout_s=5.0)
        agents, relays = await start_relayed(c, 16)
        assert await until(lambda: settled(c, relays, 16), timeout_s=30)
        before = {m: calls(relays, m) for m in ("poll_node", "report_many")}
        submitted = await c.submit(ProfileRequest(target="run", steps=5))
        status, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return status, {m: calls(relays, m) - before[m] for m in before}

    status, used = run(go())
    assert status.state == ProfileState.DONE
    # 16 ranks send 4 events each (ARMED, CAPTURING, UPLOADING, DONE) and get a sync and an arm:
    # rank by rank that is 64 reports and 32+ polls; four nodes batch them.
    assert used["report_many"] < 64 / 2
    assert used["poll_node"] < 32 / 2


def test_an_out_of_memory_report_goes_through_the_relay_to_the_controller_at_once(home):
    async def go():
        c = make_controller(home)
        agents, relays = await start_relayed(c, 4)
        await agents[1].oom(asked_bytes=2048, free_bytes=300)
        for a in agents:
            await a.stop()
        return c, relays

    c, relays = run(go())
    assert calls(relays, "oom") == 1
    assert c._watches.oom._latest["run"].oom.rank == 1


def test_a_forwarded_heartbeat_is_dated_to_when_the_rank_sent_it():
    now = [100.0]
    registry = Registry(clock=lambda: now[0])
    registry.register(worker_info(0, 1), relay_id="node0", relay_secret="node0-secret")
    now[0] = 110.0
    worker = registry.heartbeat("run-job1-r0", step=50, step_time_s=0.1, age_s=4.0)
    assert worker is not None and worker.seen_at == 106.0
    # Extrapolated from when the rank was at step 50, not from when the relay forwarded it.
    assert worker.estimated_step(110.0) == 90.0


def test_a_heartbeat_older_than_the_last_one_known_changes_nothing():
    now = [100.0]
    registry = Registry(clock=lambda: now[0])
    registry.register(worker_info(0, 1), relay_id="node0", relay_secret="node0-secret")
    now[0] = 110.0
    registry.heartbeat("run-job1-r0", step=50, step_time_s=0.1)
    worker = registry.heartbeat("run-job1-r0", step=20, step_time_s=0.1, age_s=5.0)
    assert worker is not None and (worker.step, worker.seen_at) == (50, 110.0)


def test_a_rank_whose_process_is_gone_is_dropped_although_its_relay_lives_on(home):
    async def go():
        c = make_controller(home)
        agents, relays = await start_relayed(c, 4)
        assert await until(lambda: settled(c, relays, 4), timeout_s=30)
        gone = agents[1]
        await gone.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while gone.info.agent_id in c._registry.workers and loop.time() < deadline:
            await asyncio.sleep(0.1)
        alive = sorted(w.info.world_rank for w in c._registry.workers.values())
        for a in agents:
            await a.stop()
        return alive

    assert run(go()) == [0, 2, 3]


def test_a_controller_restart_behind_a_relay_makes_its_ranks_register_again(home):
    async def go():
        first = make_controller(home)
        upstream = {"u": Upstream(first)}
        relay = RelayCore("node0", lambda: upstream["u"], first._settings().poll_timeout_s)
        agents = [FakeAgent(relay, worker_info(r, 2)) for r in range(2)]  # type: ignore[arg-type]
        for a in agents:
            await a.start()
        assert await until(lambda: settled(first, [relay], 2), timeout_s=30)
        second = make_controller(home)
        upstream["u"].dead = True
        upstream["u"] = Upstream(second)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(second._registry.workers) < 2 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        submitted = await second.submit(ProfileRequest(target="run", steps=3))
        status, _ = await wait_terminal(second, submitted.id)
        for a in agents:
            await a.stop()
        return status

    assert run(go()).state == ProfileState.DONE


def test_a_rank_heard_through_its_relay_does_not_expire_although_its_heartbeat_is_dated_back():
    now = [100.0]
    registry = Registry(clock=lambda: now[0])
    registry.register(worker_info(0, 1), relay_id="node0", relay_secret="node0-secret")
    now[0] = 115.0
    registry.heartbeat("run-job1-r0", step=50, step_time_s=0.1, age_s=9.0)
    now[0] = 120.0
    assert registry.expired(10.0) == []
    now[0] = 126.0
    assert [w.info.agent_id for w in registry.expired(10.0)] == ["run-job1-r0"]


# ---- who may speak for a rank: the registration secret ------------------------------------------


def _victim_calls(agent: FakeAgent):
    hb = Heartbeat(agent_id=agent.info.agent_id, step=10**6, step_time_s=0.001)
    event = RankEvent(profile_id="p-none", agent_id=agent.info.agent_id, state=RankState.FAILED, reason="forged")
    return hb, event, agent.stacks("stk-none")


def test_another_process_cannot_take_an_agents_commands_or_speak_for_it(home):
    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        victim = agents[1]  # its agent id is public: GET /v1/targets lists it
        hb, event, stacks = _victim_calls(victim)
        refused = []
        for forged in (
            c.poll(hb),
            c.poll(hb, "a-guess"),
            c.report(event),
            c.stacks_reply(stacks),
            c.register(victim.info),  # to be issued a secret of its own for the victim's id
            c.register(victim.info, "node9", None, "relay-secret"),  # or to move it behind a relay of its own
        ):
            try:
                await forged
            except ForbiddenError:
                refused.append(True)
            else:
                refused.append(False)
        step_seen = c._registry.workers[victim.info.agent_id].step
        submitted = await c.submit(ProfileRequest(target="run", steps=3))
        status, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return refused, step_seen, status, [len(a.windows) for a in agents]

    refused, step_seen, status, windows = run(go())
    assert refused == [True] * 6
    assert step_seen < 10**6
    # The victim still gets its arm and reports: the profile ends DONE on both ranks.
    assert status.state == ProfileState.DONE and windows == [1, 1]


def test_another_process_cannot_poll_for_a_relay_or_speak_through_it_for_its_ranks(home):
    async def go():
        c = make_controller(home)
        agents, relays = await start_relayed(c, 2)
        relay, victim = relays[0], agents[1]
        hb, event, _ = _victim_calls(victim)
        stranger = worker_info(5, 8, agent="stranger")
        refused = []
        for forged in (
            relay.poll(hb),  # the relay is a named actor: anyone can call it
            relay.report(event),
            c.poll_node(NodePoll(relay_id=relay.relay_id, beats=[])),
            c.report_many([event]),
            c.report_many([event], relay.relay_id, "a-guess"),
            c.register(stranger, relay.relay_id, None, "a-guess"),  # a rank of its own on the relay's link
        ):
            try:
                await asyncio.wait_for(forged, 5)
            except ForbiddenError:
                refused.append(True)
            else:
                refused.append(False)
        submitted = await c.submit(ProfileRequest(target="run", steps=3))
        status, _ = await wait_terminal(c, submitted.id)
        for a in agents:
            await a.stop()
        return refused, status

    refused, status = run(go())
    assert refused == [True] * 6
    assert status.state == ProfileState.DONE


def test_a_rank_that_registers_again_keeps_its_secret_and_a_new_controller_issues_a_new_one(home):
    async def go():
        first = make_controller(home)
        (agent,) = await start_agents(first, 1)
        issued = agent.secret
        again = await agent.register()
        second = make_controller(home)
        agent.controller = second
        fresh = await agent.register()
        await agent.stop()
        return issued, again, fresh

    issued, again, fresh = run(go())
    assert issued and again == issued
    assert fresh and fresh != issued
