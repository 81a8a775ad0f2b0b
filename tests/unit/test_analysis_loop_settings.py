"""A fix names the change as the setting of the framework whose loop the job runs: read from the trace (what the
agent wrote into it, or a with_stack trace's frames), applied to the real traces' findings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.analysis import analyze_folder
from orchestrator.analysis.findings import find_all
from orchestrator.analysis.loop_settings import Change, in_loop, trace_loop
from orchestrator.analysis.step_content import one_step
from orchestrator.loops import METADATA_KEY, Loop
from orchestrator.models.analysis import Finding, Summary
from tests.support.realtraces import external, h100
from tests.support.tracefiles import case, with_header


def _as_if(summary: Summary, loop: Loop, code: str) -> Finding:
    """The finding ``code`` of ``summary``'s ranks had they run in ``loop``."""
    found = [f for f in find_all([r.model_copy(update={"loop": loop}) for r in summary.ranks], summary.stragglers) if f.code == code]
    assert found, f"no {code} finding"
    return found[0]


# ---- whose loop -----------------------------------------------------------------------


def test_the_loop_the_agent_wrote_into_the_trace_is_the_ranks_and_the_profiles(tmp_path):
    summary = analyze_folder(with_header(tmp_path, "cpu_lightning", **{METADATA_KEY: "lightning"}))
    assert [r.loop for r in summary.ranks] == [Loop.LIGHTNING]
    assert summary.loop is Loop.LIGHTNING


def test_a_loop_this_version_does_not_know_names_no_framework(tmp_path):
    # A newer agent's framework: its settings are unknown here, so no fix may name another framework's.
    summary = analyze_folder(with_header(tmp_path, "cpu_lightning", **{METADATA_KEY: "levanter"}))
    assert summary.loop is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.one_of(_JSON, st.sampled_from([loop.value for loop in Loop])))
def test_any_value_under_the_loop_key_reads_as_a_known_loop_or_none(value):
    found = trace_loop({METADATA_KEY: value}, [])
    assert found is (Loop(value) if isinstance(value, str) and value in {loop.value for loop in Loop} else None)


def test_a_with_stack_traces_frames_say_whose_loop_it_is():
    assert analyze_folder(case("cpu_hf_trainer_stacks")).loop is Loop.TRANSFORMERS_TRAINER
    assert analyze_folder(case("cpu_lightning_prog_bar")).loop is Loop.LIGHTNING


def test_a_trace_without_stacks_or_the_agents_word_names_no_loop():
    assert analyze_folder(case("cpu_accelerate")).loop is None


def test_what_one_step_is_says_whose_loop_runs_it():
    assert one_step(analyze_folder(case("cpu_hf_trainer_stacks"))) == (
        "One step (as the trace shows): AdamW.step ×1; 1 forward pass (GPT2LMHeadModel_0). "
        "Training loop: transformers' Trainer."
    )


def test_a_loop_that_steps_no_torch_optimizer_still_says_whose_it_is():
    # fastai's Learner: no Optimizer.step span and, without stacks, no forward marker: nothing says what a step holds.
    assert one_step(analyze_folder(case("cpu_fastai_adam"))) == "Training loop: fastai's Learner."


# ---- the settings ---------------------------------------------------------------------


def test_the_jobs_own_loop_gets_no_framework_sentence():
    assert in_loop(None, list(Change)) == ""


@pytest.mark.parametrize("loop", list(Loop))
def test_every_framework_the_agent_can_name_has_its_settings(loop):
    # A loop added to orchestrator.loops without its row here made every fix of its traces raise KeyError. (Not every
    # framework has a setting for every change: stable-baselines3 has no mixed precision nor compile.)
    assert in_loop(loop, list(Change)).startswith(f" In {loop.label}: ")


def test_a_change_the_framework_has_no_setting_for_adds_nothing():
    # The Trainer has no comm hook argument; Accelerate users build their own optimizer.
    assert in_loop(Loop.TRANSFORMERS_TRAINER, [Change.COMPRESS_GRADIENTS]) == ""
    assert in_loop(Loop.ACCELERATE, [Change.FUSED_ADAMW, Change.LOADER_WORKERS]) == ""


@pytest.mark.parametrize(
    ("loop", "setting"),
    [
        (Loop.TRANSFORMERS_TRAINER, "TrainingArguments(fp16=True), its GradScaler included"),
        (Loop.LIGHTNING, "Trainer(precision='16-mixed'), its GradScaler included"),
        (Loop.ACCELERATE, "Accelerator(mixed_precision='fp16'), its GradScaler included"),
        (Loop.LIGHTNING_FABRIC, "Fabric(precision='16-mixed'), its GradScaler included"),
        (Loop.DEEPSPEED, '"fp16": {"enabled": true}, its loss scaler included'),
        (Loop.COMPOSER, "Trainer(precision='amp_fp16'), its GradScaler included"),
        (Loop.MMENGINE, "optim_wrapper=dict(type='AmpOptimWrapper', optimizer=...), its GradScaler included"),
        (Loop.SKORCH, "a net with skorch.hf's AccelerateMixin given accelerator=Accelerator(mixed_precision='fp16'), its "
         "GradScaler included"),
    ],
)
def test_fp32_matmuls_on_a_v100_are_told_the_frameworks_fp16_setting(loop, setting):
    # HTA's V100 ResNet: volta_sgemm leads, and a V100 has tensor cores for fp16 only.
    fix = _as_if(external("hta_ns_resolution_v100_1rank"), loop, "gpu_bound").fix
    assert f"In {loop.label}: {setting}." in fix
    assert "bf16" not in fix.split(f"In {loop.label}:")[1].split(".")[0]


def test_an_unfused_adam_in_lightning_is_told_where_fused_goes():
    fix = _as_if(h100("seed003_after"), Loop.LIGHTNING, "low_gpu_utilization").fix
    assert "pass fused=True to Adam (torch.optim.Adam(params, fused=True))" in fix
    assert "In Lightning's Trainer: fused=True on the optimizer configure_optimizers() returns." in fix
    assert "In Lightning's Trainer: torch.compile(model) before trainer.fit(model)." in fix


def test_an_unfused_adamw_in_a_transformers_trainer_is_told_its_fused_optim():
    fix = _as_if(h100("seed003_after"), Loop.TRANSFORMERS_TRAINER, "low_gpu_utilization").fix
    assert "TrainingArguments(optim='adamw_torch_fused') where the Trainer builds the optimizer" in fix


@pytest.mark.parametrize(
    ("loop", "settings"),
    [
        (Loop.TRANSFORMERS_TRAINER, ["TrainingArguments(gradient_accumulation_steps=N)"]),
        (Loop.LIGHTNING, ["Trainer(accumulate_grad_batches=N)", "ddp_comm_hook=default_hooks.bf16_compress_hook"]),
        (Loop.ACCELERATE, ["Accelerator(gradient_accumulation_steps=N)", "comm_hook=DDPCommunicationHookType.BF16"]),
    ],
)
def test_ddp_whose_collectives_outlast_the_compute_is_told_the_frameworks_accumulation(loop, settings):
    # TraceLens' MI300 ResNet: 13.4 ms of collectives a step against 4.3 ms of compute: no bucket size hides that.
    fix = _as_if(external("tracelens_mi300_resnet_ckpt_r0of8"), loop, "comm_exposed").fix
    assert "no bucket size hides that" in fix
    assert all(s in fix for s in settings)
    assert "bucket_cap_mb" not in fix


def test_a_lightning_job_waiting_for_its_loader_is_told_its_dataloaders_workers():
    fix = _as_if(external("tbplugin_resnet50_nw0_a"), Loop.LIGHTNING, "dataloader_bound").fix
    assert fix.startswith("Load batches in parallel with the step: raise DataLoader num_workers")
    assert fix.endswith(
        "In Lightning's Trainer: num_workers=N, persistent_workers=True on the DataLoader train_dataloader() returns "
        "(the LightningModule's or the LightningDataModule's)."
    )


def test_a_keras_fit_waiting_for_its_data_is_told_keras_own_workers():
    fix = _as_if(external("tbplugin_resnet50_nw0_a"), Loop.KERAS, "dataloader_bound").fix
    assert fix.endswith(
        "In Keras's fit(): fit() on a keras.utils.PyDataset(workers=N, use_multiprocessing=True), or on a torch "
        "DataLoader(num_workers=N, persistent_workers=True)."
    )


def test_a_fastai_learner_waiting_for_its_data_is_told_where_its_dataloaders_are_made():
    fix = _as_if(external("tbplugin_resnet50_nw0_a"), Loop.FASTAI, "dataloader_bound").fix
    assert fix.endswith(
        "In fastai's Learner: num_workers=N, persistent_workers=True where its DataLoaders are made "
        "(DataBlock.dataloaders(source, num_workers=N), ImageDataLoaders.from_folder(..., num_workers=N)), or on the "
        "torch DataLoaders given to DataLoaders(...)."
    )


def test_an_unfused_adam_in_a_fastai_learner_is_told_its_optimwrapper():
    fix = _as_if(h100("seed003_after"), Loop.FASTAI, "low_gpu_utilization").fix
    assert "In fastai's Learner: fused=True on the torch optimizer its OptimWrapper builds (Learner(..., " in fix


def test_fp32_matmuls_in_a_keras_fit_are_told_its_dtype_policy():
    fix = _as_if(external("hta_ns_resolution_v100_1rank"), Loop.KERAS, "gpu_bound").fix
    assert "In Keras's fit(): keras.mixed_precision.set_dtype_policy('mixed_float16') before the model is built" in fix


def test_a_trainers_loader_is_the_trainers_by_the_agents_word_without_stacks():
    fix = _as_if(external("tbplugin_resnet50_nw0_a"), Loop.TRANSFORMERS_TRAINER, "dataloader_bound").fix
    assert fix.startswith(
        "The DataLoader is the transformers Trainer's, built from its TrainingArguments: load batches in parallel with "
        "the step with TrainingArguments(dataloader_num_workers=N, dataloader_persistent_workers=True)"
    )


def test_the_same_trace_in_the_jobs_own_loop_keeps_pytorchs_words():
    summary = external("tracelens_mi300_resnet_ckpt_r0of8")
    assert all(" In " not in f.fix for f in summary.findings)


def test_a_trainers_reads_without_stacks_are_told_its_nan_filter_by_the_agents_word():
    # The recorded Trainer job without stacks: aten::is_nonzero 3x a step; the stacked recording of the same job
    # puts two of them in the Trainer's nan/inf check of the loss (transformers/trainer.py _run_epoch).
    summary = analyze_folder(case("cpu_hf_trainer"))
    plain = [f for f in summary.findings if f.code == "host_sync"][0].fix
    told = _as_if(summary, Loop.TRANSFORMERS_TRAINER, "host_sync").fix
    assert "logging_nan_inf_filter" not in plain
    assert told.startswith("transformers' Trainer checks every step's loss for nan/inf before it logs it")
    assert "logging_nan_inf_filter=False removes them" in told
    assert "logging_nan_inf_filter" not in _as_if(summary, Loop.LIGHTNING, "host_sync").fix


def test_a_trainer_that_logs_every_step_is_told_its_logging_steps():
    # The recorded Trainer with logging_steps=1: it reads the loss and the gradient norm back (aten::item) each step.
    summary = analyze_folder(case("cpu_hf_trainer_logging"))
    plain = [f for f in summary.findings if f.code == "host_sync"][0].fix
    told = _as_if(summary, Loop.TRANSFORMERS_TRAINER, "host_sync").fix
    assert "logging_steps" not in plain
    assert told.endswith(
        "In transformers' Trainer: TrainingArguments(logging_steps=N): it reads the loss and the gradient norm back "
        "when it logs, every step with logging_steps=1."
    )
    assert "log_every_n_steps" in _as_if(summary, Loop.LIGHTNING, "host_sync").fix


def test_memory_near_capacity_in_a_trainer_is_told_its_checkpointing_and_accumulation_settings():
    # HTA's V100 (fp16 tensor cores only) at 95% of its memory, as tests/unit/test_analysis.py plants it.
    rank = external("hta_df_index_resolver_v100_r1of2").ranks[0]
    peak = next(m for m in rank.memory if m.device == "cuda:1")
    full = rank.model_copy(
        update={"memory": [peak.model_copy(update={"peak_bytes": int(0.95 * peak.capacity_bytes)})], "loop": Loop.TRANSFORMERS_TRAINER}
    )
    (found,) = [f for f in find_all([full], []) if f.code == "memory_peak"]
    assert found.fix.endswith(
        "In transformers' Trainer: TrainingArguments(gradient_checkpointing=True); "
        "TrainingArguments(gradient_accumulation_steps=N), which syncs the gradients on the last micro-batch only; "
        "TrainingArguments(fp16=True), its GradScaler included."
    )


# ---- DeepSpeed (tests/data/record_cpu_deepspeed.py: two gloo ranks, ZeRO stage 0) --------------


def test_a_deepspeed_job_with_little_to_reduce_is_told_nothing():
    summary = analyze_folder(case("cpu_deepspeed"))
    assert summary.findings == []
    assert summary.step_definition == "1 step = AdamW.step ×1"


def test_deepspeeds_all_reduce_after_backward_reads_as_collectives_outside_it_without_the_agents_word():
    # Without the agent's word (no stacks) the trace cannot tell DeepSpeed's reduction from the job's own calls.
    fix = [f for f in analyze_folder(case("cpu_deepspeed_comm")).findings if f.code == "comm_exposed"][0].fix
    assert "if they average the gradients, DDP or FSDP reduces them in buckets during backward instead" in fix


def test_deepspeeds_all_reduce_after_backward_is_told_its_config_by_the_agents_word(tmp_path):
    summary = analyze_folder(with_header(tmp_path, "cpu_deepspeed_comm", **{METADATA_KEY: "deepspeed"}))
    (found,) = [f for f in summary.findings if f.code == "comm_exposed"]
    assert "c10d::allreduce_" in found.fix
    assert "DeepSpeed's engine makes them itself once backward is done, reducing the gradients" in found.fix
    assert "DDP" not in found.fix and "metric" not in found.fix
    # No stacks: the stage is not known, so where each stage reduces is said (tests/unit/test_analysis_zero_stage.py).
    assert "at ZeRO stage 0 always, and at stages 1 and 2 while a bucket" in found.fix
    assert found.fix.endswith(
        'In DeepSpeed: "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": N} (or stage 2) '
        "with N well below the model's parameter count: a bucket is reduced during backward once it fills, on a stream "
        'of its own; "gradient_accumulation_steps": N, which reduces the gradients once per N micro-batches (at ZeRO '
        'stages 0 and 1; stage 2 reduces them on every micro-batch); "communication_data_type": "bf16".'
    )
