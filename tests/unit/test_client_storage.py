"""A download reads each profile from the storage its record names, over HTTP and in the cluster: after
``rayprof serve --storage NEW`` an earlier profile's files are still where they were written."""

from __future__ import annotations

import asyncio

import httpx

from orchestrator.client import ProfilingClient
from orchestrator.client.http import HttpBackend
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.requests import ProfileRequest, ProfileState
from tests.support.fake_agents import make_controller, run, start_agents, wait_terminal
from tests.support.inprocess_service import BASE_URL, install_service


class _SyncOverAsgi(httpx.BaseTransport):
    """A sync client's transport into the in-process app, whose event loop runs in another thread."""

    def __init__(self, app, loop: asyncio.AbstractEventLoop) -> None:
        self._asgi = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            request.stream = httpx.ByteStream(request.read())
            response = await self._asgi.handle_async_request(request)
            return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())

        return asyncio.run_coroutine_threadsafe(send(), self._loop).result(timeout=30)


def test_a_download_over_http_reads_the_storage_the_profiles_record_names_after_a_reconfigure(home, tmp_path, monkeypatch):
    new_root = tmp_path / "new-root"

    async def scenario():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        await c.ping()
        done, _ = await wait_terminal(c, (await c.submit(ProfileRequest(target="run", steps=2))).id)
        for a in agents:
            await a.stop()
        # `rayprof serve --storage NEW`: new profiles go there; the earlier one's files stay in the first root.
        await c.configure(StorageSpec(uri=str(new_root)))
        app = install_service(monkeypatch, c)
        backend = HttpBackend(BASE_URL, transport=_SyncOverAsgi(app, asyncio.get_running_loop()))
        client = ProfilingClient(backend=backend)
        folder = await asyncio.to_thread(lambda: client.get(done.id).download(tmp_path / "dl"))
        return done, folder

    done, folder = run(scenario(), timeout_s=30)
    assert done.state == ProfileState.DONE
    assert (folder / "manifest.json").exists() and len([p for p in folder.rglob("*") if p.is_file()]) > 1
    assert not new_root.exists() or not any(new_root.rglob("*.json"))
