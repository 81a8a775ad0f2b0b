"""Where a DataLoader-bound step's loading time goes, and the change that fits it, from a ``with_stack`` trace's frames.

Without frames the fix is the general one: DataLoader workers. With them (TraceLens' recordings of Hugging Face
pipelines have them) the frames around the loader say whose loop it is, and those inside it what it computes: a
transformers pipeline's own DataLoader takes ``num_workers`` in the pipeline's call and a Trainer's in its
TrainingArguments, not in a DataLoader the user builds; a model's slow image processor (numpy, scipy, PIL per
image) has a torchvision one; PIL's decoding moves to the GPU; a tokenizer run per batch runs once, ahead.

Without frames the ops tell one case apart: a loader in the step's own process that runs many cheap ops a batch
(:data:`PER_SAMPLE_OPS` or more, :data:`CHEAP_OP_US` or less each) and stacks what they fetched fetches samples
already in memory one by one: its time is the DataLoader's per-sample overhead. Fetching each batch with one index
removes it, where a worker process would add its own transfer per batch (:func:`per_sample_fetch`).

A loader that already runs in worker processes on a host with too few cores for them and the step is told so, from
the agent's thread clock: its training thread preempted again and again (a core taken from it every few ms)
(:func:`contended_workers`). More workers would take more cores from the step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.analysis.between import WORKER_LOADER
from orchestrator.analysis.loop_settings import Change, in_loop, setting
from orchestrator.analysis.python_frames import frame_file, frame_label, spot_and_caller
from orchestrator.analysis.ray_findings import RAY_DATA_FIX
from orchestrator.analysis.untraced import RAY_DATA_ITERATOR
from orchestrator.loops import Loop
from orchestrator.models.analysis import RankSummary

__all__ = [
    "CHEAP_OP_US", "PER_SAMPLE_OPS", "PIPELINE_WORKERS", "PREEMPTED_PER_S", "contended_workers", "data_fix", "data_where", "in_pipeline",
    "per_sample_fetch", "prep_clause",
]

_WORKERS = "raise DataLoader num_workers (e.g. to the CPU cores per GPU), set persistent_workers=True"
# Page-locked batches copy to a device asynchronously; a CPU-only job has no copy to speed up (torch warns and ignores it).
_PIN = " and pin_memory=True"
_PIPELINE = re.compile(r"^transformers/pipelines/")
_TRAINER = re.compile(r"^transformers/trainer\.py$")
# A transformers image processor, and code that runs it per image off torch (its slow backend: numpy, scipy, PIL;
# transformers 5 names that backend's files image_processing_pil_*, 4.x the torchvision one's *_fast; the numpy
# transforms of image_transforms.py are that backend's own).
_IMAGE_PROCESSOR = re.compile(r"^transformers/(models/[^/]+/)?image_processing_")
_OFF_TORCH = re.compile(r"^(scipy|PIL|skimage)/|/image_processing_pil_")
_NUMPY_TRANSFORMS = re.compile(r"^transformers/image_transforms\.py$")
_PIL = re.compile(r"^PIL/")
_TOKENIZER = re.compile(r"^(transformers/tokenization_|tokenizers/)")
# A fast (Rust) tokenizer's own files: transformers 4's *_fast, 5's TokenizersBackend, the tokenizers package.
_FAST_TOKENIZER = re.compile(r"^(transformers/tokenization_utils_(fast|tokenizers)\.py|tokenizers/)")
# A loader's own time is per-sample overhead from this many top-level ops a step, each this cheap on average, where it
# stacks samples (RankSummary.data_ops). In the real traces at hand, loaders over tensors or arrays in memory
# (TensorDataset, skorch's numpy Dataset, a Lightning module's) run 66-514 ops a call at 2.0-11 µs each; loaders that
# decode or transform each sample (the profiler tutorial's CNN, numpy work in __getitem__, a Keras fit() decoding per
# sample) 98-170 µs an op, and a loader with workers 4 ops a call; PARAM's DLRM generator 159 at 8.2 µs, building
# whole batches (no stack). Measured by hand (a 64-sample batch of a 64-float TensorDataset, 2-core box): 148 µs a batch
# fetched per sample, 41 µs with one index, 892 µs from one worker process.
PER_SAMPLE_OPS = 32
CHEAP_OP_US = 20.0
# Preemptions a second of the window from which a training thread cannot keep a core for a scheduler slice: one rank
# alone on the 2-core box, 0-7 a second (13 recordings); two ranks sharing its 2 cores, 100-2,000; the PyG loader's
# workers beside one rank, 5,100-7,000.
PREEMPTED_PER_S = 100.0
PIPELINE_WORKERS = (
    "call the pipeline on a dataset or list with num_workers and batch_size (pipe(inputs, num_workers=8, "
    "batch_size=16)): its DataLoader workers then prepare the inputs"
)


def _any(frames: Sequence[str], pattern: re.Pattern[str]) -> bool:
    return any(pattern.search(frame_file(f)) for f in frames)


def in_pipeline(frames: Sequence[str]) -> bool:
    """Any of these frames is a transformers pipeline's."""
    return _any(frames, _PIPELINE)


def data_where(r: RankSummary) -> str:
    """A sentence naming the deepest frame on the hot path and the nearest caller of it in another file ('' where
    the trace has no frames, or no frame holds half the loading)."""
    found = spot_and_caller(r.data_frames)
    if found is None:
        return ""
    spot, caller = found
    share = spot.total_ms / (r.mean_phases.data * len(r.steps))
    called = f", called from {frame_label(caller.name)}" if caller is not None else ""
    return f" {min(share, 1.0):.0%} of it is in {frame_label(spot.name)}{called}."


def prep_clause(frames: Sequence[str], pipeline: bool, device: str) -> str:
    """What the frames of a data preparation compute, and the change for it: ' Much of that time is ...' ('' for code
    rayprof knows nothing of); ``pipeline``: a transformers pipeline runs it; ``device``: the rank's (an Intel GPU's
    torch.xpu has no JPEG decoder: torchvision's decodes on CUDA only)."""
    on = "xpu" if device == "xpu" else "cuda"
    if (_any(frames, _IMAGE_PROCESSOR) and _any(frames, _OFF_TORCH)) or _any(frames, _NUMPY_TRANSFORMS):
        given = ", given to the pipeline as image_processor=" if pipeline else ""
        return (
            " Much of that time is the model's image processor, image by image off torch: load its torchvision one "
            "(AutoImageProcessor.from_pretrained(name, backend='torchvision'); use_fast=True before transformers 5"
            f"{given}), which works on batches of tensors, and on the GPU with device='{on}' in its call."
        )
    if _any(frames, _PIL):
        decode = (
            "decode with torchvision.io.decode_jpeg and transform the tensors on the XPU (torchvision.transforms.v2)"
            if on == "xpu"
            else "decode on the GPU (torchvision.io.decode_jpeg(data, device='cuda')) and transform tensors there "
            "(torchvision.transforms.v2)"
        )
        return f" Much of that time is PIL decoding and resizing images: {decode}, or store the images decoded at the size the model takes."
    if _any(frames, _TOKENIZER):
        fast = "" if _any(frames, _FAST_TOKENIZER) else ", with the fast (Rust) tokenizer (AutoTokenizer.from_pretrained(name, use_fast=True))"
        return (
            " Much of that time is tokenizing each batch: tokenize once, ahead (datasets' map(tokenize, batched=True, "
            f"num_proc=N)){fast}."
        )
    return ""


def per_sample_fetch(r: RankSummary) -> str:
    """The change for a loader whose own time is fetching in-memory samples one by one ('' where its ops say
    otherwise: few of them a step, or costly ones)."""
    op_us = r.mean_phases.data * 1000 / r.data_ops if r.data_ops >= PER_SAMPLE_OPS else None
    if op_us is None or op_us > CHEAP_OP_US:
        return ""
    return (
        f"The loader's time is its per-sample overhead ({r.data_ops:.0f} ops a step at {op_us:.1f} µs each: samples "
        "already in memory, fetched and collated one by one): fetch each batch with one index (a Dataset whose __getitem__ takes a list of indices, as TensorDataset's "
        "does, given to "
        "DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size, drop_last=False), batch_size=None); an "
        "IterableDataset yields whole batches, with batch_size=None), or slice the tensors directly, on the device "
        "where they fit; a worker process (num_workers) adds a transfer per batch that costs as much as such a fetch."
    )


def contended_workers(r: RankSummary) -> str:
    """The change for a loader whose worker processes compete with the step for the rank's cores: its training thread
    preempted PREEMPTED_PER_S times a second of the window or more ('' where the loader runs no workers, or the agent
    did not time the thread). Recorded (PyTorch Geometric's DataLoader of 32 small graphs a batch, one CPU thread, a
    2-core box): in the step's process 1.8 ms of a 6.6 ms step; with num_workers=2, 4.4-5.8 ms of 12.0-12.8 ms, the
    forward and backward longer, the thread preempted 1,600-5,100 times a second."""
    t = r.thread_time
    if r.data_loader != WORKER_LOADER or t is None or not r.steps or not t.wall_s:
        return ""
    # Not against its voluntary switches: the thread gives its core up each time it waits for a worker's batch.
    if t.involuntary_switches is None or t.involuntary_switches < PREEMPTED_PER_S * t.wall_s:
        return ""
    cores = f" on a host where it has {t.usable_cores} usable core{'' if t.usable_cores == 1 else 's'}" if t.usable_cores else ""
    return (
        f"The loader already runs in worker processes, and the training thread was preempted "
        f"{t.involuntary_switches / len(r.steps):.0f} times a step ({t.involuntary_switches / t.wall_s:,.0f} a second){cores}: "
        "the workers take cores from the step (its forward and backward read longer for it too), so more workers "
        "would load no faster. Keep num_workers within the cores left beside the training thread and its intra-op "
        "threads (torch.set_num_threads), give the rank more cores (Ray's ScalingConfig(resources_per_worker={'CPU': "
        "N})), or make each batch cheaper to build; where a batch takes little to build, num_workers=0 spares the "
        "transfer from a worker."
    )


def data_fix(r: RankSummary, steady: bool = True) -> str:
    """The change for the loader ``r`` waits for: by whose loop iterates it and what its hot path computes; ``steady``:
    its time is the steps' alike (not one step's), so what its ops cost a step is what a step pays."""
    if r.data_loader == RAY_DATA_ITERATOR:
        return RAY_DATA_FIX
    callers = [f.name for f in r.data_callers]
    pipeline = in_pipeline(callers)
    trainer = _any(callers, _TRAINER) or (r.loop is Loop.TRANSFORMERS_TRAINER and not pipeline)
    if pipeline:
        first = f"The DataLoader is the transformers pipeline's own, in the step's process unless told: {PIPELINE_WORKERS}"
    elif trainer:
        first = (
            "The DataLoader is the transformers Trainer's, built from its TrainingArguments: load batches in parallel "
            f"with the step with {setting(Loop.TRANSFORMERS_TRAINER, Change.LOADER_WORKERS)}, N up to the CPU cores per GPU"
        )
    else:
        first = f"Load batches in parallel with the step: {_WORKERS}" + (_PIN if r.device != "cpu" else "")
    what = prep_clause([f.name for f in r.data_frames], pipeline, r.device)
    if contended := contended_workers(r):  # more workers, whatever sets them, would take more of the step's cores
        return contended + what + in_loop(r.loop, [Change.LOADER_WORKERS])
    if what or pipeline or trainer:
        return f"{first}.{what}"
    if steady and (fetch := per_sample_fetch(r)):
        return fetch
    return (
        f"{first}, and move per-item work (decoding, augmentation) out of __getitem__ or into a preprocessed dataset."
        + in_loop(r.loop, [Change.LOADER_WORKERS])
    )
