"""The analysis' results as pydantic models; ``Summary`` is the manifest's ``summary`` section."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.loops import Loop
from orchestrator.models.accelerator import Accelerator
from orchestrator.models.anomaly import AnomalyChecks
from orchestrator.models.gc_pauses import GcPauses
from orchestrator.models.generation import Generation
from orchestrator.models.idle import IDLE_CAUSES, IDLE_LABELS, IdleAttribution, IdleCause, IdleShare, OpStat
from orchestrator.models.merge_stats import RejectedTrace
from orchestrator.models.pace import StepsBefore
from orchestrator.models.param_loops import ParamLoop
from orchestrator.models.recompute import Recompute
from orchestrator.models.thread_time import ThreadTime
from orchestrator.models.verdicts import Finding, SlowGroup, StepSpread

__all__ = [
    "PHASES", "BackwardPasses", "Finding", "CopyStats", "COLLECTIVE_LABELS", "CollectiveKind", "GpuStats",
    "IDLE_CAUSES", "IDLE_LABELS", "IdleAttribution", "IdleCause", "IdleShare", "MemoryPeak", "OpStat",
    "OptimizerImpl", "Phase", "PhaseTimes", "ProcessGroupComm", "RankSummary", "SlowGroup", "StepBreakdown",
    "StepSpread", "Straggler", "Summary",
]

SUMMARY_VERSION: Final = 1

Phase = Literal["data", "forward", "backward", "optimizer", "comm", "memcpy", "sync", "other"]
PHASES: tuple[Phase, ...] = ("data", "forward", "backward", "optimizer", "comm", "memcpy", "sync", "other")

# Which collective a collective kernel runs: the fix for exposed communication depends on it.
CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "other"]
COLLECTIVE_LABELS: dict[CollectiveKind, str] = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send_recv": "send/recv",
    "broadcast": "broadcast",
    "other": "unnamed",
}

# How an optimizer step updates the parameters, from the ops it runs (torch's fused kernels, its foreach ops, or neither).
OptimizerImpl = Literal["fused", "foreach", "per_parameter"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PhaseTimes(_Model):
    """Milliseconds of main-thread time per phase; the fields add up to the step time."""

    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    comm: float = 0.0
    memcpy: float = 0.0
    sync: float = 0.0
    other: float = 0.0

    def get(self, phase: Phase) -> float:
        """Milliseconds of ``phase``."""
        return float(getattr(self, phase))

    def total(self) -> float:
        """Sum over all phases."""
        return sum(self.get(p) for p in PHASES)


class BackwardPasses(_Model):
    """One step's backward passes and the gradient reductions they start: DDP's all-reduces, FSDP's reduce-scatters."""

    passes: int = Field(description="Backward passes outside any optimizer step (a closure's are the step's own).")
    reducing: int = Field(description="Of them, the passes that start an all-reduce or a reduce-scatter.")
    early: int = Field(
        description="Reducing passes followed by another reducing pass before any optimizer step: they reduced "
        "gradients the next micro-batch adds to before anything reads them (accumulation without no_sync())."
    )


class StepBreakdown(_Model):
    """One ``ProfilerStep#N`` on one rank."""

    step: int
    start_unix_us: float = Field(
        description="Step start on the merged trace's clock (the earliest rank's wall clock, the other ranks aligned "
        "on the collectives they share), comparable across ranks."
    )
    duration_ms: float
    phases: PhaseTimes
    between_ms: float = Field(
        default=0.0,
        description="Of phases.other: the time before the step fetched its batch, running none of the step's own "
        "phases (work the loop does between steps: a checkpoint save, an evaluation, logging). 0 where the step "
        "fetched no batch through a DataLoader or Ray Data.",
    )
    between_ops_ms: float | None = Field(
        default=None,
        description="Of between_ms, the time the main thread ran torch ops; the rest is Python and I/O (a "
        "checkpoint save writing its files). None in a summary from before it was measured.",
    )
    between_fetches: int = Field(
        default=0, description="DataLoader fetches within between_ms (batches an evaluation runs the model on)."
    )
    between_seeds: int | None = Field(
        default=None,
        description="Seed draws (aten::random_) within between_ms: a new DataLoader iterator draws one (and a "
        "RandomSampler at each epoch). None in a summary from before they were counted.",
    )
    between_samples: int = Field(default=0, description="The agent's stack samples taken before the step's batch.")
    between_frames: list[OpStat] = Field(
        default_factory=list,
        description="The hot path of between_samples (outermost first, each frame held by at least half of them, its "
        "samples as calls), from the first frame no other sample of the window holds: what that work runs. Empty "
        "without samples.",
    )
    sync_calls: int = 0
    copy_calls: int = 0
    anomaly: AnomalyChecks | None = Field(default=None, description="None where backward ran no NaN check.")
    backward: BackwardPasses | None = Field(default=None, description="None in a summary from before they were counted.")
    report_ms: float = Field(
        default=0.0,
        description="Time the main thread spent in Ray Train's report() (with_stack frames or the agent's stack "
        "samples; orchestrator.analysis.untraced), running no op: in Ray Train 2 a barrier of all workers.",
    )
    python_ms: float = Field(
        default=0.0,
        description="Of phases.other, from the step's batch on: the main thread running Python of the loop's own "
        "outside torch (a sample none of whose frames is torch's), running no op; stack samples only.",
    )
    compile_ms: float = Field(default=0.0, description="The main thread's time in torch.compile's compiler (its "
                              "'(dynamo_timed)' regions): Dynamo tracing, Inductor generating and building code.")
    gpu_busy_ms: float | None = None
    kernel_ms: float | None = None
    comm_kernel_ms: float | None = None
    comm_exposed_ms: float | None = Field(default=None, description="Comm kernel time not overlapped by compute kernels.")
    idle_ms: dict[IdleCause, float] = Field(
        default_factory=dict, description="Device idle time in this step by what the host was doing (causes with time only)."
    )
    group_comm_ms: dict[str, float] = Field(
        default_factory=dict,
        description="Collective kernel time in this step by process group name (RankSummary.process_groups): "
        "the wait for the group's last member plus the transfer. Device traces whose kernels name their group only.",
    )


class ProcessGroupComm(_Model):
    """One process group this rank's collective kernels ran in (PyTorch 2.2+ writes it on each kernel)."""

    name: str = Field(description="The group's name, the same on every member (its member list where the trace has none).")
    description: str = Field(description="The group's description ('default_pg', 'mesh_tp', ...), '' when unnamed.")
    size: int
    calls_per_step: float
    elements_per_step: float = Field(description="Elements sent per step (the collectives' input sizes).")


class GpuStats(_Model):
    """Device-side totals over the analysed windows, when the trace has device activity."""

    utilization: float = Field(description="Busy fraction of step time (kernels, copies, memsets).")
    busy_ms_per_step: float
    idle_ms_per_step: float = Field(description="Step time with no device work: what host-side fixes can win back at most.")
    kernel_ms_per_step: float
    comm_kernel_ms_per_step: float
    comm_exposed_ms_per_step: float
    active_span_ms: float = Field(description="First to last device event of the analysed windows.")
    active_busy_share: float = Field(description="Busy share of the active span (1 - HTA's idle_time).")
    active_compute_share: float = Field(description="Compute-kernel share of the active span (HTA's compute_time).")
    comm_overlap: float | None = Field(description="Fraction of comm kernel time overlapped by compute kernels.")
    comm_by_collective: dict[CollectiveKind, float] = Field(
        default_factory=dict,
        description="Collective kernel ms per step by the collective each runs, largest first (summed: groups' kernels may overlap).",
    )
    comm_exposed_by_collective: dict[CollectiveKind, float] = Field(
        default_factory=dict,
        description="Per step, each collective's kernel time no compute kernel overlaps (its kernels' union less compute), "
        "largest first: the communication a fix can win back. Kinds running at once each count their own.",
    )


class CopyStats(_Model):
    """Device copies of one direction and host memory kind, per analysed window."""

    direction: Literal["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other"]
    host_memory: Literal["pageable", "pinned"] | None = Field(description="Host side of an HtoD/DtoH copy, when named.")
    calls_per_step: float
    device_ms_per_step: float
    host_blocked_ms_per_step: float = Field(description="Main-thread time inside the runtime calls that started them.")
    issued_by: list[OpStat] = Field(
        default_factory=list,
        description="Who issues them: the record_function region and op around the call ('MASK INDICES / aten::to'), "
        "with the copies' device time, summed over the steps.",
    )


class MemoryPeak(_Model):
    """Peak of ``[memory]`` "Total Allocated" on one device during the window."""

    device: str
    peak_bytes: int
    capacity_bytes: int | None = None


class RankSummary(_Model):
    """Everything computed from one rank's trace alone."""

    rank: int
    host: str | None
    file: str
    device: Literal["cpu", "cuda", "rocm", "mtia", "xpu"]
    accelerator: Accelerator | None = Field(default=None, description="The device model the trace names, if one.")
    unrecorded_device: Literal["cuda", "rocm", "xpu"] | None = Field(
        default=None, description="device cpu: the GPU runtime whose calls the trace holds without any device activity."
    )
    window: Literal["profiler_steps", "iterations", "device_span", "whole_trace"] = Field(
        default="profiler_steps",
        description="No ProfilerStep#N spans: iterations (the device's active span cut where a top-level pattern of "
        "the main thread repeats), device_span (the device's active span as one window, step 0), whole_trace "
        "(no device: the main thread's span, step 0).",
    )
    steps: list[StepBreakdown]
    mean_step_ms: float | None
    median_step_ms: float | None
    mean_phases: PhaseTimes
    comm_wait_ms: float = Field(description="Mean per step of time this rank waited in collectives.")
    waits_for_others_ms: float = Field(
        default=0.0,
        description="Cross-rank: on a rank that waits for late arrivers, its median extra wait per step over the "
        "least-waiting rank (in collectives, or syncs on them); 0 elsewhere.",
    )
    ray_train: Literal[1, 2] | None = Field(
        default=None, description="Which Ray Train the job's report() calls ran in, by their frames (None: none seen)."
    )
    data_loader: str | None = Field(
        default=None,
        description="DataLoader iterator class seen in the trace, or 'ray.data.DataIterator' where the batches come "
        "from Ray Data's iterator (its frames or the agent's stack samples say so).",
    )
    ddp: bool = Field(default=False, description="DDP's forward ran: its all-reduce runs in buckets during backward.")
    grad_scaler: bool = Field(default=False, description="torch.amp.GradScaler ran (aten::_amp_update_scale_).")
    comm_ops: list[OpStat] = Field(default_factory=list, description="Outermost collective spans on the main thread "
                                   "but optimizer_comm's, by name (FSDP's module suffix removed), over the steps.")
    own_comm: OpStat | None = Field(
        default=None,
        description="The main thread's collective calls outside forward and backward, and barriers with the all-reduce "
        "right after each anywhere (the job's own: metrics, a logged loss, Lightning's sync_dist), their count over the "
        "steps, and total_ms: the main thread's waits those calls begin, per step.",
    )
    optimizer_comm: OpStat | None = Field(default=None, description="The collective calls the optimizer's step makes "
        "itself (ZeroRedundancyOptimizer's broadcasts), their count over the steps and their cost per step, as own_comm's.")
    own_comm_callers: list[OpStat] = Field(
        default_factory=list,
        description="The innermost frame of the user's or a library's code around the main thread's waits in own_comm "
        "(a with_stack trace's, else the agent's stack samples'), with their time, most time first.",
    )
    zero_stage: int | None = Field(
        default=None, ge=0, le=3, description="The ZeRO stage of a DeepSpeed engine, from the frames of its gradients' "
        "reduction (orchestrator.analysis.zero_stage); None where none tell.",
    )
    zero_bf16_optimizer: bool = Field(
        default=False, description="A DeepSpeed engine reduces through BF16_Optimizer (bf16 weights, fp32 gradient "
        "accumulation): after backward, whatever its buckets.",
    )
    regathers_per_step: float = Field(default=0.0, description="FSDP2: all-gathers per step of a unit already gathered "
                                      "in that step (resharded after forward, gathered again for backward).")
    sync_ops: list[OpStat] = Field(
        default_factory=list,
        description="Outermost sync calls on the main thread, as 'region / op' where a record_function region or an "
        "optimizer step holds them.",
    )
    sync_callers: list[OpStat] = Field(
        default_factory=list,
        description="with_stack traces: the innermost frame of the user's or a library's code around each sync.",
    )
    data_frames: list[OpStat] = Field(
        default_factory=list,
        description="with_stack traces: the hot path inside DataLoader next(), outermost first: at each level the "
        "frame of the user's or a library's code with most time (counting its callees) while it holds half the loading.",
    )
    data_callers: list[OpStat] = Field(
        default_factory=list,
        description="with_stack traces: the innermost frames around DataLoader next() (who iterates the loader: a "
        "transformers Trainer or pipeline, the user's loop), most time first, innermost first where equal.",
    )
    python_samples: int = Field(
        default=0, description="The agent's stack samples taken where the steps ran the loop's own Python (python_ms)."
    )
    python_frames: list[OpStat] = Field(
        default_factory=list,
        description="The hot path of python_samples (outermost first, each function held by at least half of them, "
        "its samples as calls), from the first frame no other sample of the window holds. Empty without samples.",
    )
    gpu: GpuStats | None = None
    idle: IdleAttribution | None = Field(default=None, description="Device idle time per step by cause (device traces).")
    copies: list[CopyStats] = Field(default_factory=list)
    top_ops: list[OpStat] = Field(default_factory=list)
    top_kernels: list[OpStat] = Field(default_factory=list)
    memory: list[MemoryPeak] = Field(default_factory=list)
    recompute: Recompute | None = Field(default=None, description="Forward's ops backward runs again; None for none.")
    param_loop: ParamLoop | None = Field(default=None, description="A loop over tensors outside model and optimizer.")
    generation: Generation | None = Field(
        default=None, description="The steps' own rollouts (transformers' generate, SB3's collect_rollouts); None for none."
    )
    step_definition: str | None = Field(
        default=None,
        description="What one step holds in the trace: '1 step = SGD.step ×1 + Adam.step ×1; 4 forward passes "
        "(Discriminator ×3, Generator ×1)' (None: no optimizer step nor forward marker).",
    )
    loop: Loop | None = Field(
        default=None,
        description="The framework whose training loop the job runs, as the agent wrote it into the trace or a "
        "with_stack trace's frames show it (None: the job's own loop, or not known): the fixes name its settings.",
    )
    thread_time: ThreadTime | None = Field(
        default=None, description="The training thread's CPU time over the window, as the agent wrote it (None: not written)."
    )
    steps_before: StepsBefore | None = Field(
        default=None,
        description="The rank's step time just before the window, as the agent measured it (None: not written).",
    )
    gc: GcPauses | None = Field(
        default=None,
        description="The process's garbage collections over the window, as the agent timed them, on the merged trace's "
        "clock: the longest (gc_finding.SUMMARY_COLLECTIONS; truncated says the trace holds more; None: not timed).",
    )
    issues: list[str] = Field(default_factory=list)
    process_groups: list[ProcessGroupComm] = Field(
        default_factory=list, description="Process groups of the collective kernels (device traces that name them)."
    )
    optimizers: list[str] = Field(
        default_factory=list,
        description="The optimizer classes stepped in the analysed steps ('Adam' of Optimizer.step#Adam.step), wrapped "
        "ones included, in the order of their first step.",
    )
    optimizer_impl: OptimizerImpl | None = Field(
        default=None,
        description="How the optimizer steps update the parameters: torch's fused kernels (aten::_fused_adam_), its "
        "foreach ops, or neither (per parameter, or an optimizer of its own); None where no optimizer step ran.",
    )
    optimizer_ops: float = Field(
        default=0.0,
        description="CPU-only traces (0 elsewhere): mean per step of the ops the optimizer (step, zero_grad) runs at its "
        "own top level: several per parameter for a per-parameter optimizer, a few in all for a foreach or fused one.",
    )
    data_ops: float = Field(
        default=0.0,
        description="Mean per step of the ops DataLoader next() runs at its own top level on the main thread where it "
        "stacks samples it fetched one by one (default_collate), one or more per sample; 0 where it stacks none.",
    )


class Straggler(_Model):
    """A rank that holds the others back, and where it spends the extra time."""

    rank: int
    cause: Literal["busy", "late_arrival"] = Field(
        default="busy", description="busy: works longer each step; late_arrival: starts its steps late."
    )
    excess_ms: float = Field(description="Extra busy (non-waiting) time per step versus the reference ranks.")
    excess_fraction: float = Field(description="excess_ms over the median step time.")
    phase: Phase
    phase_excess_ms: float
    comm_wait_ms: float
    reference_comm_wait_ms: float


class Summary(_Model):
    """The analysis of one profile: per-rank, cross-rank, and findings."""

    version: Literal[1] = SUMMARY_VERSION
    source: str
    world_size: int | None
    steps: list[int] = Field(description="Step numbers present on every analysed rank.")
    step_definition: str | None = Field(
        default=None, description="What one step holds, as most ranks' traces show it (RankSummary.step_definition)."
    )
    loop: Loop | None = Field(default=None, description="Whose training loop most ranks run (RankSummary.loop).")
    ranks: list[RankSummary]
    rejected: list[RejectedTrace] = Field(default_factory=list)
    caution: str | None = Field(
        default=None,
        description="What qualifies every figure after it: the profiler slowed the steps it recorded, against the "
        "steps just before the window (orchestrator/analysis/profiler_cost.py); None where it did not, or nobody measured.",
    )
    issues: list[str] = Field(
        default_factory=list,
        description="Notes: what the analysis could not do (a trace it could not read, clocks it could not align), and "
        "what the window holds that no finding says (one step analysed, a step that saves or evaluates before its batch).",
    )
    step_spread: StepSpread | None = None
    stragglers: list[Straggler] = Field(default_factory=list)
    slow_groups: list[SlowGroup] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
