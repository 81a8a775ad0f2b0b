"""Every thread's stacks in this worker, taken from the agent's own thread.

``sys._current_frames()`` needs only the GIL, which a training thread blocked
in a collective (or any call that released it) does not hold: this answers
while training is stuck. Native frames come from ``py-spy dump --native``
where py-spy is installed and may attach (ptrace); the torch flight recorder
dump where the job keeps one (``TORCH_FR_BUFFER_SIZE``).

What leaves the process: frames (file, line, function, the source line) and
thread names, never locals or the environment; py-spy's header, which holds
the process's command line (argv can carry secrets), is cut. The answer is cut
to the size the controller asks for.
"""

from __future__ import annotations

import json
import linecache
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import Collective, Frame, RankStacks, ThreadStack
from orchestrator.settings import DEFAULT_STACKS_MAX_RANK_BYTES
from orchestrator.stack_limits import bound_stacks

__all__ = ["take_stacks"]

_MAX_FRAMES = 200
_PY_SPY_TIMEOUT_S = 6.0
# Flight recorder entries kept per rank: enough to see the last collectives of every group.
_MAX_COLLECTIVES = 64
_MAX_FR_BYTES = 4 * 2**20
_LIBRARY_ROOTS = tuple(
    {p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib")) if p}
    # rayprof's own packages: their frames say nothing about the training job.
    | {str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "orchestrator")}
)


def take_stacks(
    bundle_id: str,
    agent_id: str,
    step: int,
    training_thread: int | None,
    native: bool,
    max_bytes: int = DEFAULT_STACKS_MAX_RANK_BYTES,
) -> RankStacks:
    """This process's stacks now, at most ``max_bytes`` of JSON; never raises (a failed part says
    why in its note). Text that is not valid UTF-8 (a file or thread name) is made so by the models."""
    threads = _python_threads(training_thread)
    native_text, native_note = _native() if native else (None, None)
    collectives, dump, fr_note = _flight_recorder()
    stacks = RankStacks(
        bundle_id=bundle_id,
        agent_id=agent_id,
        step=step,
        taken_at=utcnow(),
        threads=threads,
        native=native_text,
        native_note=native_note,
        collectives=collectives,
        flight_recorder=dump,
        flight_recorder_note=fr_note,
    )
    return bound_stacks(stacks, max_bytes)


def _python_threads(training_thread: int | None) -> list[ThreadStack]:
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    found = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        frames: list[Frame] = []
        f = frame
        while f is not None and len(frames) < _MAX_FRAMES:
            code = f.f_code
            filename = code.co_filename
            frames.append(
                Frame(
                    filename=filename,
                    line=f.f_lineno or 0,
                    function=code.co_name,
                    code=linecache.getline(filename, f.f_lineno or 0).strip() or None,
                    library=filename.startswith(_LIBRARY_ROOTS) or filename.startswith("<"),
                )
            )
            f = f.f_back
        frames.reverse()
        found.append(
            ThreadStack(
                thread_id=ident, name=names.get(ident, "?"), training=ident == training_thread, frames=frames
            )
        )
    # The training thread first, then the rest by name: the text file reads top-down.
    found.sort(key=lambda t: (not t.training, t.name))
    return found


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _native() -> tuple[str | None, str | None]:
    exe = _py_spy()
    if exe is None:
        return None, "native frames not taken: py-spy is not installed (pip install 'rayprof[native]')"
    try:
        done = subprocess.run(
            [exe, "dump", "--native", "--pid", str(os.getpid())],
            capture_output=True,
            timeout=_PY_SPY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"native frames not taken: py-spy did not finish within {_PY_SPY_TIMEOUT_S:g}s"
    except OSError as e:
        return None, f"native frames not taken: cannot run py-spy: {e}"
    if done.returncode != 0:
        # stderr only: stdout may already hold the header with the command line.
        err = done.stderr.decode(errors="replace").strip()[-400:] or f"exit code {done.returncode}"
        hint = ""
        if "ermission" in err or "ptrace" in err.lower():
            hint = " (py-spy needs ptrace rights: CAP_SYS_PTRACE, or kernel.yama.ptrace_scope=0)"
        return None, f"native frames not taken: py-spy failed{hint}: {err}"
    # Paths and names in the output are bytes in no particular encoding.
    frames = _from_first_thread(done.stdout.decode(errors="replace"))
    if not frames:
        return None, "native frames not taken: py-spy printed no threads"
    return frames, None


def _from_first_thread(text: str) -> str:
    """py-spy's output from its first thread on. The header before it names the process:
    ``Process 123: python train.py --token ...``, and an argument may span lines."""
    lines = text.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith("Thread ")), len(lines))
    return "".join(lines[first:])


def _flight_recorder() -> tuple[list[Collective], str | None, str | None]:
    """The last collectives of this process's flight recorder, and its dump (JSON)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return [], None, "no torch.distributed process group in this worker"
        from torch._C._distributed_c10d import _dump_fr_trace_json

        raw = _dump_fr_trace_json(True, False)
    except Exception as e:
        return [], None, f"torch flight recorder not readable here: {type(e).__name__}: {e}"
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    try:
        entries = json.loads(text).get("entries") or []
    except ValueError as e:
        return [], None, f"torch flight recorder dump is not JSON: {e}"
    if not entries:
        return [], None, "torch flight recorder is off: set TORCH_FR_BUFFER_SIZE (e.g. 2000) in the job's environment"
    collectives = [
        Collective(
            process_group=str((e.get("process_group") or ["?", "?"])[-1]),
            seq=int(e.get("collective_seq_id") or 0),
            op=str(e.get("profiling_name") or "?"),
            completed=bool(e.get("retired")) or e.get("state") == "completed",
        )
        for e in entries
        if not e.get("is_p2p")
    ][-_MAX_COLLECTIVES:]
    note = None
    if len(text) > _MAX_FR_BYTES:
        text, note = None, f"flight recorder dump of {len(text)} bytes not kept (over {_MAX_FR_BYTES})"
    return collectives, text, note
