"""A profile across hosts on a real network, and a host whose link is cut in the middle of a window.

Each Ray node is a host of its own (tests/support/netns.py): a network namespace with
its own address and hostname, linked to the others through a bridge. The head
(``head``, 10.213.0.1) runs the GCS, `rayprof serve`, the S3 server (moto) and
the training job's driver; ``node-b`` and ``node-c`` are worker nodes with one
trainer slot each, so rank 0 and rank 1 run on different hosts and every byte
between them (gloo's rendezvous, agent polls, uploads) crosses the bridge. The
test process is a client outside every host, reaching them through the bridge.

The job runs without DDP (``--no-ddp``): with DDP a rank whose peer's host went
dark blocks in the next all-reduce, so no rank could finish a window that a lost
host was part of (see docs/faults.md, "When a host drops out"). Agents poll through a
relay on their node (``--relay``). Ray Train may restart the worker group
(``--max-failures``), so the job comes back once the host does.

Nodes never run `ray stop` (it would stop every Ray cluster on the machine):
the test kills what runs on its hosts, host by host (:meth:`Host.kill_all`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator import ProfileState, ProfilingClient, RankState
from orchestrator.cli.example_job import ExampleJob
from orchestrator.errors import ProfileTimeoutError
from orchestrator.layout import profile_prefix
from orchestrator.manifest import verify_manifest
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import WorkerStatus
from orchestrator.models.profile import Manifest
from orchestrator.storage import Storage, open_storage
from tests.support.common import wait_for
from tests.support.netns import Host, Network, unavailable
from tests.support.own_cluster import REPO, shell_env
from tests.support.tracefiles import load_trace, profiler_steps

# Over 4 minutes on a loaded 2-core machine (three Ray nodes start, then one again): `make test-extended`.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.extended,
    pytest.mark.skipif(unavailable() is not None, reason=f"network namespaces: {unavailable()}"),
]

TARGET = "netns-run"
SLOT = "rayprof_trainer_slot"
STEPS = 4
# Long enough that node-b's link is cut while its rank is still capturing.
CUT_WINDOW_STEPS = 20
GCS_PORT, SERVE_PORT, S3_PORT = 6379, 8000, 9000
BUCKET = "rayprof-netns"
START_TIMEOUT_S = 180
NODE_START_ATTEMPTS = 4
# Every host has ports of its own, so the agents' ports are given. A raylet waits only 15 s for each
# agent's port file and aborts after that, while the agents' imports alone take longer on a loaded
# 2-core machine (20-30 s seen here): the test writes the files the raylet waits for itself, with the
# ports given here, which the agents write too once they listen (Ray 2.60's names, in the session dir).
AGENT_PORTS = {
    "dashboard_agent_listen_port": ("--dashboard-agent-listen-port", 52365),
    "metrics_agent_port": ("--dashboard-agent-grpc-port", 52366),
    "runtime_env_agent_port": ("--runtime-env-agent-port", 52367),
    "metrics_export_port": ("--metrics-export-port", 52368),
}
# Cut link to PARTIAL: node-b's rank fails at its expiry (RAYPROF_POLL_TIMEOUT_S +
# RAYPROF_WORKER_EXPIRY_GRACE_S, 2 + 4 s in tests/conftest.py, plus the reaping round); the profile
# ends when node-c's rank has also finished the rest of its window and uploaded it, which takes
# tens of seconds on a loaded 2-core machine.
PARTIAL_WITHIN_S = 120
# The failed rank's reason within this of the cut: expiry, reaping round and slack.
FAILED_WITHIN_S = 30


class RayHostNode:
    """`ray start --block` on one host, with a temp dir of its own (hosts share the file system)."""

    def __init__(self, host: Host, env: dict[str, str], root: Path, *args: str) -> None:
        self.host = host
        self.log = root / f"{host.name}.log"
        temp = root / host.name
        self.command = ["ray", "start", "--block", "--node-ip-address", host.ip, "--disable-usage-stats"]
        self.command += ["--temp-dir", str(temp), *[str(x) for flag in AGENT_PORTS.values() for x in flag], *args]
        self.env = env
        self.start()

    def start(self) -> None:
        self.started_at = time.monotonic()
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                self.host.command(self.command), stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO
            )

    def wait_started(self) -> None:
        """Wait for the node to be up. A raylet gives its agents 15 s to write their port files
        and aborts after that; their imports alone can take longer on a loaded 2-core machine,
        and take less the next time (the page cache is warm), so a node that timed out starts again."""
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                if "Ray runtime started" in self.log.read_text(errors="replace"):
                    return
                self._write_port_files()
                time.sleep(0.2)
            log = self.log.read_text(errors="replace")
            self.host.kill_all()
            if "timed out during startup" not in log or attempt == NODE_START_ATTEMPTS:
                raise AssertionError(f"ray on {self.host.name} did not start ({self.log}):\n{log[-3000:]}")
            self.start()


    def _write_port_files(self) -> None:
        """The agents' port files, for the raylet of this host that waits for them (see AGENT_PORTS)."""
        for pid in self.host.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            flags = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
            if not argv[0].endswith("/raylet") or "node_id" not in flags or "session_dir" not in flags:
                continue
            for name, (_, port) in AGENT_PORTS.items():
                path = Path(flags["session_dir"]) / f"{name}_{flags['node_id']}"
                if not path.exists():
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(str(port))
                    tmp.rename(path)


@dataclass
class Cluster:
    net: Network
    client: ProfilingClient
    job: ExampleJob
    storage: Storage
    nodes: dict[str, RayHostNode]
    root: Path

    def host_of_rank(self) -> dict[int, str]:
        (target,) = [t for t in self.client.targets() if t.name == TARGET]
        return {r.info.world_rank: r.info.host for r in target.ranks}


def _wait_listening(ip: str, port: int, what: str) -> None:
    def answers() -> bool:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(answers, timeout=START_TIMEOUT_S, what=what)


def _answers(client: ProfilingClient):
    def answers() -> bool:
        try:
            client.targets()
            return True
        except Exception:  # noqa: BLE001 - any failure here means: not yet
            return False

    return answers


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three hosts; S3, head and `rayprof serve` on the head; two worker hosts; the job across them.
    Its files (Ray's session dirs, the auth token's HOME, logs) are out of pytest's temp dirs, which
    other pytest runs on the machine rotate away while this one still runs."""
    root = Path(tempfile.mkdtemp(prefix="rayprof-netns-"))
    try:
        with Network(["head", "node-b", "node-c"]) as net:
            yield from _cluster(net, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cluster(net: Network, root: Path) -> Iterator[Cluster]:
    head = net.hosts["head"]
    # moto takes any keys; this process (boto3 here) and every host's processes use these.
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env = shell_env(HOME=str(root / "home"), RAY_AUTH_MODE="token")
    subprocess.run(["ray", "get-auth-token", "--generate"], env=env, capture_output=True, timeout=60, check=True)
    s3 = f"http://{head.ip}:{S3_PORT}"
    with open(root / "s3.log", "w") as out:
        moto = [sys.executable, "-m", "moto.server", "-H", head.ip, "-p", str(S3_PORT)]
        subprocess.Popen(head.command(moto), stdout=out, stderr=subprocess.STDOUT, env=env)
    _wait_listening(head.ip, S3_PORT, "the S3 server on the head")
    import boto3

    boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    uri = f"s3://{BUCKET}/netns-{uuid.uuid4().hex[:8]}"
    gcs = f"{head.ip}:{GCS_PORT}"
    head_args = ["--head", "--port", str(GCS_PORT), "--num-cpus", "1", "--include-dashboard", "false"]
    nodes = {"head": RayHostNode(head, env, root, *head_args)}
    nodes["head"].wait_started()
    serve = ["rayprof", "serve", "--address", gcs, "--storage", uri, "--s3-endpoint", s3]
    serve += ["--host", head.ip, "--port", str(SERVE_PORT), "--insecure"]
    served = subprocess.run(head.command(serve), env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    # `rayprof serve` probes /healthz once, right after deploying: on a loaded machine Serve's proxy
    # may still answer 503 then, while the app is deployed and answers a little later.
    assert served.returncode == 0 or "does not answer" in served.stderr, served.stderr[-3000:]
    client = ProfilingClient(f"http://{head.ip}:{SERVE_PORT}")
    wait_for(_answers(client), timeout=START_TIMEOUT_S, what="the rayprof service on the head")
    slot = ["--address", gcs, "--num-cpus", "1", "--resources", json.dumps({SLOT: 1})]
    for name in ("node-b", "node-c"):
        nodes[name] = RayHostNode(net.hosts[name], env, root, *slot)
    for name in ("node-b", "node-c"):
        nodes[name].wait_started()
    job_args = ["--resources-per-worker", json.dumps({"CPU": 1, SLOT: 1}), "--no-ddp", "--relay"]
    job_args += ["--max-failures", "10", "--storage-path", str(root / "train")]
    job = ExampleJob(gcs, TARGET, root / f"{TARGET}.log", *job_args, env=env, launcher=head.command([]))
    try:
        job.wait_until_training(client, ranks=2, timeout=300)
        storage = open_storage(StorageSpec(uri=uri, s3_endpoint_url=s3))
        yield Cluster(net, client, job, storage, nodes, root)
    finally:
        job.stop(timeout=30)


def _trace_steps(storage: Storage, manifest: Manifest, rank: int, dest: Path) -> list[int]:
    (trace,) = [a for a in manifest.ranks[rank].artifacts if a.kind == "trace"]
    key = f"{profile_prefix(manifest.target, manifest.profile_id)}/{trace.key}"
    return profiler_steps(load_trace(storage.download(key, dest / trace.key)))


def _print_manifest(manifest: Manifest) -> None:
    print(f"\nprofile {manifest.profile_id}: {manifest.status.value} ({manifest.reason or ''}),"
          f" steps {manifest.start_step}..{(manifest.stop_step or 0) - 1}, cluster={manifest.cluster}")
    for r in manifest.ranks:
        files = ", ".join(f"{a.kind} {a.bytes} B" for a in r.artifacts) or "none"
        print(f"  rank {r.rank}  host {r.host}  node_id {(r.node_id or '')[:12]}  pid {r.pid}  {r.state.value:6}"
              f"  steps {r.first_step}..{r.last_step}  files: {files}  {r.reason or ''}")


def test_profile_across_hosts_captures_the_same_steps_on_every_rank(cluster, tmp_path):
    manifest = cluster.client.profile(TARGET, steps=STEPS).wait(timeout=180)
    _print_manifest(manifest)
    window = list(range(manifest.start_step, manifest.stop_step))
    stored = cluster.storage.list(profile_prefix(TARGET, manifest.profile_id))

    assert manifest.status == ProfileState.DONE, [(r.rank, r.state.value, r.reason) for r in manifest.ranks]
    assert manifest.cluster["nodes"] == 2
    assert {r.host for r in manifest.ranks} == {"node-b", "node-c"}
    assert len({r.node_id for r in manifest.ranks}) == 2
    for r in manifest.ranks:
        assert r.state == RankState.DONE
        assert (r.first_step, r.last_step) == (window[0], window[-1])
        assert {a.kind for a in r.artifacts} >= {"trace", "op_table"}
        assert any(f"/rank{r.rank}." in key for key in stored)
        assert _trace_steps(cluster.storage, manifest, r.rank, tmp_path) == window
    assert verify_manifest(cluster.storage, manifest) == []


def _ranks(cluster: Cluster) -> dict[int, WorkerStatus]:
    targets = [t for t in cluster.client.targets() if t.name == TARGET]
    return {w.info.world_rank: w for t in targets for w in t.ranks}


def _relay_log(cluster: Cluster, host: str) -> list[str]:
    """What the relay on ``host`` logged (its actor's stderr, in that node's Ray logs)."""
    lines = []
    for path in sorted((cluster.root / host).glob("session_*/logs/worker-*.err")):
        lines += [line for line in path.read_text(errors="replace").splitlines() if "rayprof relay" in line]
    return lines


def test_a_host_cut_off_mid_window_fails_its_rank_and_the_restarted_job_profiles_done(cluster):
    """node-b's link goes down while its rank captures: that rank FAILED (its host stopped answering),
    the other rank DONE, the profile PARTIAL within PARTIAL_WITHIN_S. Ray then loses the node and
    Ray Train tears the worker group down; once the link is back, node-b joins again (its old raylet,
    declared dead, exits), the group restarts on both hosts, and the next profile is DONE."""
    before = _ranks(cluster)
    (victim,) = [r for r, w in before.items() if w.info.host == "node-b"]
    (survivor,) = [r for r, w in before.items() if w.info.host == "node-c"]
    host, node = cluster.net.hosts["node-b"], cluster.nodes["node-b"]
    handle = cluster.client.profile(TARGET, steps=CUT_WINDOW_STEPS)
    wait_for(
        lambda: handle.status().ranks[victim].state == RankState.CAPTURING if handle.status().ranks else False,
        timeout=120, interval=0.1, what="node-b's rank capturing",
    )
    t0, cut_at = time.monotonic(), datetime.now(timezone.utc)
    host.cut()
    try:
        try:
            manifest = handle.wait(timeout=PARTIAL_WITHIN_S)
        except ProfileTimeoutError:
            pytest.fail(f"not ended: {[(r.rank, r.state.value, r.last_step, r.reason) for r in handle.status().ranks]}")
        partial_in = time.monotonic() - t0
        _print_manifest(manifest)
        lost, kept = manifest.ranks[victim], manifest.ranks[survivor]
        stored = cluster.storage.list(profile_prefix(TARGET, manifest.profile_id))
        relay_while_cut = _relay_log(cluster, "node-b")

        assert manifest.status == ProfileState.PARTIAL, manifest.reason
        assert lost.state == RankState.FAILED and lost.host == "node-b" and lost.artifacts == []
        assert (lost.finished_at - cut_at).total_seconds() < FAILED_WITHIN_S
        assert "stopped responding" in lost.reason and "host node-b stopped answering" in lost.reason
        assert kept.state == RankState.DONE and kept.last_step == manifest.stop_step - 1
        assert verify_manifest(cluster.storage, manifest) == []
        assert not [key for key in stored if f"/rank{victim}." in key]
        # Ray Train tears the group down once Ray declares node-b dead: rank 0's worker goes too.
        wait_for(
            lambda: _ranks(cluster).get(survivor) is None or _ranks(cluster)[survivor].info.pid != before[survivor].info.pid,
            timeout=180, what="Ray Train to tear down the worker group",
        )
        torn_down_in = time.monotonic() - t0
    finally:
        host.restore()
    restored_in = time.monotonic() - t0
    # The old raylet learns it was declared dead and exits; what is left of it goes the same way.
    try:
        node.proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    host.kill_all()
    node.start()
    node.wait_started()
    cluster.job.wait_until_training(cluster.client, ranks=2, timeout=300)
    after = _ranks(cluster)
    again = cluster.client.profile(TARGET, steps=STEPS).wait(timeout=180)
    done_in = time.monotonic() - t0
    _print_manifest(again)
    print(
        f"\ntimeline from the cut ({cut_at:%H:%M:%S.%f} UTC): rank {victim} FAILED at "
        f"+{(lost.finished_at - cut_at).total_seconds():.1f}s, profile PARTIAL at +{partial_in:.1f}s, "
        f"worker group torn down at +{torn_down_in:.1f}s, link restored at +{restored_in:.1f}s, "
        f"next profile DONE at +{done_in:.1f}s"
    )
    print("relay on node-b while cut off:\n  " + "\n  ".join(relay_while_cut or ["(nothing logged)"]))

    assert {w.info.host for w in after.values()} == {"node-b", "node-c"}
    assert after[victim].info.pid != before[victim].info.pid
    assert again.status == ProfileState.DONE, [(r.rank, r.state.value, r.reason) for r in again.ranks]
    assert {r.host for r in again.ranks} == {"node-b", "node-c"}
    assert verify_manifest(cluster.storage, again) == []
