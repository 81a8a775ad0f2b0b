"""Run a profile's analysis and merge with per-rank Ray tasks, bounded by its own timeout.

The join (cross-rank analysis, assembling the merged trace from the ranks'
compressed parts, the report) runs in a thread of the controller, so its
event loop stays responsive; the parsing runs in the tasks
(:mod:`actors.controller.profiles.ray_rank_map`). While it runs, the profile's status says
how far it got ("analysing 12/64 ranks").

A failed or timed-out analysis never fails the profile: the manifest says
what went wrong. Past ``RAYPROF_POSTPROCESS_TIMEOUT_S`` the tasks are
cancelled and whatever the join managed to upload is deleted, so storage
never holds files that no manifest lists.
"""

from __future__ import annotations

import asyncio
import logging

import ray

from actors.controller.profiles.ray_rank_map import RayRankMap
from actors.controller.profiles.state import Profile
from orchestrator.analysis.postprocess import PostprocessResult, postprocess
from orchestrator.layout import MERGED_TRACE_NAME, REPORT_NAME
from orchestrator.models.profile import Manifest, PostprocessProgress
from orchestrator.models.requests import RankState
from orchestrator.storage import open_storage

__all__ = ["postprocess_in_task"]

logger = logging.getLogger(__name__)
_CANCEL_GRACE_S = 30.0  # for the join to notice the cancel (or finish an upload) before its files are removed


def _cluster_cpus() -> int:
    return int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1


async def postprocess_in_task(draft: Manifest, profile: Profile, timeout_s: float) -> Manifest:
    """``draft`` with the merged trace, report, summary and merge stats added, or with ``analysis_error`` set."""
    loop = asyncio.get_running_loop()

    def progress(p: PostprocessProgress) -> None:
        loop.call_soon_threadsafe(setattr, profile, "postprocess", p)

    # The nodes of the ranks that finished this window: each answered moments ago.
    nodes = {r.rank: r.node_id for r in draft.ranks if r.state == RankState.DONE and r.node_id}
    fan = RayRankMap(progress, in_flight=_cluster_cpus(), nodes=nodes)
    job = asyncio.ensure_future(
        asyncio.to_thread(postprocess, profile.storage, profile.prefix, draft, rank_map=fan)
    )
    try:
        result: PostprocessResult = await asyncio.wait_for(asyncio.shield(job), timeout_s)
    except asyncio.TimeoutError:  # wait_for's: not the builtin TimeoutError on 3.10
        fan.cancel()
        done, _ = await asyncio.wait([job], timeout=_CANCEL_GRACE_S)
        for finished in done:
            finished.exception()  # PostprocessCancelled is the expected end; retrieved so it is not logged as lost
        storage = open_storage(profile.storage).scoped(profile.prefix)
        for name in (MERGED_TRACE_NAME, REPORT_NAME):
            await asyncio.to_thread(storage.delete, name)
        logger.warning("rayprof controller: analysis of %s ran past %gs; cancelled", profile.id, timeout_s)
        return draft.model_copy(
            update={"analysis_error": f"analysis ran past its {timeout_s:g}s timeout (RAYPROF_POSTPROCESS_TIMEOUT_S)"}
        )
    except Exception as e:
        logger.warning("rayprof controller: analysis of %s failed: %s", profile.id, e)
        return draft.model_copy(update={"analysis_error": f"{type(e).__name__}: {str(e)[:500]}"})
    finally:
        loop.call_soon(setattr, profile, "postprocess", None)
    return draft.model_copy(update={"artifacts": result.artifacts, "summary": result.summary, "merge": result.merge})
