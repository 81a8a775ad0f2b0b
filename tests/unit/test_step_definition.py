"""What one step is travels from the agent's heartbeat to the target listing and the manifest's ranks (no Ray)."""

from __future__ import annotations

import asyncio

from actors.controller.agents.registry import Registry
from orchestrator.manifest import read_manifest
from orchestrator.models.agent_protocol import Heartbeat
from orchestrator.models.control import HOW_A_RUN_APPEARS
from orchestrator.models.profile import RankResult
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.storage import open_storage
from tests.support.common import cli_results
from tests.support.fake_agents import FakeAgent, make_controller, run, start_agents, until, wait_terminal, worker_info
from tests.support.inprocess_service import service_client

GAN = "1 step = SGD.step ×1 + Adam.step ×1"


def test_the_target_listing_says_what_one_step_is_from_the_heartbeat(home):
    async def go():
        c = make_controller(home)
        info = worker_info(0, 1)
        secret = await c.register(info)
        await c.poll(Heartbeat(agent_id=info.agent_id, step=3, step_definition=GAN), secret)
        # An agent that says nothing (an older one) leaves what is known.
        await c.poll(Heartbeat(agent_id=info.agent_id, step=4), secret)
        return await c.targets()

    (target,) = run(go())
    assert [r.step_definition for r in target.ranks] == [GAN]


def test_a_relayed_heartbeat_carries_what_one_step_is():
    now = [10.0]
    registry = Registry(clock=lambda: now[0])
    info = worker_info(1, 2)
    worker, _ = registry.register(info)
    assert worker is not None
    now[0] = 11.0
    registry.heartbeat(info.agent_id, 7, 0.5, 0.2, GAN)
    assert registry.workers[info.agent_id].step_definition == GAN


def test_a_manifest_rank_says_what_one_step_was_when_the_window_was_planned():
    result = RankResult.waiting(worker_info(0, 1), GAN)
    assert result.step_definition == GAN
    assert result.model_copy(update={"first_step": 5}).step_definition == GAN


def test_a_manifest_rank_says_what_one_step_was_once_its_window_ran(home):
    # Before: a window planned while the agent was still learning the cycle kept "(learning the cycle ...)" in the
    # manifest, though its steps ran once the agent knew (a DeepSpeed job profiled as soon as it appeared).
    learning = "1 step = AdamW.step ×1 (learning the cycle of optimizer steps)"
    learned = "1 step = AdamW.step ×1; 2 forward passes (DeepSpeedEngine)"

    async def go():
        c = make_controller(home)
        gate = asyncio.Event()
        (agent,) = await start_agents(c, 1, step_definition=learning, arm_ack_gate=gate)
        submitted = await c.submit(ProfileRequest(target="run", steps=3))
        assert await until(lambda: bool(agent.windows), timeout_s=5)
        planned = (await c.wait(submitted.id, 0)).ranks[0].step_definition
        agent.step_definition = learned
        for _ in range(100):  # the next heartbeats say it (bounded: 100 polls of 0.2 s at most)
            if [r.step_definition for t in await c.targets() for r in t.ranks] == [learned]:
                break
            await asyncio.sleep(0.05)
        gate.set()
        status, _ = await wait_terminal(c, submitted.id)
        await agent.stop()
        return planned, status

    planned, status = run(go())
    assert planned == learning
    assert status.state == ProfileState.DONE
    assert [r.step_definition for r in read_manifest(open_storage(home), "run", status.id).ranks] == [learned]


def test_rayprof_targets_says_what_one_step_is(monkeypatch):
    import argparse

    from orchestrator.cli import commands
    from orchestrator.models.control import TargetInfo, WorkerStatus

    ranks = [WorkerStatus(info=worker_info(r, 2), step=10, step_time_s=0.1, last_seen_s=0.5, step_definition=GAN) for r in (0, 1)]
    target = TargetInfo(name="run", world_size=2, ranks=ranks)
    monkeypatch.setattr(commands, "_client", lambda args: type("C", (), {"targets": lambda self: [target]})())

    status, printed = cli_results(commands.targets, argparse.Namespace(json=False))
    assert status == 0 and f"run: {GAN}" in printed.splitlines()


def test_with_no_live_run_rayprof_targets_and_the_mcp_answer_say_how_a_run_becomes_one(monkeypatch):
    # Before: "no live training runs with rayprof agents" and an empty list, with no way forward.
    import argparse

    from orchestrator.cli import commands
    from orchestrator.mcp.convert import target_list

    monkeypatch.setattr(commands, "_client", lambda args: type("C", (), {"targets": lambda self: []})())
    status, printed = cli_results(commands.targets, argparse.Namespace(json=False))
    assert status == 0 and printed == f"no live training run: {HOW_A_RUN_APPEARS}\n"
    assert target_list([]).note == f"no live training run: {HOW_A_RUN_APPEARS}"


def test_the_apis_target_list_says_how_a_run_becomes_one_until_there_is_one(home, monkeypatch):
    # The console showed its own sentence ("Start a job with rayprof instrumentation"), not the one the CLI and the
    # MCP answer give; it now shows the API's note.
    async def go():
        controller = make_controller(home)
        async with service_client(monkeypatch, controller) as http:
            empty = (await http.get("/v1/targets")).json()
            await FakeAgent(controller, worker_info(0, 1)).start()
            listed = (await http.get("/v1/targets")).json()
        return empty, listed

    empty, listed = run(go())
    assert empty == {"targets": [], "note": f"no live training run: {HOW_A_RUN_APPEARS}"}
    assert len(listed["targets"]) == 1 and listed["note"] is None
