"""A profile across Ray nodes: a head and two worker nodes started with `ray start` on loopback.

Each worker node has one ``rayprof_trainer_slot``, and each training worker
asks for one, so rank 0 and rank 1 run on different nodes. Profiles go to S3
(the session's S3 server, behind a small proxy that can hold one rank's
uploads), through the HTTP service deployed with `rayprof serve --address`.
The cluster uses token auth like any Ray 2.60 cluster on a machine with a token:
its token is made in a fresh HOME (a new CI machine has none in ~/.ray), and
every process gets ``RAY_AUTH_MODE=token``, which an explicit address needs.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from orchestrator import ProfileState, ProfilingClient, RankState
from orchestrator.cli.example_job import ExampleJob
from orchestrator.layout import profile_prefix
from orchestrator.manifest import verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import TargetInfo
from orchestrator.models.profile import Manifest
from orchestrator.storage import Storage, open_storage
from tests.support.common import S3Target, wait_for
from tests.support.own_cluster import REPO, ray_stop, require_no_other_cluster, shell_env
from tests.support.serve_fixtures import free_port
from tests.support.tracefiles import load_trace, profiler_steps

pytest_plugins = ["tests.support.own_cluster"]
pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]

TARGET = "multinode-run"
SLOT = "rayprof_trainer_slot"
STEPS = 4
NODE_START_TIMEOUT_S = 120
NODE_START_ATTEMPTS = 3
# The nodes share one host: every agent of every node on a port of its own.
AGENT_PORT_FLAGS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
# Headers that belong to one HTTP hop, not to the request the proxy passes on.
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
}


class HoldingS3Proxy(ThreadingHTTPServer):
    """Passes every request on to the S3 server, except those whose path matches ``hold()``'s
    pattern: they wait until ``release()`` and then get a 503, like a link that went dark."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.held: re.Pattern[str] | None = None
        self.released = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, name="s3-proxy", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def hold(self, pattern: str) -> None:
        self.released.clear()
        self.held = re.compile(pattern)

    def release(self) -> None:
        self.held = None
        self.released.set()

    def close(self) -> None:
        self.release()
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address) -> None:
        # A client that gave up on a held request (its node was killed) is what the test wants.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for boto3's uploads
    server: HoldingS3Proxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(chunks)

    def _forward(self) -> None:
        body = self._body()
        held = self.server.held
        if held is not None and held.search(self.path):
            self.server.released.wait(300)
            self.send_error(503, "held by the test")
            return
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"content-length"}}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response(response.status, response.reason)
        for k, v in response.getheaders():
            # HEAD answers carry the object's length, not the (empty) body's.
            if k.lower() not in HOP_HEADERS and (k.lower() != "content-length" or self.command == "HEAD"):
                self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


class RayNode:
    """One `ray start --block` process on 127.0.0.1, in its own process group."""

    def __init__(self, name: str, env: dict[str, str], logs: Path, *args: str) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self.args = args
        self.env = env
        self._launch()

    def _launch(self) -> None:
        # Agent ports chosen at each start: one free a moment ago may since be another node's (Ray gives its own
        # processes ports at random; two nodes start together), and a start that failed on it would fail on it again.
        ports = [str(x) for flag in AGENT_PORT_FLAGS for x in (flag, free_port())]
        self.command = ["ray", "start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *self.args, *ports]
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO, start_new_session=True
            )

    def wait_started(self) -> None:
        """Wait for the node to be up. A raylet gives its agents 15 s to report their ports and
        aborts after that; their imports alone can take longer on a loaded 2-core machine, and
        take less the next time (the page cache is warm), and an agent whose port another node took
        exits at once: a node that timed out is started again, on fresh ports."""
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            deadline = time.monotonic() + NODE_START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                if "Ray runtime started" in self.log.read_text(errors="replace"):
                    return
                time.sleep(0.5)
            log = self.log.read_text(errors="replace")
            self.kill()
            if "timed out during startup" not in log or attempt == NODE_START_ATTEMPTS:
                raise AssertionError(f"ray node {self.name} did not start ({self.log}):\n{log[-3000:]}")
            self._launch()

    def hosts(self, pid: int) -> bool:
        """Whether process ``pid`` belongs to this node (a worker the node's raylet started)."""
        try:
            return self.proc.pid in {p.pid for p in psutil.Process(pid).parents()}
        except psutil.NoSuchProcess:
            return False

    def crash(self) -> None:
        """Every process of the node dies at once, as when its machine goes away."""
        processes = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in processes:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=30)

    def kill(self) -> None:
        """SIGKILL the node's process group: what a failed start left behind too."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@dataclass
class Cluster:
    client: ProfilingClient
    job: ExampleJob
    storage: Storage
    proxy: HoldingS3Proxy
    workers: list[RayNode]

    def target(self) -> TargetInfo:
        (target,) = [t for t in self.client.targets() if t.name == TARGET]
        return target

    def node_of(self, pid: int) -> RayNode:
        (node,) = [n for n in self.workers if n.hosts(pid)]
        return node

    def node_names(self) -> dict[int, str]:
        """The node of each training worker, by pid."""
        return {w.info.pid: self.node_of(w.info.pid).name for w in self.target().ranks}


@pytest.fixture(scope="module")
def cluster(s3_server: S3Target, tmp_path_factory) -> Iterator[Cluster]:
    """Head, `rayprof serve` on it, then two worker nodes and a 2-worker job spread over them."""
    require_no_other_cluster()
    logs = tmp_path_factory.mktemp("multinode")
    gcs = f"127.0.0.1:{free_port()}"
    env = shell_env(HOME=str(tmp_path_factory.mktemp("home")), RAY_AUTH_MODE="token")
    subprocess.run(["ray", "get-auth-token", "--generate"], env=env, capture_output=True, timeout=60, check=True)
    proxy = HoldingS3Proxy(s3_server.endpoint_url)
    uri = f"s3://{s3_server.bucket}/multinode-{uuid.uuid4().hex[:8]}"
    head_args = ["--head", "--port", gcs.rsplit(":", 1)[1], "--num-cpus", "1", "--include-dashboard", "false"]
    head_args += ["--ray-client-server-port", str(free_port())]
    nodes = [RayNode("head", env, logs, *head_args)]
    job = None
    try:
        nodes[0].wait_started()
        # The service (and the control actor it creates) first, so they live on the head node.
        port = free_port()
        serve = ["rayprof", "serve", "--address", gcs, "--storage", uri, "--s3-endpoint", proxy.url]
        served = subprocess.run(
            [*serve, "--port", str(port)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
        )
        assert served.returncode == 0, served.stderr[-3000:]
        slot = ["--num-cpus", "1", "--resources", json.dumps({SLOT: 1})]
        workers = [RayNode(name, env, logs, "--address", gcs, *slot) for name in ("node-b", "node-c")]
        nodes += workers
        for node in workers:
            node.wait_started()
        client = ProfilingClient(f"http://127.0.0.1:{port}")
        placement = ["--resources-per-worker", json.dumps({"CPU": 1, SLOT: 1})]
        job = ExampleJob(gcs, TARGET, logs / f"{TARGET}.log", *placement, env=env)
        job.wait_until_training(client, ranks=2, timeout=300)
        storage = open_storage(StorageSpec(uri=uri, s3_endpoint_url=s3_server.endpoint_url))
        yield Cluster(client, job, storage, proxy, workers)
    finally:
        if job is not None:
            job.stop()
        # `ray stop` ends every node's processes at once (stopping them one by one takes a minute);
        # then each `ray start --block` that is still there.
        ray_stop(env)
        for node in nodes:
            node.kill()
        proxy.close()


def _print_ranks_per_node(manifest: Manifest, nodes: dict[int, str]) -> None:
    print(
        f"\nprofile {manifest.profile_id}: {manifest.status.value}, steps {manifest.start_step}..{manifest.stop_step - 1},"
        f" cluster.nodes={manifest.cluster.get('nodes')}"
    )
    for r in manifest.ranks:
        node = nodes.get(r.pid, "?")
        files = ", ".join(f"{a.kind} {a.bytes} B" for a in r.artifacts) or "none"
        print(
            f"  rank {r.rank}  {node:7}  node_id {r.node_id[:12]}  pid {r.pid}  {r.state.value:6}"
            f"  steps {r.first_step}..{r.last_step}  files: {files}  {r.reason or ''}"
        )


def _trace_steps(cluster: Cluster, manifest: Manifest, rank: int, dest: Path) -> list[int]:
    (trace,) = [a for a in manifest.ranks[rank].artifacts if a.kind == "trace"]
    path = cluster.storage.download(
        f"{profile_prefix(manifest.target, manifest.profile_id)}/{trace.key}", dest / trace.key
    )
    return profiler_steps(load_trace(path))


def test_workers_run_on_different_nodes(cluster):
    ranks = {w.info.world_rank: w.info for w in cluster.target().ranks}

    assert sorted(ranks) == [0, 1]
    assert cluster.node_of(ranks[0].pid) is not cluster.node_of(ranks[1].pid)
    assert ranks[0].node_id != ranks[1].node_id


def test_profile_across_nodes_captures_the_same_steps_on_every_rank(cluster, tmp_path):
    manifest = cluster.client.profile(TARGET, steps=STEPS).wait(timeout=180)
    _print_ranks_per_node(manifest, cluster.node_names())
    window = list(range(manifest.start_step, manifest.stop_step))

    assert manifest.status == ProfileState.DONE, [(r.rank, r.state.value, r.reason) for r in manifest.ranks]
    assert manifest.cluster["nodes"] == 2
    assert [r.rank for r in manifest.ranks] == [0, 1]
    assert len({r.node_id for r in manifest.ranks}) == 2
    assert {cluster.node_of(r.pid).name for r in manifest.ranks} == {"node-b", "node-c"}
    for r in manifest.ranks:
        assert r.state == RankState.DONE and r.armed_at is not None
        assert (r.first_step, r.last_step) == (window[0], window[-1])
        assert {a.kind for a in r.artifacts} >= {"trace", "op_table"}
        assert _trace_steps(cluster, manifest, r.rank, tmp_path) == window
    assert verify_manifest(cluster.storage, manifest) == []


def test_node_lost_mid_window_fails_its_rank_and_keeps_the_others(cluster):
    """Node of rank 1 dies after its window's last step, while its upload is still on the way
    (held by the proxy): with DDP, a node lost before its peers finish their steps
    would stop their windows too, since they wait for it at every all-reduce."""
    ranks = {w.info.world_rank: w.info for w in cluster.target().ranks}
    victim, survivor = ranks[1], ranks[0]
    node, names = cluster.node_of(victim.pid), cluster.node_names()
    cluster.proxy.hold(rf"/rank{victim.world_rank}\.")
    handle = cluster.client.profile(TARGET, steps=STEPS)

    def survivor_done_victim_uploading() -> bool:
        states = {r.rank: r.state for r in handle.status().ranks}
        return (
            states.get(survivor.world_rank) == RankState.DONE and states.get(victim.world_rank) == RankState.UPLOADING
        )

    wait_for(survivor_done_victim_uploading, timeout=120, interval=0.2, what="rank 0 done, rank 1 uploading")
    crashed_at = time.monotonic()
    node.crash()
    manifest = handle.wait(timeout=120)
    ended_in = time.monotonic() - crashed_at
    cluster.proxy.release()
    _print_ranks_per_node(manifest, names)
    lost, kept = manifest.ranks[victim.world_rank], manifest.ranks[survivor.world_rank]
    stored = cluster.storage.list(profile_prefix(TARGET, manifest.profile_id))

    assert not psutil.pid_exists(victim.pid)
    assert manifest.status == ProfileState.PARTIAL
    assert lost.state == RankState.FAILED and "stopped responding" in lost.reason
    assert lost.node_id == victim.node_id and lost.artifacts == []
    assert kept.state == RankState.DONE and kept.node_id == survivor.node_id
    assert {a.kind for a in kept.artifacts} >= {"trace", "op_table"}
    assert verify_manifest(cluster.storage, manifest) == []
    assert not [key for key in stored if f"/rank{victim.world_rank}." in key]
    assert ended_in < 60
