"""Who this worker is, read from Ray Train's context: None outside a Ray Train worker."""

from __future__ import annotations

import os
import socket
import uuid

import torch

from orchestrator.build import build_id
from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.models.common import to_name

__all__ = ["worker_info"]


def worker_info() -> WorkerInfo | None:
    try:
        import ray
        import ray.train

        ctx = ray.train.get_context()
        run_name = ctx.get_experiment_name()
    except Exception:
        return None
    runtime = ray.get_runtime_context()
    device = "cpu"
    try:
        import ray.train.torch

        device = str(ray.train.torch.get_device())
    except Exception:
        pass
    experiment_path = None
    try:
        experiment_path = ctx.get_storage().experiment_fs_path
    except Exception:
        pass
    submission_id = None
    try:
        from orchestrator.ray_compat import submission_id as job_submission_id

        submission_id = job_submission_id()
    except Exception:
        pass
    return WorkerInfo(
        agent_id=uuid.uuid4().hex,
        target=to_name(run_name),
        world_rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        node_rank=ctx.get_node_rank(),
        node_id=runtime.get_node_id(),
        host=socket.gethostname(),
        pid=os.getpid(),
        device=device,
        ray_job_id=runtime.get_job_id(),
        submission_id=submission_id,
        experiment_path=experiment_path,
        torch_version=torch.__version__,
        build=build_id(),
        actor_id=runtime.get_actor_id(),
    )
