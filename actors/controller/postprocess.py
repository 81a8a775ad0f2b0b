"""Run a profile's merge and analysis as a Ray task, bounded by its own timeout.

A failed or timed-out analysis never fails the profile: the manifest says
what went wrong. A task that runs past its timeout is cancelled, so it never
uploads files that no manifest lists.
"""

from __future__ import annotations

import asyncio
import logging

import ray

from actors.controller.state import Profile
from orchestrator.analysis.postprocess import PostprocessResult, postprocess
from orchestrator.models import Manifest, StorageSpec

__all__ = ["postprocess_in_task"]

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=0, max_retries=0)
def _postprocess_task(spec: StorageSpec, prefix: str, draft: Manifest) -> PostprocessResult:
    return postprocess(spec, prefix, draft)


async def postprocess_in_task(draft: Manifest, profile: Profile, timeout_s: float) -> Manifest:
    """``draft`` with the merged trace, report and summary added, or with ``analysis_error`` set."""
    ref = _postprocess_task.remote(profile.storage, profile.prefix, draft)
    try:
        result: PostprocessResult = await asyncio.wait_for(asyncio.shield(ref), timeout_s)
    except TimeoutError:
        ray.cancel(ref, force=True)
        logger.warning("rayprof controller: analysis of %s ran past %gs; cancelled", profile.id, timeout_s)
        return draft.model_copy(
            update={"analysis_error": f"analysis ran past its {timeout_s:g}s timeout (RAYPROF_POSTPROCESS_TIMEOUT_S)"}
        )
    except Exception as e:
        logger.warning("rayprof controller: analysis of %s failed: %s", profile.id, e)
        return draft.model_copy(update={"analysis_error": f"{type(e).__name__}: {str(e)[:500]}"})
    return draft.model_copy(update={"artifacts": result.artifacts, "summary": result.summary})
