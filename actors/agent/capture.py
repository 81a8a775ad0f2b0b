"""One profiling window on one rank: open and close ``torch.profiler`` on the
training thread, then export, compress and upload off it.

The training thread calls :meth:`Capture.on_boundary` at every step boundary
while the window is armed. The boundary that closes the window stops the
profiler and has Kineto write the raw trace; parsing, compression and upload
then run off the training thread (a short-lived thread and a child process).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter
from torch.profiler import ProfilerAction

from actors.agent.children import run_child, store_snapshot
from actors.agent.cuda_memory import Allocator, TorchAllocator
from actors.agent.devices import profiler_activities
from actors.agent.frame_sampler import FrameSampler
from actors.agent.gc_watch import GcWatch
from actors.agent.pace import Measure
from actors.agent.thread_clock import ThreadClock
from actors.export.contract import (
    EXIT_TOO_LARGE,
    MEMORY_NAME,
    OPS_NAME,
    RAW_TRACE_NAME,
    TRACE_NAME,
    ExportResult,
    child_args,
)
from orchestrator.layout import rank_artifact_keys
from orchestrator.loops import METADATA_KEY, Loop
from orchestrator.models.agent_protocol import WindowSpec, WorkerInfo
from orchestrator.models.common import utcnow
from orchestrator.models.gc_pauses import GC_METADATA_KEY
from orchestrator.models.pace import STEPS_BEFORE_METADATA_KEY, StepsBefore
from orchestrator.models.profile import Artifact, RankEvent
from orchestrator.models.requests import RankState
from orchestrator.models.samples import FRAMES_METADATA_KEY
from orchestrator.models.thread_time import THREAD_TIME_METADATA_KEY
from orchestrator.scratch import make_scratch
from orchestrator.settings import (
    DEFAULT_FRAME_SAMPLE_MS,
    DEFAULT_MEMORY_SNAPSHOT_MAX_ENTRIES,
    FRAME_SAMPLE_MS_ENV_VAR,
    FRAME_SAMPLES_MAX,
    GC_RECORDS_MAX,
    MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR,
    env_float,
    env_int,
)
from orchestrator.storage import open_storage

__all__ = ["Capture"]

logger = logging.getLogger(__name__)

EmitFn = Callable[[RankEvent], None]


class CaptureTooLarge(Exception):
    """Nothing of the trace can be kept: its first step alone, or the whole trace at over twice the byte cap."""

    def __init__(self, message: str, trace_bytes: int) -> None:
        super().__init__(message)
        self.trace_bytes = trace_bytes


class Capture:
    """State of one armed window, driven by step boundaries.

    Steps are numbered by completed boundaries: after boundary ``n`` the
    training loop runs step ``n``. The profiler starts at boundary
    ``start_step - warmup`` and stops at boundary ``start_step + steps``, so
    the trace holds ``ProfilerStep#start_step`` .. ``#start_step+steps-1``.
    """

    def __init__(
        self,
        window: WindowSpec,
        info: WorkerInfo,
        emit: EmitFn,
        on_closed: Callable[[], None],
        allocator: Allocator | None = None,
        loop: Loop | None = None,
        before: Measure | None = None,
    ) -> None:
        self.window = window
        # Whose loop the job runs (None: its own), written into the trace for the fixes its report names.
        self.loop = loop
        # The steps just before the window (the agent's heartbeats), written into the trace beside the window's own.
        self.before = before
        self.info = info
        self._emit = emit
        self._on_closed = on_closed
        self._first_boundary = window.start_step - window.warmup
        self._prof: torch.profiler.profile | None = None
        # The CUDA allocator's history, recorded over the window's steps when memory_snapshot is on.
        self._allocator: Allocator = allocator or TorchAllocator()
        self._recording = False
        self._sampler: FrameSampler | None = None
        self._clock: ThreadClock | None = None  # the training thread's CPU time over the window's steps
        self._gc: GcWatch | None = None  # the process's garbage collections over the window's steps
        self._snapshot: dict[str, Any] | None = None
        self.cancelled = False
        self.closed = False
        self.finisher: threading.Thread | None = None

    def on_boundary(self, step: int) -> None:
        """Advance the window after boundary ``step``. Never raises into training."""
        if self.closed:
            return
        try:
            if self.cancelled:
                self._abort(RankState.CANCELLED, "cancelled")
            elif step < self._first_boundary:
                return
            elif self._prof is None:
                if step == self._first_boundary:
                    self._start(step)
                else:
                    self._abort(
                        RankState.FAILED,
                        f"window start boundary {self._first_boundary} had passed (rank was at step {step})",
                        missed_start=True,
                    )
            elif step < self.window.stop_step:
                if step == self.window.start_step:
                    self._window_begins()
                self._prof.step()
                if step == self.window.start_step:
                    self._emit_state(RankState.CAPTURING)
            else:
                self._stop()
        except Exception as e:  # Training must survive any profiler failure.
            logger.exception("rayprof: profiling window %s failed", self.window.profile_id)
            self._abort(RankState.FAILED, f"profiler error: {type(e).__name__}: {e}")

    def _schedule(self, n: int) -> ProfilerAction:
        w = self.window
        if n < w.start_step:
            return ProfilerAction.WARMUP
        if n < w.stop_step - 1:
            return ProfilerAction.RECORD
        if n == w.stop_step - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    def _start(self, step: int) -> None:
        w = self.window
        if w.options.memory_snapshot and (why := self._allocator.unavailable()):
            raise RuntimeError(f"memory_snapshot asked for, but {why}")
        prof = torch.profiler.profile(
            activities=profiler_activities(self.window.options.activities),
            schedule=self._schedule,
            **w.options.profiler_kwargs(),
        )
        # Number profiler steps by the global optimizer step so every rank's
        # trace carries the same ProfilerStep#N markers.
        prof.step_num = step
        action = self._schedule(step)
        prof.current_action = action
        if hasattr(prof, "_prev_schedule_action"):
            prof._prev_schedule_action = action
        if step == w.start_step:
            self._window_begins()
        prof.start()
        self._prof = prof
        self._mark(prof)
        if step == w.start_step:
            self._emit_state(RankState.CAPTURING)

    def _mark(self, prof: torch.profiler.profile) -> None:
        """Write whose loop this is and the steps before the window into the trace's metadata; a profiler that cannot
        costs the trace only those lines."""
        marks: list[tuple[str, str]] = []
        if self.loop is not None:
            marks.append((METADATA_KEY, json.dumps(self.loop.value)))  # as add_metadata writes a string
        if (b := self.before) is not None:
            seen = StepsBefore(
                step_ms=b.step_s * 1000, steps=b.steps, span_s=b.span_s, windows_before=b.windows_before,
                options=self.window.options.per_op_costs(),
            )
            marks.append((STEPS_BEFORE_METADATA_KEY, seen.model_dump_json()))
        for key, value in marks:
            try:
                prof.add_metadata_json(key, value)
            except Exception as e:
                logger.warning("rayprof: the trace of window %s will not hold its %s: %s", self.window.profile_id, key, e)

    def _window_begins(self) -> None:
        """The boundary before the window's first step: record the allocator, sample the stack, time the thread and
        watch the collector from here on. Called before the profiler opens the first step's span, so that starting
        them (a thread's start, ~1-2 ms on a busy host) is not read as the loop's own work in that step."""
        if self.window.options.memory_snapshot:
            self._allocator.start(env_int(MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR, DEFAULT_MEMORY_SNAPSHOT_MAX_ENTRIES))
            self._recording = True
        interval_ms = env_float(FRAME_SAMPLE_MS_ENV_VAR, DEFAULT_FRAME_SAMPLE_MS)
        if interval_ms > 0:
            self._sampler = FrameSampler(threading.get_ident(), interval_ms / 1000, FRAME_SAMPLES_MAX)
            self._sampler.start()
        self._clock = ThreadClock()
        self._gc = GcWatch(threading.get_ident(), GC_RECORDS_MAX)
        self._gc.start()

    def _end_sampling(self, prof: torch.profiler.profile | None) -> None:
        """Stop sampling the stack and timing the thread and the collector; write what they saw into the trace while
        ``prof`` still records (None: drop it)."""
        sampler, self._sampler = self._sampler, None
        clock, self._clock = self._clock, None
        watch, self._gc = self._gc, None
        samples = sampler.stop() if sampler is not None else None
        collections = watch.stop() if watch is not None else None
        if prof is None:
            return
        for key, seen in (
            (FRAMES_METADATA_KEY, samples), (THREAD_TIME_METADATA_KEY, clock.stop() if clock else None),
            (GC_METADATA_KEY, collections),
        ):
            if seen is None:
                continue
            try:
                prof.add_metadata_json(key, seen.model_dump_json())
            except Exception as e:
                logger.warning("rayprof: the trace of window %s will not hold its %s: %s", self.window.profile_id, key, e)

    def _stop_recording(self) -> None:
        if self._recording:
            self._recording = False
            self._allocator.stop()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        assert prof is not None
        self._end_sampling(prof)
        prof.stop()
        if self._recording:
            # Taken here, on the training thread, so it holds exactly the window's steps; written
            # out (pickled, rendered) off this thread in _finish.
            try:
                self._snapshot = self._allocator.snapshot()
            finally:
                self._stop_recording()
        # export_chrome_trace is one C++ call that holds the GIL from start to end
        # (~5 ms for a default 5-step CPU window, ~20 ms with every option). Run from
        # another thread it stalls this one just as long, plus the GIL hand-offs, in
        # the steps after the window; here it costs its own time once, in the boundary
        # that already pays prof.stop() (benchmarks/window.py measures both).
        tmp = make_scratch(self.window.profile_id)
        try:
            prof.export_chrome_trace(str(tmp / RAW_TRACE_NAME))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            _release(prof)
        self._close()
        self.finisher = threading.Thread(
            target=self._finish, args=(tmp,), name=f"rayprof-export-{self.window.profile_id}", daemon=True
        )
        self.finisher.start()

    def _abort(self, state: RankState, reason: str, *, missed_start: bool = False) -> None:
        prof, self._prof = self._prof, None
        try:
            self._end_sampling(None)
        except Exception:
            logger.exception("rayprof: stopping the stack sampler failed")
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                logger.exception("rayprof: stopping the profiler failed")
            finally:
                _release(prof)
        try:
            self._stop_recording()
        except Exception:
            logger.exception("rayprof: stopping the allocator's history failed")
        self._close()
        self._emit(self._event(state, reason=reason, missed_start=missed_start))

    def _close(self) -> None:
        self.closed = True
        self._on_closed()

    def _emit_state(self, state: RankState) -> None:
        self._emit(self._event(state))

    def _event(self, state: RankState, **fields: Any) -> RankEvent:
        return RankEvent(
            profile_id=self.window.profile_id, agent_id=self.info.agent_id, state=state, at=utcnow(), **fields
        )

    def _finish(self, tmp: Path) -> None:
        """Parse, compress and upload the raw trace in ``tmp``, then remove ``tmp``."""
        self._emit_state(RankState.UPLOADING)
        try:
            event = self._export_and_upload(tmp)
        except CaptureTooLarge as e:
            event = self._event(RankState.FAILED, reason=str(e), trace_bytes=e.trace_bytes)
        except Exception as e:
            logger.exception("rayprof: export/upload of %s failed", self.window.profile_id)
            event = self._event(RankState.FAILED, reason=f"export/upload failed: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._emit(event)

    def _export_and_upload(self, tmp: Path) -> RankEvent:
        w = self.window
        keys = rank_artifact_keys(self.info.world_rank, self.info.host, self.info.pid)
        storage = open_storage(w.storage).scoped(w.prefix)

        raw = tmp / RAW_TRACE_NAME
        result = _run_exporter(raw, tmp, memory=w.options.profile_memory, shapes=w.options.record_shapes, max_bytes=w.max_trace_bytes)
        raw.unlink()

        artifacts: list[Artifact] = [storage.put_file(tmp / TRACE_NAME, keys["trace"], "trace")]
        if w.options.profile_memory:
            artifacts.append(storage.put_file(tmp / MEMORY_NAME, keys["memory_timeline"], "memory_timeline"))
        artifacts.append(storage.put_file(tmp / OPS_NAME, keys["op_table"], "op_table"))
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            title = f"CUDA memory of rank {self.info.world_rank}, profile {w.profile_id}, steps {w.start_step}..{w.stop_step - 1}"
            artifacts += store_snapshot(snapshot, tmp, keys, storage, title)

        steps = result.steps
        numbers = sorted(steps)
        reason = None
        if result.cut and numbers:
            reason = (
                f"trace cut to steps {numbers[0]}..{numbers[-1]} of {w.start_step}..{w.stop_step - 1}: "
                f"the window's trace was {result.raw_bytes} bytes, over the cap of {w.max_trace_bytes} bytes "
                "(RAYPROF_MAX_TRACE_BYTES)"
            )
        return self._event(
            RankState.DONE,
            reason=reason,
            first_step=numbers[0] if numbers else None,
            last_step=numbers[-1] if numbers else None,
            step_durations_ms=[steps[n] for n in numbers],
            base_time_ns=result.base_time_ns,
            trace_bytes=result.raw_bytes,
            artifacts=artifacts,
        )


def _release(prof: torch.profiler.profile) -> None:
    """Let the window's profiler, and every event it holds, be freed as its last reference goes, at the boundary
    that stops it. torch's ``profile`` keeps bound methods of itself in its action map: a reference cycle that only
    the cyclic collector frees, in whichever later collection reaches it, on whichever thread, at tens of
    milliseconds a window (the live example job: young collections of 10-51 ms of CPU in later windows' steps,
    read as the job's own garbage-collection pauses)."""
    action_map = getattr(prof, "action_map", None)
    if isinstance(action_map, dict):
        action_map.clear()


def _run_exporter(raw: Path, out: Path, *, memory: bool, shapes: bool, max_bytes: int) -> ExportResult:
    """Parse the trace and write the artifacts in a child process (see actors.export)."""
    done = run_child(["-m", "actors.export", *child_args(raw, out, memory=memory, shapes=shapes, max_bytes=max_bytes)])
    if done.returncode == EXIT_TOO_LARGE:
        raise CaptureTooLarge(
            f"{done.stderr.strip()[-300:]} (RAYPROF_MAX_TRACE_BYTES); nothing kept: "
            "profile fewer steps or turn off with_stack/record_shapes",
            trace_bytes=raw.stat().st_size,
        )
    if done.returncode != 0:
        raise RuntimeError(f"trace export exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return _EXPORT_RESULT.validate_json(done.stdout)


# Checks the child's answer at the process boundary (keys of ``steps`` back to ints).
_EXPORT_RESULT = TypeAdapter(ExportResult)
