"""Run the example training job (``deploy/examples/train_job.py``) as its own Ray driver.

The demo, the integration tests and the benchmarks all need a live job to
profile; this is the one way they start, watch and stop it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.models.control import TargetInfo

__all__ = ["TRAIN_JOB", "ExampleJob", "stop_all"]

TRAIN_JOB = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "train_job.py"


class ExampleJob:
    """The example job in a child process, connected to the cluster at ``address``.

    It stops cleanly when its stop file appears (checked every 20 steps), or
    after ``max_seconds``. ``args`` go to ``train_job.py`` as they are; ``env``
    replaces the environment it inherits (e.g. ``RAY_AUTH_MODE=token`` to reach a
    token-auth cluster by an explicit address); ``launcher`` goes before the command
    (e.g. ``ip netns exec ...`` to run the driver on another host).
    """

    def __init__(
        self,
        address: str,
        name: str,
        log: Path,
        *args: str,
        max_seconds: float = 1500.0,
        env: dict[str, str] | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        if not TRAIN_JOB.is_file():
            raise FileNotFoundError(f"cannot find the example job at {TRAIN_JOB}; run from a source checkout")
        self.name = name
        self.log = Path(log)
        self.stop_file = self.log.with_suffix(".stop")
        self.stop_file.unlink(missing_ok=True)
        command = [*launcher, sys.executable, str(TRAIN_JOB), "--name", name, "--address", address]
        command += ["--max-seconds", str(int(max_seconds)), "--stop-file", str(self.stop_file), *args]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=TRAIN_JOB.parents[2], env=env
            )

    def check_alive(self) -> None:
        """Raise with the end of the job's log if it has exited."""
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"training job {self.name} exited ({self.proc.returncode}); end of {self.log}:\n{tail}")

    def wait_until_training(self, client: Any, *, ranks: int = 2, min_step: int = 3, timeout: float = 240.0) -> TargetInfo:
        """Wait until ``ranks`` agents registered and all passed ``min_step``; the target as it is then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            for target in client.targets():
                if target.name == self.name and len(target.ranks) == ranks and min(r.step for r in target.ranks) >= min_step:
                    return target
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not train on {ranks} ranks within {timeout:g}s; see {self.log}")

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the job to finish; kill it if it has not within ``timeout``."""
        self.stop_file.touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def stop_all(jobs: Sequence[ExampleJob], timeout: float = 60.0) -> None:
    """Ask every job to finish first, then wait for each: their shutdowns (Ray Train's, ~10 s) overlap."""
    for job in jobs:
        job.stop_file.touch()
    for job in jobs:
        job.stop(timeout)
