"""A Python loop over the parameters outside the model and torch's optimizers: a weights' average (EMA), or a
framework's own optimizer, updated one tensor at a time, told with the option that updates them all at once.

Training loops keep an exponential moving average of the weights (diffusion models, vision models, self-supervised
teachers) through a library's helper, and several helpers update one parameter at a time unless told otherwise:
diffusers' ``EMAModel`` (``foreach=False`` by default: ``s_param.sub_(one_minus_decay * (s_param - param))``, three
ops a parameter), torch's ``AveragedModel`` given an ``avg_fn`` (and without ``multi_avg_fn`` on a CPU; Lightning's
``WeightAveraging`` callback builds one, and its own example passes ``avg_fn=get_ema_avg_fn()``), timm's
``ModelEma`` / ``ModelEmaV2``. Each iteration is a few small ops and their Python, so the loop costs in proportion to
the tensor count, not their size: on a GPU it is launch-bound host time the device idles through. A trace shows
it as the same few ops again and again, one tensor after another (``aten::sub, aten::mul, aten::sub_`` × 66), where
no module, backward node or torch.optim step is open: after the step's last backward pass, or before it fetches its
batch (rayprof's agent ends a step when the optimizer's does, so an update after ``optimizer.step()`` opens the
next). Before its first backward pass the loop would be the model's own forward, unmarked (a stack of identical
blocks repeats too), so that stretch is read only in a step that fetches no batch (tensors already in memory: the
agent's step, which ends in the optimizer's post-hook, then opens with the update), and a loop found there counts
only where the stacks over it name a known helper (below), which no forward calls. The loop's arithmetic makes it an update: a run of views and
detaches alone (``AveragedModel`` sorting its tensors by device before one foreach update) is bookkeeping. An
iteration may branch per tensor: fastai's own optimizers (its ``Learner`` steps no torch optimizer) run their update
functions on one parameter after another, and its Adam decays the weights but not the biases and norm parameters, so
an iteration is nine ops on some tensors and eight on the others (up to :data:`MAX_FORMS` forms are one loop; where
they alternate in an order that repeats within :data:`MAX_PERIOD` ops, the loop reads as one of their concatenation).

The stack samples (or ``with_stack`` frames) say whose loop it is, and so which option removes it; a loop of the
user's own gets ``torch._foreach_*``. A loop in torch's own code other than ``AveragedModel`` (``clip_grad_norm_`` on
a CPU, which has no foreach kernels) or in another library's has no option to name and is not told. Where no stack names
the loop (a trace from another tool without ``with_stack``), it is not told either: DeepSpeed's ZeRO bookkeeping
loops over its gradients the same way. Recorded on a CPU MLP of 66 parameter tensors (``tests/data/record_cpu_ema.py``):
diffusers' loop 3.2 ms of a 41.5 ms step, ``AveragedModel(avg_fn=...)``'s 7.0 of 47.8 ms, Lightning's 4.6 of 33.1 ms,
the user's own ``mul_``/``add_`` loop 1.4 of 28.1 ms, fastai's Adam 5.9-8.9 ms of a 49-81 ms step
(``tests/data/record_cpu_fastai.py``); the same loops with foreach ops, and fastai given torch's fused AdamW through its
``OptimWrapper``, are not told.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from orchestrator.analysis.finding_base import make_finding, one_step, ranks_text, step_word
from orchestrator.analysis.intervals import Intervals, clip, subtract, union
from orchestrator.analysis.phases import backward_passes, batch_fetch, top_level
from orchestrator.analysis.python_frames import frame_label, frame_parts, is_users
from orchestrator.analysis.untraced import Timeline
from orchestrator.models.analysis import Finding, RankSummary, StepBreakdown, Straggler
from orchestrator.models.param_loops import ParamLoop
from orchestrator.traces.loader import Span

__all__ = ["LOOP_REGION", "MAX_FORMS", "MAX_PERIOD", "MIN_ITERATIONS", "OWNERS", "loop_of", "optimizer_phase", "owner_fix", "param_loop", "with_loop"]

# A loop of this many iterations or more, of at most this many ops each, in most steps, is told.
MIN_ITERATIONS = 16
MAX_PERIOD = 12
# The name of a told loop's stretches among a thread's regions (with_loop), its owner after it.
LOOP_REGION = "loop over tensors in "
# An iteration in at most this many forms: one branch per tensor (a weight decay some tensors skip).
MAX_FORMS = 2
# Longer than this between two of its ops and the loop has ended (its Python per iteration is tens of µs).
_MAX_GAP_US = 1000.0
# Arithmetic that updates a tensor: one of these in an iteration makes a loop an update, not bookkeeping.
_ARITHMETIC = re.compile(
    r"^aten::(add|sub|mul|div|lerp|addcmul|addcdiv|copy|pow|sqrt|neg|clamp|clamp_min|clamp_max|zero|fill|maximum|minimum)_?$"
)

class Helper(NamedTuple):
    """A library's function that loops over tensors one at a time: what its loop updates, the change that updates
    them all at once, and whether it is the job's optimizer (whose time is the step's optimizer phase)."""

    title: str
    fix: str
    optimizer: bool = False


_AVERAGE = "The weights' average is updated one tensor at a time"
# fastai's Adam is AdamW with its own defaults: torch's fused AdamW given them does the same math.
_FASTAI = Helper(
    "fastai's own optimizer updates the parameters one tensor at a time",
    "a torch optimizer through fastai's OptimWrapper, Learner(..., opt_func=partial(OptimWrapper, opt=torch.optim.AdamW, "
    "fused=True, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)), which is fastai's default Adam in one kernel per "
    "parameter group (torch.optim.SGD(fused=True) for its SGD, foreach=True for RMSprop and RAdam): fastai's own "
    "optimizers run their update functions on one parameter after another in Python (OptimWrapper decays every "
    "parameter; fastai's own skips biases and norm layers)",
    optimizer=True,
)
_NONE = Helper("", "")  # no known helper
# The helpers that loop over tensors one at a time: (file, function) -> what they update and the change.
OWNERS: dict[tuple[str, str], Helper] = {
    ("torch/optim/swa_utils.py", "AveragedModel.update_parameters"): Helper(_AVERAGE, (
        "AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay)) from torch.optim.swa_utils "
        "(get_swa_multi_avg_fn() for an equal average) in place of avg_fn=get_ema_avg_fn(decay): one foreach update "
        "per device and dtype; given an avg_fn, or on a CPU without multi_avg_fn, it updates one tensor at a time"
    )),
    # Lightning's callback, around AveragedModel: its keyword arguments are the user's setting (found first: outer).
    **dict.fromkeys(
        [(f"{package}/callbacks/weight_averaging.py", "WeightAveraging.on_train_batch_end") for package in ("lightning/pytorch", "pytorch_lightning")],
        Helper(_AVERAGE, (
            "WeightAveraging(multi_avg_fn=get_ema_multi_avg_fn(decay)) (its keyword arguments go to torch's "
            "AveragedModel) in place of avg_fn=get_ema_avg_fn(...), which Lightning's own example passes: given an "
            "avg_fn, AveragedModel updates one tensor at a time on any device"
        )),
    ),
    ("diffusers/training_utils.py", "EMAModel.step"): Helper(_AVERAGE, (
        "EMAModel(model.parameters(), foreach=True): diffusers' EMAModel updates one parameter at a time unless told"
    )),
    **dict.fromkeys(
        [("timm/utils/model_ema.py", "ModelEma.update"), ("timm/utils/model_ema.py", "ModelEmaV2._update")],
        Helper(_AVERAGE, "timm.utils.ModelEmaV3(model, decay=...), which updates all tensors in foreach ops"),
    ),
    **dict.fromkeys(
        [("timm/utils/model_ema.py", "ModelEmaV3.apply_update_"), ("timm/utils/model_ema.py", "ModelEmaV3.apply_update_no_buffers_")],
        Helper(_AVERAGE, "ModelEmaV3(model, decay=..., foreach=True) (its default)"),
    ),
    **dict.fromkeys([("fastai/optimizer.py", "Optimizer.step"), ("fastai/optimizer.py", "Optimizer.zero_grad")], _FASTAI),
}
_USERS_FIX = (
    "one torch._foreach_* call over the lists in place of the loop (torch._foreach_lerp_(averages, params, 1 - decay) "
    "for a weights' average, torch._foreach_mul_ / torch._foreach_add_ for other updates), or torch.compile the function"
)


def owner_fix(owner: str | None) -> str | None:
    """The change that replaces the loop of ``owner`` (a frame name): a known helper's option, ``torch._foreach_*``
    for the user's own code (a script's file: no package folder under the import path); None for torch's other code,
    another library's (DeepSpeed's gradient bookkeeping: its own settings are its fix) or a loop no stack names."""
    parts = frame_parts(owner) if owner else None
    if owner is None or parts is None:
        return None
    if parts in OWNERS:
        return OWNERS[parts].fix
    return _USERS_FIX if is_users(owner) and (parts[0].startswith("/") or "/" not in parts[0]) else None


def loop_of(
    main: list[Span], windows: Sequence[tuple[float, float]], backward: Intervals, optimizer: Intervals,
    data: Intervals, op_starts: Sequence[float], frames: Sequence[Span], timeline: Timeline | None,
) -> ParamLoop | None:
    """The loop (:data:`MAX_PERIOD` ops an iteration at most) outside the model and the optimizer that most steps
    run :data:`MIN_ITERATIONS` times or more, with each step's iterations and time; else None."""
    found: list[dict[_Period, _Run]] = []
    ahead: list[dict[_Period, _Run]] = []  # before the first backward pass of a step that fetches no batch
    outside = union([*optimizer, *data])
    for t0, t1 in windows:
        passes = backward_passes(clip(backward, t0, t1), op_starts)
        fetch = batch_fetch(t0, t1, passes, data, op_starts) if passes else None
        region = ([(t0, fetch)] if fetch is not None and fetch > t0 else []) + ([(passes[-1][1], t1)] if passes else [])
        found.append(_loops(list(top_level(main, subtract(union(region), outside)))))
        ahead.append(_loops(list(top_level(main, subtract([(t0, passes[0][0])], outside)))) if passes and fetch is None else {})
    # There the model's unmarked forward runs, or an update that opens the agent's step (it ends in the optimizer's
    # post-hook): an update only where the stacks over it name a known helper, which no forward calls.
    counts = Counter(p for runs in ahead for p in runs)
    for period in [p for p, n in counts.items() if n * 2 > len(windows)]:  # only a loop most steps run can be told
        spans = [iv for runs in ahead if period in runs for iv in runs[period].spans]
        if frame_parts(_owner(spans, frames, timeline) or "") in OWNERS:
            for runs, more in zip(found, ahead):
                if period in more:
                    runs[period] = _Run(more[period].ops, 0, 0.0, []).add(runs.get(period)).add(more[period])
    tops = [max(runs, key=lambda p: runs[p].ms) for runs in found if runs]
    if len(tops) * 2 <= len(windows):
        return None
    period = Counter(tops).most_common(1)[0][0]
    runs = [f[period] for f in found if period in f]
    return ParamLoop(
        ops=list(Counter(r.ops for r in runs).most_common(1)[0][0]),
        iterations=[f[period].iterations if period in f else 0 for f in found],
        ms=[f[period].ms if period in f else 0.0 for f in found],
        owner=_owner([iv for r in runs for iv in r.spans], frames, timeline),
        stretches=sorted(iv for r in runs for iv in r.spans),
    )


def optimizer_phase(steps: list[StepBreakdown], loop: ParamLoop | None) -> list[StepBreakdown]:
    """``steps`` with the loop of a framework's own optimizer (fastai's, which no ``Optimizer.step`` span marks) in
    their optimizer phase, out of "other", each step's at most its "other"."""
    if loop is None or not OWNERS.get(frame_parts(loop.owner or "") or ("", ""), _NONE).optimizer:
        return steps
    moved = [min(ms, s.phases.other) for s, ms in zip(steps, loop.ms)]
    return [
        s.model_copy(update={"phases": s.phases.model_copy(update={"optimizer": s.phases.optimizer + ms, "other": s.phases.other - ms})})
        for s, ms in zip(steps, moved)
    ]


def with_loop(regions: list[Span], loop: ParamLoop | None) -> list[Span]:
    """``regions`` (sorted by start, then longest first) with a told loop's stretches as regions of their own: the
    device idle time in them is the param_loop finding's, not the device idle finding's model ops or launch pace
    (on a GPU each of the loop's ops launches a kernel shorter than its host time)."""
    if loop is None or loop.owner is None or owner_fix(loop.owner) is None:
        return regions
    name = LOOP_REGION + frame_label(loop.owner)
    spans = [Span(a, b, name, "user_annotation", None, None) for a, b in loop.stretches]
    return sorted([*regions, *spans], key=lambda s: (s.ts, -s.end))


_Period = tuple[str, ...]  # an iteration's ops, from the rotation that sorts first: one loop entered anywhere


@dataclass
class _Run:
    ops: _Period  # as the loop runs them
    iterations: int
    ms: float
    spans: Intervals

    def add(self, other: _Run | None) -> _Run:
        """This run with ``other``'s iterations, time and stretches (one loop's, found in two parts of a step)."""
        if other is not None:
            self.iterations, self.ms, self.spans = self.iterations + other.iterations, self.ms + other.ms, self.spans + other.spans
        return self


def _loops(ops: list[Span]) -> dict[_Period, _Run]:
    """The stretches of ``ops`` (in order) that repeat an iteration of at most :data:`MAX_PERIOD` names
    :data:`MIN_ITERATIONS` times or more, with arithmetic in it, by period; the longest first where two overlap
    (a period of three also repeats every six ops), a pause in a loop making two stretches of one. An iteration
    takes one form, or up to :data:`MAX_FORMS` where the loop branches per tensor (fastai's optimizer decays the
    weights and not the biases: one op more on some tensors), found as the ops between two of one op's calls."""
    names = [s.name for s in ops]
    # (-duration, a loop of one form first, its length, first op, iterations, ops past its end, its main form)
    found: list[tuple[float, int, int, int, int, int, _Period]] = []
    for k in range(1, MAX_PERIOD + 1):
        i = 0
        while i + k < len(ops):
            j = i + k  # extend while each op repeats the one a period before, with no long pause
            while j < len(ops) and names[j] == names[j - k] and ops[j].ts - ops[j - 1].end <= _MAX_GAP_US:
                j += 1
            n = (j - i) // k
            if n >= MIN_ITERATIONS and any(_ARITHMETIC.match(x) for x in names[i:i + k]):
                found.append((ops[i].ts - ops[i + n * k - 1].end, 0, k, i, n, i + n * k, tuple(names[i:i + k])))
            i = max(j - k + 1, i + 1)
    found += _branching(ops, names)
    taken: list[tuple[int, int]] = []
    out: dict[_Period, _Run] = {}
    for _, _, _, i, n, end, as_run in sorted(found):
        if any(a < end and i < b for a, b in taken):
            continue
        taken.append((i, end))
        k = len(as_run)
        period = min(as_run[r:] + as_run[:r] for r in range(k))
        span = (ops[i].ts, ops[end - 1].end)
        out[period] = out.get(period, _Run(as_run, 0, 0.0, [])).add(_Run(as_run, n, (span[1] - span[0]) / 1000, [span]))
    return out


def _branching(ops: list[Span], names: list[str]) -> list[tuple[float, int, int, int, int, int, _Period]]:
    """The loops whose iterations take 2 to :data:`MAX_FORMS` forms: for each op name, the runs of iterations that
    end at its calls (the ops after one call up to the next, :data:`MAX_PERIOD` at most, no long pause), the
    iteration before the first call taken in where it has one of the run's forms. A branch is one op more or less
    than the loop's most common form, taken twice or more: the code after a loop that ends in the same op (DeepSpeed
    flattening its buckets after its per-gradient loop) is no iteration."""
    near = [True] + [ops[j].ts - ops[j - 1].end <= _MAX_GAP_US for j in range(1, len(ops))]
    found: list[tuple[float, int, int, int, int, int, _Period]] = []

    def run(ends: list[int]) -> None:
        forms = Counter(tuple(names[a + 1:b + 1]) for a, b in zip(ends, ends[1:]))
        if len(forms) < 2:  # one form is a loop the periods above find
            return
        first = ends[0] + 1
        for form in forms:  # the loop's first iteration ends at the first call
            if first - len(form) >= 0 and tuple(names[first - len(form):first]) == form and all(near[first - len(form) + 1:first]):
                first -= len(form)
                forms[form] += 1
                break
        n = sum(forms.values())
        (form, _), *others = forms.most_common()
        if (
            n >= MIN_ITERATIONS and len(others) < MAX_FORMS and all(count >= 2 for _, count in others)
            and all(_one_apart(form, other) for other, _ in others) and all(any(_ARITHMETIC.match(x) for x in f) for f in forms)
        ):
            found.append((ops[first].ts - ops[ends[-1]].end, 1, len(form), first, n, ends[-1] + 1, form))

    calls: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        calls.setdefault(name, []).append(j)
    for at in calls.values():
        ends = at[:1]
        for a, b in zip(at, at[1:]):
            if b - a <= MAX_PERIOD and all(near[a + 1:b + 1]):
                ends.append(b)
                continue
            run(ends)
            ends = [b]
        run(ends)
    return found


def _one_apart(a: _Period, b: _Period) -> bool:
    """Whether one of ``a`` and ``b`` is the other with one op more."""
    short, long = sorted((a, b), key=len)
    return len(long) == len(short) + 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _owner(loops: Intervals, frames: Sequence[Span], timeline: Timeline | None) -> str | None:
    """Whose loop it is: a known helper's frame in the stacks over ``loops``, else their most common innermost frame
    of the user's or a library's code; with_stack ``frames`` first, else the samples."""
    stacks: list[list[str]] = []
    if frames:
        stacks = [[f.name for f in frames if f.ts <= (a + b) / 2 < f.end][::-1] for a, b in loops]
    elif timeline is not None:
        stacks = [timeline.stacks[i] for a, b in loops for i in timeline.within(a, b)]
    for stack in stacks:
        known = next((f for f in reversed(stack) if frame_parts(f) in OWNERS), None)  # outermost first
        if known is not None:
            return known
    inner = Counter(next((f for f in stack if is_users(f)), None) for stack in stacks)
    inner.pop(None, None)
    return inner.most_common(1)[0][0] if inner else None


def _cost(r: RankSummary, loop: ParamLoop) -> list[float]:
    """Each step's cost of the loop: its time, at most the device's idle time on a device (the kernels it launches
    are work a foreach update does too)."""
    if r.idle is None:
        return loop.ms
    return [min(ms, sum(s.idle_ms.values())) for ms, s in zip(loop.ms, r.steps)]


def param_loop(ranks: Sequence[RankSummary], _: Sequence[Straggler]) -> Finding | None:
    """Some rank updates a weights' average (or other tensors) one at a time outside its model and optimizer, in a
    loop whose owner has a change that does it at once."""
    hit = [(r, r.param_loop, fix) for r in ranks if r.param_loop is not None and r.steps and (fix := owner_fix(r.param_loop.owner))]
    if not hit:
        return None
    worst, loop, fix = max(hit, key=lambda h: statistics.fmean(_cost(h[0], h[1])))
    iterations = statistics.median(n for n in loop.iterations if n)
    ms = statistics.fmean(loop.ms)
    helper = OWNERS.get(frame_parts(loop.owner) or ("", "")) if loop.owner else None
    who = frame_label(loop.owner) if loop.owner else "the loop's own code"
    device = (
        " On a device each of them is a kernel launch: the device waits while the host issues them one by one."
        if worst.idle is not None else ""
    )
    return make_finding(
        "param_loop",
        worst,
        statistics.fmean(_cost(worst, loop)),
        title=(
            f"{helper.title}: {ms:.1f} ms a {step_word(worst)}" if helper is not None else
            f"A Python loop updates {iterations:.0f} tensors one at a time outside the model and the optimizer"
        ),
        evidence=(
            f"{who} runs {', '.join(loop.ops)} for one tensor after another, {iterations:.0f} times a "
            f"{step_word(worst)} where no module, backward node or torch.optim step is open: {ms:.1f} ms of the "
            f"{worst.mean_step_ms or 0:.1f} ms {step_word(worst)} on rank {worst.rank}"
            + (f" (found on {ranks_text([h[0] for h in hit])})" if len(hit) > 1 else "")
            + f". Its time grows with the number of tensors, not their size.{device}"
        ),
        fix=f"Update them all at once: {fix}.",
        ranks=[h[0].rank for h in hit],
        one_off=one_step(worst, loop.ms),
    )
