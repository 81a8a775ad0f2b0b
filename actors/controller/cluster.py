"""What the controller knows of the Ray cluster: its id, and what a manifest records about it."""

from __future__ import annotations

from typing import Any

import ray

from actors.controller.agents.registry import Registry
from actors.controller.profiles.state import Profile

__all__ = ["cluster_info", "ray_cluster_id"]


def cluster_info(registry: Registry, profile: Profile) -> dict[str, Any]:
    """The manifest's ``cluster``: versions, jobs and the size of the run profiled."""
    infos = list(registry.infos(profile.target))
    return {
        "ray_version": ray.__version__,
        "torch_version": infos[0].torch_version if infos else None,
        "ray_job_ids": sorted({i.ray_job_id for i in infos if i.ray_job_id}),
        "submission_ids": sorted({i.submission_id for i in infos if i.submission_id}),
        "experiment_paths": sorted({i.experiment_path for i in infos if i.experiment_path}),
        "nodes": len({r.node_id for r in profile.ranks.values() if r.node_id}),
        "world_size": max((i.world_size for i in infos), default=None),
    }


def ray_cluster_id() -> str:
    """This Ray cluster's id, stable across controller restarts. Saved state is namespaced by
    it: two clusters sharing a storage root never adopt each other's profiles."""
    from orchestrator.ray_compat import cluster_id

    return cluster_id()[:16]
