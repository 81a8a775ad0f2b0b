"""What every finding rule shares: how a finding states its bound, when one step holds its cost, and the words it uses for ranks and steps."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.models.analysis import Finding, IdleCause, RankSummary, Straggler, Summary

__all__ = [
    "DEVICE_NAMES",
    "ONE_STEP_OTHERS_FRACTION",
    "ONE_STEP_SHARE",
    "OWN_FINDING_CAUSES",
    "REPORT_FRACTION",
    "WARNING_FRACTION",
    "OneStep",
    "Runtime",
    "claimed_causes",
    "comm_cost",
    "first_use_examples",
    "host_fix_bound",
    "idle_text",
    "make_finding",
    "ms_list",
    "one_step",
    "per_step_cost",
    "ranks_text",
    "runtime_of",
    "share",
    "step_word",
    "verdict",
    "worst_straggler",
]

# When a finding warns (docs/results.md, "When a finding warns"): the one named cause its fix removes (the DataLoader
# wait, a sync, pageable copies, exposed collectives, a straggler, the optimizer's host time, a region, the allocator,
# launch pace, ...) explains at least this share of the step. Below it, a finding is at most an info line. 8%: the
# TensorBoard plugin's num_workers=4 ResNet50 samples, healthy by the tutorial that made them, reach 7.1% at most
# (pageable uploads); the smallest cause to be told among the real traces, the sync drain of HTA's TorchRec-style
# A100 trace, is 8.6%. A judgement from those traces, stated in docs/results.md.
WARNING_FRACTION = 0.08
# Share of the step from which an idle cause with a finding of its own is reported at all (as info below WARNING_FRACTION).
REPORT_FRACTION = 0.05
# A figure that rounds to "0.0 ms" names nothing worth reading: lists of named figures leave those out.
SHOWN_MS = 0.05
DEVICE_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "mtia": "MTIA", "xpu": "XPU", "cpu": "CPU"}
# What a device's first use pays, in its own runtime's words: a ROCm trace has a HIP context and MIOpen, no cuDNN.
_FIRST_USES = {
    "cuda": ("creating the CUDA context", "cuDNN's first convolution and its autotuning"),
    "rocm": ("creating the HIP context", "MIOpen's first convolution and its tuning"),
    "xpu": ("creating the Level Zero context", "oneDNN's first convolution and its kernel generation"),
}


@dataclass(frozen=True)
class Runtime:
    """How a fix names what the device's runtime offers: torch's module for it (``torch.cuda.empty_cache()``), and
    what one runtime has that another lacks."""

    name: str  # the runtime's own name: CUDA (HIP keeps torch.cuda's), XPU
    module: str
    event: str  # what the host waits on for a copy's end without stalling the device, with its article
    synchronize: str  # the runtime's call in which the host waits for a stream
    stream_wait: str  # the runtime's call by which one stream waits for another's event
    # Whether torch.compile(mode='reduce-overhead') replays the model's kernels as graphs (CUDA's and HIP's graphs).
    graphs: bool
    # The allocator's setting against fragmentation, where the runtime's caching allocator has one.
    expandable_segments: str | None


_CUDA_RUNTIME = Runtime(
    "CUDA", "torch.cuda", "a CUDA event", "cudaStreamSynchronize", "cudaStreamWaitEvent", True,
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
)
# ROCm's: torch keeps CUDA's names (torch.cuda, its events, graphs and allocator settings); the runtime's calls are HIP's.
# An Intel GPU's (torch.xpu): Inductor's graph replay (cudagraph trees) and the allocator's expandable segments are
# CUDA's, not promised there.
_RUNTIMES = {
    "rocm": Runtime(
        "CUDA", "torch.cuda", "a CUDA event", "hipStreamSynchronize", "hipStreamWaitEvent", True,
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    ),
    "xpu": Runtime(
        "XPU", "torch.xpu", "an XPU event (torch.xpu.Event)", "urQueueFinish", "urEnqueueEventsWait", False, None
    )
}


def runtime_of(device: str) -> Runtime:
    """The runtime a fix names for ``device`` (a RankSummary's: cuda, rocm, xpu...); CUDA's where the trace does
    not say."""
    return _RUNTIMES.get(device, _CUDA_RUNTIME)


# Idle causes with a finding of their own (DataLoader, sync, copy, collectives, late ranks), each when its idle
# time reaches REPORT_FRACTION of the step; the device-utilization finding counts the rest.
OWN_FINDING_CAUSES: tuple[IdleCause, ...] = ("data", "anomaly", "sync", "copy", "collective", "late_rank")


def first_use_examples(device: str) -> str:
    """The first uses a runtime pays once on ``device``, as examples in a fix's words."""
    context, convolution = _FIRST_USES.get(device, ("creating the device's runtime context", None))
    examples = [context, "loading a module's kernels at their first launch", convolution, "the caching allocator's first blocks"]
    return ", ".join(e for e in examples if e)


def worst_straggler(stragglers: Sequence[Straggler]) -> Straggler | None:
    """The straggler the straggler finding tells (the others it lists): the one that holds the others back longest."""
    return max(stragglers, key=lambda s: s.excess_ms) if stragglers else None


def ranks_text(ranks: Sequence[RankSummary]) -> str:
    ids = [r.rank for r in ranks]
    return f"rank {ids[0]}" if len(ids) == 1 else "ranks " + ", ".join(map(str, ids))


def share(r: RankSummary, ms: float) -> float:
    return ms / r.mean_step_ms if r.mean_step_ms else 0.0


def step_word(r: RankSummary) -> str:
    return {"whole_trace": "trace (no ProfilerStep)", "device_span": "device's active span (no ProfilerStep)"}.get(
        r.window, "iteration (no ProfilerStep)" if r.window == "iterations" else "step"
    )


def comm_cost(r: RankSummary) -> float:
    """What overlapping collectives could win per step: on a device, collective kernel time no compute kernel hides
    and idle time the host spends in collectives (not the host's wait while the device computes); else the host's wait."""
    if r.gpu is None or r.idle is None:
        return r.comm_wait_ms
    return r.gpu.comm_exposed_ms_per_step + r.idle.ms("collective")


def host_fix_bound(r: RankSummary, ms: float, *causes: IdleCause) -> float:
    """What removing a host-side cost can win: on a device, the idle time attributed to ``causes`` (the device
    was busy the rest of the host's time); on a CPU-only trace, the host time ``ms`` itself."""
    return r.idle.ms(*causes) if r.idle is not None else ms


# A cost is one step's when that step holds at least this share of the window's total of it, and the other steps'
# median is at most ONE_STEP_OTHERS_FRACTION of it: a one-off (warm-up in the window's first step, an epoch's first
# batch, a pause of the machine) that a mean over a short window would make every step's.
ONE_STEP_SHARE = 0.5
ONE_STEP_OTHERS_FRACTION = 0.25


@dataclass(frozen=True)
class OneStep:
    """A cost that one step of the window carries (:func:`one_step`)."""

    step: int
    ms: float
    fraction: float
    """Its share of the window's total of the cost."""
    others_ms: float
    """The other steps' median."""
    others: int

    def label(self, r: RankSummary) -> str:
        """'step 469', or 'iteration 0' where ``r``'s steps are iterations found without ProfilerStep."""
        return f"{_unit(r)} {self.step}"

    def sentence(self, r: RankSummary) -> str:
        word = _unit(r)
        return (
            f" {self.fraction:.0%} of it is one {word}'s: {self.label(r)} has {self.ms:.1f} ms, the other {self.others} "
            f"{word}s {self.others_ms:.1f} ms (median). Profile more steps, or later ones (--steps, a later window), to "
            "see whether it recurs (at each epoch's start, say) or was warm-up."
        )


def _unit(r: RankSummary) -> str:
    return "iteration" if r.window == "iterations" else "step"


def one_step(r: RankSummary, per_step: Sequence[float]) -> OneStep | None:
    """The step that carries most of a cost (``per_step``: its ms in each of ``r.steps``), where one of three or
    more does; otherwise None. A finding that reads the cost's mean says so and does not warn on it."""
    if len(per_step) < 3 or len(per_step) != len(r.steps):
        return None
    top = max(range(len(per_step)), key=per_step.__getitem__)
    others = statistics.median(v for i, v in enumerate(per_step) if i != top)
    if per_step[top] <= 0 or per_step[top] < ONE_STEP_SHARE * sum(per_step) or others > ONE_STEP_OTHERS_FRACTION * per_step[top]:
        return None
    return OneStep(
        step=r.steps[top].step, ms=per_step[top], fraction=per_step[top] / sum(per_step), others_ms=others,
        others=len(per_step) - 1,
    )


def per_step_cost(r: RankSummary, causes: Sequence[IdleCause], phase: str | None = None) -> list[float]:
    """A cost's ms in each step: on a device the idle time of ``causes``, on a CPU-only trace the host ``phase``."""
    if r.idle is None:
        return [s.phases.get(phase) if phase is not None else 0.0 for s in r.steps]
    return [sum(s.idle_ms.get(c, 0.0) for c in causes) for s in r.steps]


def claimed_causes(r: RankSummary) -> set[IdleCause]:
    """The idle causes of ``r`` that are large enough for a finding of their own."""
    if r.idle is None:
        return set()
    return {c.cause for c in r.idle.causes if c.cause in OWN_FINDING_CAUSES and share(r, c.ms_per_step) >= REPORT_FRACTION}


def idle_text(r: RankSummary, limit: int = 4) -> str:
    """The device's idle time by cause, largest first, in words."""
    if r.idle is None or not r.idle.causes:
        return ""
    parts = []
    n = max(len(r.steps), 1)
    for c in [c for c in r.idle.causes if c.ms_per_step >= SHOWN_MS][:limit]:
        by = "launched by " if c.cause == "queued" else ""  # the waiting work's launching calls, not host time
        shown = ms_list((o.name[:60], o.total_ms / n) for o in c.top)
        parts.append(f"{c.ms_per_step:.1f} ms {c.label}" + (f" ({by}{shown})" if shown else ""))
    return f"The device idles {r.idle.idle_ms_per_step:.1f} ms per {step_word(r)} on rank {r.rank}: " + "; ".join(parts) + "."


def make_finding(
    code: str, r: RankSummary, saving_ms: float, *, title: str, evidence: str, fix: str, ranks: list[int],
    severity: str | None = None, cause_ms: float | None = None, one_off: OneStep | None = None, floor: str | None = None,
) -> Finding:
    """A finding whose evidence ends with its bound, as a warning when its named cause (``cause_ms``, by default
    the bound itself) explains at least WARNING_FRACTION of the step: the one rule every finding follows.

    Where the trace shows only part of what the fix removes, ``floor`` says what it leaves out, and the bound is what
    the fix saves at least. A device trace without ProfilerStep and without repeating iterations claims no saving: its one window may be
    mostly one-off work (initialisation, warm-up) that no step of a longer run pays for. A cause one step carries
    (``one_off``) is said, and is an info line: the mean the finding reads is that step's.
    """
    bound = ""
    if r.window == "device_span":
        saving_ms, severity = 0.0, "info"
        bound = (
            " No saving is claimed: the trace has no ProfilerStep and no repeating iteration, so its idle time may be "
            "one-off work; profile a few steps with a schedule to measure what a step loses."
        )
    fraction = share(r, saving_ms)
    cause_fraction = fraction if cause_ms is None or r.window == "device_span" else share(r, cause_ms)
    floor = floor if r.window != "device_span" else None
    if saving_ms > 0:
        bound = (
            f" Fixing it saves {'at least' if floor else 'at most'} {saving_ms:.1f} ms ({fraction:.0%}) of the "
            f"{r.mean_step_ms or 0:.1f} ms {step_word(r)} on rank {r.rank}" + (f", and {floor}." if floor else ".")
        )
    if one_off is not None:
        evidence += one_off.sentence(r)
        severity = severity or "info"
    return Finding(
        code=code,  # type: ignore[arg-type]
        severity=severity or ("warning" if cause_fraction >= WARNING_FRACTION else "info"),  # type: ignore[arg-type]
        title=title,
        evidence=evidence + bound,
        fix=fix,
        ranks=ranks,
        max_saving_ms=saving_ms,
        max_saving_fraction=fraction,
        saving_floor=floor is not None,
    )


def verdict(summary: Summary) -> str:
    """The analysis in one line, said the same way by the CLI, the report and the MCP answer: the largest warning
    and its bound, or that nothing warns (an agent, like a reader, should hear "nothing to fix" in words), or that
    no trace could be read (no rank analysed is no evidence of health)."""
    findings = summary.findings
    warnings = [f for f in findings if f.severity == "warning"]
    infos = len(findings) - len(warnings)
    info_lines = f"{infos} info line{'' if infos == 1 else 's'}"
    if not summary.ranks:
        return "No verdict: no trace could be analysed."
    if not findings:
        return "No findings: nothing in these steps crosses a threshold."
    if not warnings:
        return (
            f"No warning: {info_lines}, none worth a change on its own (a warning needs one named cause worth at "
            f"least {WARNING_FRACTION:.0%} of the step)."
        )
    top = max(warnings, key=lambda f: f.max_saving_ms)
    # The fraction is of the step the finding's bound was measured on: an iteration where the trace has no ProfilerStep.
    measured_on = next((r for r in summary.ranks if top.ranks and r.rank == top.ranks[0]), None)
    step = step_word(measured_on) if measured_on is not None else "step"
    bound = (
        f": fixing it saves {'at least' if top.saving_floor else 'at most'} {top.max_saving_ms:.1f} ms, "
        f"{top.max_saving_fraction:.0%} of the {step}"
        if top.max_saving_ms > 0
        else ""
    )
    counted = f"{len(warnings)} warning{'' if len(warnings) == 1 else 's'}" + (f" and {info_lines}" if infos else "")
    return f"{counted}; the largest: {top.title}{bound}."


def ms_list(rows: Iterable[tuple[str, float]], limit: int = 3) -> str:
    """"a 1.2 ms, b 0.3 ms": the first ``limit`` (name, ms per step) rows, less those that round to 0.0 ms."""
    return ", ".join(f"{name} {ms:.1f} ms" for name, ms in list(rows)[:limit] if ms >= SHOWN_MS)
