"""Soak: everything that acts by itself, left running on a live job while storage fails at random.

A live 2-worker job whose ranks are not coupled (``--no-ddp``) and whose rank 1
sleeps every step, so a rank stays behind and both watches hold all along: a
stacks watch and a profile watch at their tightest allowed settings (no
``for``, no cooldown, 60 firings an hour, 1-step windows). Retention keeps few
automatic bundles (``retention_auto_count``), ``gc`` with the shortest grace
runs every few seconds, requested profiles are submitted throughout, and the
control actor's storage fails at random on ``FAIL_RATE`` of its calls: the
benchmark starts the control actor as a subclass that wraps the file storage
of its own process (the job's ranks upload without faults). A folder next to
the storage root, and a link planted inside the root that points at it, must
come through unchanged.

At the end: every requested profile is complete and its files verify against
its manifest, nothing outside the root changed, the controller's memory is
flat (RSS sampled throughout), and the counts: firings, bundles and profiles
kept, storage calls and failures injected, gc runs.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from actors.controller.actor import Controller
from benchmarks import LogFn
from benchmarks._stats import Result, ensure_ray, proc_rss_bytes
from orchestrator.cli.example_job import ExampleJob

NAME = "soak"
TARGET_NAME = "bench-soak"
FAIL_RATE = 0.1
# Storage calls the wrapper fails at random: every read, write, listing and delete.
_FLAKY_CALLS = ("put_bytes", "put_file", "get_bytes", "exists", "list", "folders", "delete", "delete_tree")
# A name rayprof could have given, dated long ago, so gc would take it for an old leftover.
_PLANTED = "prof-20200101-000000-deadbeef"


def _install_flaky_storage(rate: float, seed: int) -> tuple[dict[str, int], list[float]]:
    """Make this process's file storage fail ``rate`` of its calls; returns the live counts and the rate."""
    from orchestrator.errors import StorageError
    from orchestrator.storage.local import FileStorage

    counts = {"calls": 0, "injected": 0}
    failing = [rate]  # set to 0 by FlakyController.soak_calm at the end
    rng = random.Random(seed)
    lock = threading.Lock()

    def wrap(name: str) -> Any:
        original = getattr(FileStorage, name)

        def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                counts["calls"] += 1
                fail = rng.random() < failing[0]
                counts["injected"] += fail
            if fail:
                raise StorageError(f"injected failure of {name} (soak benchmark)")
            return original(self, *args, **kwargs)

        return flaky

    for name in _FLAKY_CALLS:
        setattr(FileStorage, name, wrap(name))
    return counts, failing


class FlakyController(Controller):
    """The real control actor, its storage failing at random: the soak's only seam."""

    def __init__(self, config: Any, rate: float, seed: int) -> None:
        self._flaky, self._failing = _install_flaky_storage(rate, seed)
        super().__init__(config)

    async def soak_calm(self) -> None:
        """Storage stops failing: the end of the soak checks what a clean retention round keeps."""
        self._failing[0] = 0.0

    async def soak_probe(self) -> dict[str, int]:
        return {"rss": proc_rss_bytes(os.getpid()), "tasks": len(self._tasks), **self._flaky}


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _start_controller(root: Path) -> Any:
    import ray

    from orchestrator.config import controller_config
    from orchestrator.models.agent_protocol import StorageSpec
    from orchestrator.settings import CONTROLLER_NAME, CONTROLLER_NAMESPACE

    try:  # an earlier benchmark's control actor: this one must be the flaky one
        ray.kill(ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE), no_restart=True)
        time.sleep(1.0)
    except ValueError:
        pass
    config = controller_config(StorageSpec(uri=str(root))).model_copy(
        # Pausing after a few failed firings would end the soak's firings early: a bundle makes ~5 storage
        # calls, so at 10% a third of them fail; pausing has its own test.
        update={"retention_count": 100, "retention_auto_count": 5, "cluster_name": "soak", "monitor_interval_s": 1.0,
                "watch_max_failures": 1000}
    )
    return (
        ray.remote(FlakyController)
        .options(name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE, num_cpus=0, max_concurrency=10_000)
        .remote(config, FAIL_RATE, 22)
    )


def _retrying(what: Any, log: LogFn, tries: int = 20) -> Any:
    """A client call that the injected failures may refuse (502): tried again, as a user would."""
    from orchestrator.errors import ConflictError, StorageError

    for attempt in range(tries):
        try:
            return what()
        except (StorageError, ConflictError) as e:
            if attempt == tries - 1:
                raise
            log(f"{NAME}: retrying after {type(e).__name__}: {str(e)[:120]}")
            time.sleep(1.0)
    raise AssertionError("unreachable")


def run(quick: bool, log: LogFn) -> list[Result]:
    import ray

    from orchestrator import ProfilingClient
    from orchestrator.client.ray_backend import ActorBackend
    from orchestrator.errors import RayprofError
    from orchestrator.manifest import read_manifest, verify_manifest
    from orchestrator.models.requests import ProfileState
    from orchestrator.storage import FileStorage

    duration_s = 60 if quick else 180
    tmp = Path(tempfile.mkdtemp(prefix="rayprof-bench-soak-"))
    root, outside = tmp / "store", tmp / "outside"
    (root / TARGET_NAME).mkdir(parents=True)
    outside.mkdir()
    for i in range(3):
        (outside / f"keep{i}.txt").write_text(f"not rayprof's {i}\n")
    (root / TARGET_NAME / _PLANTED).symlink_to(outside, target_is_directory=True)
    before = _tree_digest(outside)
    address = ensure_ray()
    handle = _start_controller(root)
    client = ProfilingClient(backend=ActorBackend(handle))
    job = ExampleJob(address, TARGET_NAME, tmp / "job.log", "--no-ddp", "--slow-rank", "1",
                     "--slow-rank-delay-s", "0.05")
    requested: list[str] = []
    rss: list[tuple[float, int]] = []
    gc_runs, gc_failed = 0, 0
    try:
        _retrying(lambda: job.wait_until_training(client), log, tries=3)
        tight = {"rank_lag": 1, "for_s": 0, "cooldown_s": 0, "max_per_hour": 60}
        watches = [
            _retrying(lambda: client.watch(TARGET_NAME, action="stacks", **tight), log),
            _retrying(lambda: client.watch(TARGET_NAME, action="profile", profile_steps=1, **tight), log),
        ]
        log(f"{NAME}: watches {[w.id for w in watches]}; soaking {duration_s}s at {FAIL_RATE:.0%} storage failures")
        t0 = time.monotonic()
        next_request = next_gc = t0
        while (now := time.monotonic()) - t0 < duration_s:
            job.check_alive()
            if now >= next_request:
                # Rank 0 only: the uncoupled straggler (rank 1) falls further behind all along, so a window on
                # the same steps of every rank would wait minutes for it and end PARTIAL at its timeout.
                status = _retrying(lambda: client.profile(TARGET_NAME, steps=2, ranks=[0], queue=True), log).last_status
                requested.append(status.id)
                # Few enough that the profile watch finds the target free between them.
                next_request = now + duration_s / 4
            if now >= next_gc:
                gc_runs += 1
                try:
                    gc_failed += bool(client.gc(grace_hours=0.001).failed)
                except Exception as e:  # a listing the injected failures refused: counted, not fatal
                    gc_failed += 1
                    log(f"{NAME}: gc failed: {type(e).__name__}: {str(e)[:120]}")
                next_gc = now + 5
            rss.append((now - t0, ray.get(handle.soak_probe.remote())["rss"]))
            time.sleep(2.0)
        final_watches = client.watches()
        for w in final_watches:
            _retrying(lambda w=w: client.delete_watch(w.id), log)
        ended: dict[str, Any] = {}
        for pid in requested:
            try:
                ended[pid] = _retrying(lambda pid=pid: client.get(pid).wait(timeout=300), log)
            except RayprofError as e:  # ended without a manifest, or never ended
                ended[pid] = e
        probe = ray.get(handle.soak_probe.remote())
        # A delete that failed is left for retention's next round (the next profile to end, or gc):
        # with storage calm again, one gc round must bring the automatic ones within their budget.
        ray.get(handle.soak_calm.remote())
        _retrying(lambda: client.gc(grace_hours=0.001), log)
        page = client.list(limit=1000)
    finally:
        job.stop()
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already gone: nothing to stop
            pass
    storage = FileStorage(root)
    complete = 0
    problems: list[str] = []
    for pid, manifest in ended.items():
        if isinstance(manifest, RayprofError):
            problems.append(f"{pid}: {manifest.message}")
            continue
        if manifest.status != ProfileState.DONE:
            problems.append(f"{pid} {manifest.status.value}: {manifest.reason}")
            continue
        bad = verify_manifest(storage, read_manifest(storage, TARGET_NAME, pid))
        complete += not bad
        problems += [f"{pid}: {b}" for b in bad]
    after = _tree_digest(outside) if outside.is_dir() else {}
    outside_changed = sorted(set(before.items()) ^ set(after.items()))
    shutil.rmtree(tmp, ignore_errors=True)

    fired = {w.spec.action: len(w.fired_at) for w in final_watches}
    failed = {w.spec.action: sum(f.error is not None for f in w.firings) for w in final_watches}
    paused = [f"{w.spec.action}: {w.paused}" for w in final_watches if w.paused]
    kept = {
        "requested": sum(p.trigger is None for p in page.profiles),
        "automatic stacks": sum(p.trigger is not None and p.kind == "stacks" for p in page.profiles),
        "automatic profiles": sum(p.trigger is not None and p.kind == "profile" for p in page.profiles),
    }
    warm = [b for t, b in rss if t >= duration_s / 3]
    growth = (max(warm[-3:]) - min(warm[:3])) / 2**20 if len(warm) >= 6 else float("nan")
    curve = ", ".join(f"{t:.0f}s {b / 2**20:.0f}" for t, b in rss[:: max(1, len(rss) // 12)])
    log(f"{NAME}: problems {problems}; outside changed {outside_changed}; paused {paused}; "
        f"notes {[w.note for w in final_watches]}")
    return [
        Result(NAME, "requested profiles complete and verified", "", complete, n=len(ended),
               target=f"{len(ended)} of {len(ended)}", met=complete == len(ended) and not problems,
               note="; ".join(problems)[:300]),
        Result(NAME, "files outside the root changed", "", len(outside_changed), target="0",
               met=not outside_changed, note=f"a link to it was planted in the root as {_PLANTED}"),
        Result(NAME, "controller RSS growth after the first third", "MiB", growth, n=len(warm), target="flat (< 20 MiB)",
               met=growth < 20, note=f"RSS MiB over time: {curve}"),
        Result(NAME, "watch firings (stacks / profile)", "", sum(fired.values()), n=2,
               target="<= 60 each (max_per_hour)", met=all(v <= 60 for v in fired.values()),
               note=f"fired {fired}; failed among the last 20 {failed}; paused {paused or 'none'}"),
        Result(NAME, "profiles and bundles kept at the end", "", float(len(page.profiles)),
               target="automatic <= 5 (retention_auto_count)",
               met=kept["automatic stacks"] + kept["automatic profiles"] <= 5, note=str(kept)),
        Result(NAME, "controller storage calls failed (injected)", "", float(probe["injected"]),
               note=f"{probe['injected']} of {probe['calls']} calls; gc ran {gc_runs} times, {gc_failed} reported "
               f"failures; {duration_s}s soak"),
    ]
