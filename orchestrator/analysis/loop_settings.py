"""Whose loop a rank's trace ran (:class:`~orchestrator.loops.Loop`), and each change a fix names as that loop's
setting: the one place the frameworks' option names live.

A fix says the change in PyTorch's words (``torch.autocast``, ``no_sync()``, ``fused=True``); in a framework's loop
the user does not write those calls, the framework does, from its settings. So a fix whose rank ran in one gets a
sentence naming the settings that make the change there (``In Lightning's Trainer: Trainer(precision='bf16-mixed')``;
DeepSpeed's are keys of its config). A change the framework has no setting for says nothing more: the PyTorch words
stand. The names are those of transformers 5, Lightning 2 (its Trainer and Fabric), fastai 2.8, Composer 0.32,
MMEngine 0.10, skorch 1.4, Accelerate 1, DeepSpeed 0.19, Keras 3 (on its torch backend) and stable-baselines3 2.9.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from orchestrator.analysis.python_frames import frame_parts
from orchestrator.loops import METADATA_KEY, Loop, loop_of
from orchestrator.traces.loader import Span

__all__ = ["Change", "in_loop", "setting", "trace_loop"]


class Change(str, Enum):
    """A change a fix names that a framework makes from a setting."""

    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"
    FUSED_ADAMW = "fused_adamw"
    FUSED_OPTIMIZER = "fused_optimizer"
    ACCUMULATE = "accumulate"
    CHECKPOINT_ACTIVATIONS = "checkpoint_activations"
    COMPRESS_GRADIENTS = "compress_gradients"
    GRADIENT_BUCKETS = "gradient_buckets"
    PREFETCH_PARAMETERS = "prefetch_parameters"
    COMPILE = "compile"
    LOADER_WORKERS = "loader_workers"
    PERSISTENT_WORKERS = "persistent_workers"
    BALANCE_LENGTHS = "balance_lengths"
    BETWEEN_STEPS = "between_steps"
    EVALUATE_LESS_OFTEN = "evaluate_less_often"
    LOG_LESS_OFTEN = "log_less_often"
    NO_ANOMALY_DETECTION = "no_anomaly_detection"
    NO_CHECKPOINT_ACTIVATIONS = "no_checkpoint_activations"


_SETTINGS: dict[Loop, dict[Change, str]] = {
    Loop.TRANSFORMERS_TRAINER: {
        Change.EVALUATE_LESS_OFTEN: "TrainingArguments(eval_strategy='steps', eval_steps=N) with N in the hundreds, or "
        "eval_strategy='epoch'",
        Change.BF16: "TrainingArguments(bf16=True)",
        Change.FP16: "TrainingArguments(fp16=True), its GradScaler included",
        Change.TF32: "TrainingArguments(tf32=True)",
        Change.FUSED_ADAMW: "TrainingArguments(optim='adamw_torch_fused') where the Trainer builds the optimizer",
        Change.ACCUMULATE: "TrainingArguments(gradient_accumulation_steps=N), which syncs the gradients on the last "
        "micro-batch only",
        Change.CHECKPOINT_ACTIVATIONS: "TrainingArguments(gradient_checkpointing=True)",
        Change.NO_CHECKPOINT_ACTIVATIONS: "TrainingArguments(gradient_checkpointing=False), its default",
        Change.GRADIENT_BUCKETS: "TrainingArguments(ddp_bucket_cap_mb=...)",
        Change.COMPILE: "TrainingArguments(torch_compile=True), torch_compile_mode='reduce-overhead' for CUDA graphs",
        Change.LOADER_WORKERS: "TrainingArguments(dataloader_num_workers=N, dataloader_persistent_workers=True)",
        Change.PERSISTENT_WORKERS: "TrainingArguments(dataloader_persistent_workers=True)",
        Change.BALANCE_LENGTHS: "TrainingArguments(train_sampling_strategy='batch_rebalance'), which balances the "
        "padded tokens across the ranks of each step ('group_by_length' puts samples of similar length together)",
        Change.BETWEEN_STEPS: "TrainingArguments(save_steps=..., eval_steps=..., logging_steps=...) say how often it "
        "saves, evaluates and logs after a step",
        Change.LOG_LESS_OFTEN: "TrainingArguments(logging_steps=N): it reads the loss and the gradient norm back when "
        "it logs, every step with logging_steps=1",
    },
    Loop.LIGHTNING: {
        Change.BF16: "Trainer(precision='bf16-mixed')",
        Change.FP16: "Trainer(precision='16-mixed'), its GradScaler included",
        Change.FUSED_OPTIMIZER: "fused=True on the optimizer configure_optimizers() returns",
        Change.FUSED_ADAMW: "fused=True on the optimizer configure_optimizers() returns",
        Change.ACCUMULATE: "Trainer(accumulate_grad_batches=N), which skips DDP's sync on all but the last micro-batch",
        Change.COMPRESS_GRADIENTS: "the strategy's ddp_comm_hook= (RayDDPStrategy or DDPStrategy(ddp_comm_hook="
        "default_hooks.bf16_compress_hook))",
        Change.GRADIENT_BUCKETS: "the strategy passes DDP's own arguments on (RayDDPStrategy or DDPStrategy(bucket_cap_mb=..., "
        "gradient_as_bucket_view=True, static_graph=True))",
        Change.COMPILE: "torch.compile(model) before trainer.fit(model)",
        Change.LOADER_WORKERS: "num_workers=N, persistent_workers=True on the DataLoader train_dataloader() returns "
        "(the LightningModule's or the LightningDataModule's)",
        Change.PERSISTENT_WORKERS: "persistent_workers=True on the DataLoader train_dataloader() returns (the "
        "LightningModule's or the LightningDataModule's)",
        Change.BETWEEN_STEPS: "ModelCheckpoint(every_n_train_steps=...) and Trainer(val_check_interval=..., "
        "log_every_n_steps=...) say how often it saves, validates and logs after a step",
        Change.EVALUATE_LESS_OFTEN: "Trainer(val_check_interval=N) (training batches between validations; "
        "check_val_every_n_epoch=N for epochs), and limit_val_batches=... to validate on part of the data",
        Change.LOG_LESS_OFTEN: "Trainer(log_every_n_steps=N): it reads what self.log collected back when it writes "
        "to the logger",
        Change.NO_ANOMALY_DETECTION: "Trainer(detect_anomaly=False), its default: with True it runs the whole fit "
        "under torch.autograd.set_detect_anomaly(True)",
    },
    Loop.LIGHTNING_FABRIC: {
        Change.BF16: "Fabric(precision='bf16-mixed')",
        Change.FP16: "Fabric(precision='16-mixed'), its GradScaler included",
        Change.FUSED_OPTIMIZER: "fused=True on the optimizer given to fabric.setup",
        Change.FUSED_ADAMW: "fused=True on the optimizer given to fabric.setup",
        Change.ACCUMULATE: "the accumulating micro-batches' forward and backward under "
        "fabric.no_backward_sync(model, enabled=is_accumulating), which skips DDP's sync on them",
        Change.GRADIENT_BUCKETS: "Fabric(strategy=DDPStrategy(bucket_cap_mb=..., gradient_as_bucket_view=True, "
        "static_graph=True)), DDP's own arguments",
        Change.COMPILE: "torch.compile(model) before fabric.setup(model)",
    },
    # fastai 2.8: its callbacks make the changes (MixedPrecision through to_bf16/to_fp16). Its GradientAccumulation
    # skips the optimizer step, not DDP's all-reduce, so it is no setting for syncing less.
    Loop.FASTAI: {
        Change.BF16: "learn.to_bf16() (its MixedPrecision callback)",
        Change.FP16: "learn.to_fp16() (its MixedPrecision callback, a GradScaler included)",
        Change.FUSED_ADAMW: "fused=True on the torch optimizer its OptimWrapper builds (Learner(..., "
        "opt_func=partial(OptimWrapper, opt=torch.optim.AdamW, fused=True)))",
        Change.FUSED_OPTIMIZER: "fused=True on the torch optimizer its OptimWrapper builds (Learner(..., "
        "opt_func=partial(OptimWrapper, opt=torch.optim.SGD, fused=True)))",
        Change.LOADER_WORKERS: "num_workers=N, persistent_workers=True where its DataLoaders are made "
        "(DataBlock.dataloaders(source, num_workers=N), ImageDataLoaders.from_folder(..., num_workers=N)), or on the "
        "torch DataLoaders given to DataLoaders(...)",
        Change.PERSISTENT_WORKERS: "persistent_workers=True where its DataLoaders are made (dataloaders(..., "
        "persistent_workers=True)), or on the torch DataLoaders given to DataLoaders(...)",
        Change.COMPILE: "learn.model = torch.compile(learn.model) before learn.fit",
    },
    # Composer 0.32: its Trainer wraps the model in DDP itself (no bucket or hook setting) and has no fused optimizer
    # of its own (DecoupledAdamW steps per tensor).
    Loop.COMPOSER: {
        Change.BF16: "Trainer(precision='amp_bf16')",
        Change.FP16: "Trainer(precision='amp_fp16'), its GradScaler included",
        Change.FUSED_ADAMW: "fused=True on the torch optimizer given to Trainer(optimizers=torch.optim.AdamW(..., "
        "fused=True)) (Composer's DecoupledAdamW has no fused kernel)",
        Change.FUSED_OPTIMIZER: "fused=True on the torch optimizer given to Trainer(optimizers=...)",
        Change.ACCUMULATE: "Trainer(device_train_microbatch_size=N) with a batch of several micro-batches: its default "
        "ddp_sync_strategy syncs the gradients on the last micro-batch only",
        Change.COMPILE: "Trainer(compile_config={}), which runs torch.compile on the model",
        Change.LOADER_WORKERS: "num_workers=N, persistent_workers=True on the DataLoader given to "
        "Trainer(train_dataloader=...)",
        Change.PERSISTENT_WORKERS: "persistent_workers=True on the DataLoader given to Trainer(train_dataloader=...)",
        Change.BETWEEN_STEPS: "Trainer(save_interval=..., eval_interval=...) say how often it saves and evaluates "
        "after a batch",
        Change.EVALUATE_LESS_OFTEN: "Trainer(eval_interval='1ep') (or 'Nba' for N batches), and "
        "eval_subset_num_batches=... to evaluate on part of the data",
    },
    # MMEngine 0.10, in its config's words (the dicts Runner takes, or a config file's variables): it builds the torch
    # optimizer from optim_wrapper's optimizer dict, passing every key on, and wraps the model in DDP with
    # model_wrapper_cfg's keys.
    Loop.MMENGINE: {
        Change.BF16: "optim_wrapper=dict(type='AmpOptimWrapper', dtype='bfloat16', optimizer=...)",
        Change.FP16: "optim_wrapper=dict(type='AmpOptimWrapper', optimizer=...), its GradScaler included",
        Change.FUSED_ADAMW: "optim_wrapper=dict(optimizer=dict(type='AdamW', fused=True, ...))",
        Change.FUSED_OPTIMIZER: "fused=True in optim_wrapper's optimizer dict (optim_wrapper=dict(optimizer=dict(type=..., "
        "fused=True)))",
        Change.ACCUMULATE: "optim_wrapper=dict(..., accumulative_counts=N), which skips DDP's sync on all but the last "
        "micro-batch",
        Change.GRADIENT_BUCKETS: "model_wrapper_cfg=dict(type='MMDistributedDataParallel', bucket_cap_mb=..., "
        "gradient_as_bucket_view=True, static_graph=True), DDP's own arguments",
        Change.COMPILE: "compile=True in the config (torch.compile of the model's train_step)",
        Change.LOADER_WORKERS: "train_dataloader=dict(..., num_workers=N, persistent_workers=True)",
        Change.PERSISTENT_WORKERS: "train_dataloader=dict(..., persistent_workers=True)",
        Change.BETWEEN_STEPS: "default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=...)) and "
        "train_cfg=dict(val_interval=...) say how often it saves and validates",
        Change.EVALUATE_LESS_OFTEN: "train_cfg=dict(val_interval=N)",
    },
    # skorch 1.4: NeuralNet passes optimizer__* to the optimizer and iterator_train__* to the training DataLoader; its
    # mixed precision and accumulation are Accelerate's, through skorch.hf's AccelerateMixin (a net class the user
    # declares, AcceleratedNet in its docs; its train_step runs under accelerator.accumulate).
    Loop.SKORCH: {
        Change.BF16: "a net with skorch.hf's AccelerateMixin given accelerator=Accelerator(mixed_precision='bf16')",
        Change.FP16: "a net with skorch.hf's AccelerateMixin given accelerator=Accelerator(mixed_precision='fp16'), its "
        "GradScaler included",
        Change.ACCUMULATE: "a net with skorch.hf's AccelerateMixin given accelerator=Accelerator("
        "gradient_accumulation_steps=N), which skips DDP's sync on all but the last micro-batch",
        Change.FUSED_ADAMW: "NeuralNet(..., optimizer=torch.optim.AdamW, optimizer__fused=True)",
        Change.FUSED_OPTIMIZER: "optimizer__fused=True on the NeuralNet (its optimizer__* arguments go to the optimizer)",
        Change.COMPILE: "NeuralNet(..., compile=True)",
        Change.LOADER_WORKERS: "NeuralNet(..., iterator_train__num_workers=N, iterator_train__persistent_workers=True)",
        Change.PERSISTENT_WORKERS: "NeuralNet(..., iterator_train__persistent_workers=True)",
    },
    Loop.ACCELERATE: {
        Change.BF16: "Accelerator(mixed_precision='bf16')",
        Change.FP16: "Accelerator(mixed_precision='fp16'), its GradScaler included",
        Change.ACCUMULATE: "Accelerator(gradient_accumulation_steps=N) with the step under accelerator.accumulate(model), "
        "which skips DDP's sync on all but the last micro-batch",
        Change.COMPRESS_GRADIENTS: "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.BF16)])",
        Change.GRADIENT_BUCKETS: "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=..., "
        "gradient_as_bucket_view=True, static_graph=True)])",
        Change.COMPILE: "Accelerator(dynamo_backend='inductor')",
    },
    # Keys of the DeepSpeed config (the dict or JSON file given to deepspeed.initialize).
    Loop.DEEPSPEED: {
        Change.BF16: '"bf16": {"enabled": true}',
        Change.FP16: '"fp16": {"enabled": true}, its loss scaler included',
        Change.FUSED_ADAMW: '"optimizer": {"type": "AdamW"} (DeepSpeed\'s fused Adam) in place of a torch optimizer '
        "given to deepspeed.initialize, or fused=True on that one",
        Change.FUSED_OPTIMIZER: "fused=True on the torch optimizer given to deepspeed.initialize, or DeepSpeed's own "
        '"optimizer" in the config',
        Change.ACCUMULATE: '"gradient_accumulation_steps": N, which reduces the gradients once per N micro-batches (at '
        "ZeRO stages 0 and 1; stage 2 reduces them on every micro-batch)",
        Change.COMPRESS_GRADIENTS: '"communication_data_type": "bf16"',
        # Measured on DeepSpeed 0.19.8 (two gloo ranks, a 22k-parameter MLP): overlap_comm alone reduces nothing during
        # backward at stages 1 and 2; a reduce_bucket_size below the parameter count does.
        Change.GRADIENT_BUCKETS: '"zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": N} (or '
        "stage 2) with N well below the model's parameter count: a bucket is reduced during backward once it fills, on "
        "a stream of its own",
        Change.COMPILE: "engine.compile() on the engine deepspeed.initialize returns",
        Change.PREFETCH_PARAMETERS: '"zero_optimization": {"stage3_prefetch_bucket_size": N, '
        '"stage3_param_persistence_threshold": N}: the parameters of the next modules gathered during the current '
        "ones' compute, and those smaller than the threshold kept whole on every rank (no gather at all)",
    },
    Loop.KERAS: {
        Change.BF16: "keras.mixed_precision.set_dtype_policy('mixed_bfloat16') before the model is built",
        Change.FP16: "keras.mixed_precision.set_dtype_policy('mixed_float16') before the model is built (compile() then "
        "wraps the optimizer in a LossScaleOptimizer)",
        Change.COMPILE: "model.compile(..., jit_compile=True), which runs the train step through torch.compile",
        Change.LOADER_WORKERS: "fit() on a keras.utils.PyDataset(workers=N, use_multiprocessing=True), or on a torch "
        "DataLoader(num_workers=N, persistent_workers=True)",
        Change.PERSISTENT_WORKERS: "persistent_workers=True on the torch DataLoader given to fit()",
        Change.BETWEEN_STEPS: "ModelCheckpoint(save_freq=...) and fit(validation_freq=...) say how often it saves and "
        "validates",
        Change.EVALUATE_LESS_OFTEN: "fit(validation_freq=N) (epochs between validations), and validation_steps=... to "
        "validate on part of the data",
    },
    # stable-baselines3 2.9: each algorithm builds its policy's optimizer from policy_kwargs (Adam by default); it has
    # no mixed precision, compile or DataLoader setting.
    Loop.STABLE_BASELINES3: {
        Change.FUSED_ADAMW: "PPO(..., policy_kwargs=dict(optimizer_kwargs=dict(fused=True))) (A2C, SAC, TD3 and DQN take "
        "the same policy_kwargs)",
        Change.FUSED_OPTIMIZER: "policy_kwargs=dict(optimizer_class=..., optimizer_kwargs=dict(fused=True)) on the "
        "algorithm",
        Change.BETWEEN_STEPS: "EvalCallback(eval_freq=...) and CheckpointCallback(save_freq=...) say how often it "
        "evaluates and saves",
        Change.EVALUATE_LESS_OFTEN: "EvalCallback(eval_freq=N, n_eval_episodes=...)",
    },
}


_KNOWN = frozenset(loop.value for loop in Loop)


def trace_loop(header: Mapping[str, Any], frames: Iterable[Span]) -> Loop | None:
    """Whose loop a trace ran: what the agent wrote into its metadata, else what its Python frames (a with_stack
    trace's) show (also where the agent wrote a loop this version does not know: a newer agent's); None for the
    job's own loop."""
    written = header.get(METADATA_KEY)
    if isinstance(written, str) and written in _KNOWN:
        return Loop(written)
    return loop_of(parts[0] for f in frames if (parts := frame_parts(f.name)) is not None)


def in_loop(loop: Loop | None, changes: Iterable[Change]) -> str:
    """`` In Lightning's Trainer: Trainer(precision='bf16-mixed'); torch.compile(model) before trainer.fit(model).``:
    the settings that make ``changes`` in ``loop``; '' for the job's own loop or where it has none of them."""
    if loop is None:
        return ""
    said = list(dict.fromkeys(s for c in changes if (s := _SETTINGS[loop].get(c)) is not None))
    return f" In {loop.label}: {'; '.join(said)}." if said else ""


def setting(loop: Loop, change: Change) -> str:
    """The one setting of ``loop`` that makes ``change`` (a change the table holds for it)."""
    return _SETTINGS[loop][change]
