"""One controller call per HTTP request on a profile (GET, GET /report, DELETE), counted at the
controller handle the real app (in process, real ``Controller``, fake agents) calls through."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest

from actors.controller.actor import Controller
from orchestrator.layout import REPORT_NAME, profile_prefix
from orchestrator.models.requests import ProfileRequest, ProfileState
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from orchestrator.storage import open_storage
from tests.support.fake_agents import (
    FAKE_RAY_CLUSTER,
    FakeAgent,
    fast_config,
    run,
    status_when,
    wait_terminal,
    worker_info,
)
from tests.support.inprocess_service import BASE_URL, ActorLike, install_service
from tests.support.local_recorder import LocalRecorders

REPORT = b"<!doctype html><title>report</title>"


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


async def with_report(draft, profile, timeout_s):
    """A postprocess that stores a report.html and lists it, as the analysis does."""
    folder = open_storage(profile.storage).scoped(profile_prefix(draft.target, draft.profile_id))
    artifact = folder.put_bytes(REPORT, REPORT_NAME, "report")
    return draft.model_copy(update={"artifacts": [*draft.artifacts, artifact]})


class _Counted:
    def __init__(self, method: Any, name: str, calls: Counter[str]) -> None:
        self._method, self._name, self._calls = method, name, calls

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._calls[self._name] += 1
        return self._method.remote(*args, **kwargs)


class CountingHandle(ActorLike):
    """The controller as through a Ray handle, counting the calls made on it by method name."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller)
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> _Counted:
        return _Counted(super().__getattr__(name), name, self.calls)


def test_get_report_and_delete_of_a_profile_make_one_controller_call_each(home, monkeypatch):
    async def go():
        controller = Controller(fast_config(home), postprocess=with_report, cluster=FAKE_RAY_CLUSTER, recorder=LocalRecorders())
        armed = asyncio.Event()  # held unset: the first profile stays running until cancelled
        for rank in range(2):
            await FakeAgent(controller, worker_info(rank, 2), arm_ack_gate=armed, upload="trace").start()
        handle = CountingHandle(controller)
        app = install_service(monkeypatch, controller, handle=handle)
        calls: dict[str, dict[str, int]] = {}

        async def request(what: str, method: str, path: str) -> httpx.Response:
            handle.calls.clear()
            response = await http.request(method, path)
            assert response.status_code == 200, (what, response.text)
            calls[what] = dict(handle.calls)
            return response

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as http:
            # The service's first call through a handle also checks the controller's build: made here, uncounted.
            assert (await http.get("/healthz")).status_code == 200
            running = (await controller.submit(ProfileRequest(target="run", steps=2))).id
            await status_when(controller, running, lambda s: s.state == ProfileState.SCHEDULED, timeout_s=10)
            body = (await request("DELETE running", "DELETE", f"/v1/profiles/{running}")).json()
            assert body["id"] == running and body["manifest"] is None
            armed.set()
            assert (await wait_terminal(controller, running))[0].state == ProfileState.CANCELLED

            finished = (await controller.submit(ProfileRequest(target="run", steps=2))).id
            status, _ = await wait_terminal(controller, finished)
            assert status.state == ProfileState.DONE and status.manifest_uri is not None
            body = (await request("GET profile", "GET", f"/v1/profiles/{finished}")).json()
            assert body["manifest"]["profile_id"] == finished
            assert (await request("GET report", "GET", f"/v1/profiles/{finished}/report")).content == REPORT
            body = (await request("DELETE finished", "DELETE", f"/v1/profiles/{finished}")).json()
            assert body["state"] == "DONE" and body["manifest"] is None
            assert (await http.get(f"/v1/profiles/{finished}")).status_code == 404
        return calls

    calls = run(go())
    assert {what: sum(by_method.values()) for what, by_method in calls.items()} == {
        "DELETE running": 1,
        "GET profile": 1,
        "GET report": 1,
        "DELETE finished": 1,
    }, calls


def test_every_operation_of_the_protocol_is_a_controller_method_with_its_parameters_and_types():
    import inspect
    import typing

    import ray

    from orchestrator.models.api import OPERATIONS, ProfilingApi

    # Making an actor class of Controller (as create_controller does, in this process or an earlier
    # test's) has Ray 2.60 set a signature with its tracing parameter on each method's function.
    ray.remote(Controller)

    def parameters(method) -> list[tuple[str, object, object]]:
        found = inspect.signature(method).parameters.values()
        return [(p.name, p.kind, p.default) for p in found if p.name != "_ray_trace_ctx"][1:]

    def types(method) -> dict[str, object]:
        return {k: v for k, v in typing.get_type_hints(method).items() if k != "_ray_trace_ctx"}

    assert len(OPERATIONS) > 15
    for name in OPERATIONS:
        # A client operation that lands on an agent RPC of the same name (or none) is caught here.
        implemented = getattr(Controller, name)
        assert inspect.iscoroutinefunction(implemented), name
        assert parameters(getattr(ProfilingApi, name)) == parameters(implemented), name
        assert types(getattr(ProfilingApi, name)) == types(implemented), name
