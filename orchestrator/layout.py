"""Where every file of a profile lives, and the one parser of each name.

Storage layout (keys relative to the storage root)::

    {target}/{profile_id}/
      traces/rank{R}.{host}.{pid}.pt.trace.json.gz
      memory/rank{R}.memory_timeline.json.gz
      memory/rank{R}.snapshot.pickle      with memory_snapshot: the CUDA allocator's history (torch's format)
      memory/rank{R}.snapshot.html        ... and its page, which needs no internet
      ops/rank{R}.key_averages.csv
      merged.trace.json.gz
      report.html
      stacks/rank{R}.txt                 a stacks bundle (kind "stacks"): each rank's stacks, as text
      stacks/rank{R}.flight_recorder.json   the rank's torch flight recorder dump, where one is kept
      stacks.json                        the grouped stacks of every rank
      manifest.json                      written last: the commit point
      owner.json                         while unfinished: its controller's lease (actors/controller/saved/leases.py)
    _rayprof/{cluster}/profiles/{profile_id}.json  a controller's saved state, per Ray cluster
    _rayprof/{cluster}/history/{target}/{run}.bin.gz  a run's step-time history (the run name URL-quoted)
    _rayprof/{cluster}/index.json                  summaries of its finished profiles: a restart reads one file
    _rayprof/{cluster}/storage.json                the storage configured at run time
    _rayprof/{cluster}/watches/{watch_id}.json     a watch, kept across controller restarts
    _rayprof/{cluster}/lease/{generation}.json     which Ray cluster's controller holds the name (its last renewals)

Every key is made here. Keys in the rank tables are relative to the profile's folder: a caller
writes them through ``storage.scoped(profile_prefix(...))`` (orchestrator/storage/base.py), so
nothing joins a folder and a name by hand (tests/unit/test_one_home.py fails on one that does).

Standard library only (and orchestrator.errors, which is too): the export child process imports
it and must start fast.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlparse

from orchestrator.errors import ConfigurationError

__all__ = [
    "MANIFEST_NAME",
    "MAX_STEP_DIGITS",
    "HISTORY_SUFFIX",
    "MERGED_TRACE_NAME",
    "OWNER_NAME",
    "REPORT_NAME",
    "STACKS_NAME",
    "TRACE_SUFFIXES",
    "STATE_ROOT",
    "cluster_state_prefix",
    "config_key",
    "history_key",
    "history_prefix",
    "id_created_at",
    "index_key",
    "lease_prefix",
    "lease_record_key",
    "manifest_key",
    "normalize_uri",
    "owner_key",
    "parse_profiler_step",
    "parse_trace_name",
    "profile_id",
    "profile_prefix",
    "profile_uri",
    "rank_artifact_keys",
    "rank_in_name",
    "rank_stacks_keys",
    "state_key",
    "state_prefix",
    "watch_key",
    "watches_prefix",
]

MANIFEST_NAME = "manifest.json"
MERGED_TRACE_NAME = "merged.trace.json.gz"
OWNER_NAME = "owner.json"
REPORT_NAME = "report.html"
STACKS_NAME = "stacks.json"
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
STATE_ROOT = "_rayprof"

# prof-YYYYmmdd-HHMMSS-hex8 (a profile) or stk-... (a stacks bundle): the time it was made, UTC.
_ID = re.compile(r"^(?:prof|stk)-(\d{8}-\d{6})-[0-9a-f]{8}$")
_ID_TIME = "%Y%m%d-%H%M%S"
# A longer "step number" is no step count (and int() refuses 4,300 digits).
MAX_STEP_DIGITS = 18
_PROFILER_STEP = re.compile(rf"^ProfilerStep#(\d{{1,{MAX_STEP_DIGITS}}})$")
# rank{R}.{host}.{pid}.pt.trace.json[.gz], as the capture pipeline names traces.
_PIPELINE_NAME = re.compile(r"^rank(\d+)\.(.+)\.(\d+)\.pt\.trace\.json(?:\.gz)?$")
# "rank3" anywhere in other tools' names (HTA's rank-3.json, PARAM's *_rank3.*).
_RANK_IN_NAME = re.compile(r"(?:^|[._-])rank[_-]?(\d+)(?=[._-]|$)", re.IGNORECASE)
HISTORY_SUFFIX = ".bin.gz"


def normalize_uri(uri: str) -> str:
    """A storage root's one form: ``s3://b/p`` stays (no trailing slash); a plain or ``file://`` path
    becomes an absolute ``file://`` URI. Applied by :class:`~orchestrator.models.agent_protocol.StorageSpec`
    itself, so every spec holds a normalized root."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConfigurationError(f"storage {uri!r} names no bucket; use s3://bucket/prefix")
        return uri.rstrip("/")
    if parsed.scheme == "file":
        return Path(parsed.path).expanduser().resolve().as_uri()
    if parsed.scheme == "":
        return Path(uri).expanduser().resolve().as_uri()
    raise ConfigurationError(f"unsupported storage {uri!r}: use a path, file:///path or s3://bucket/prefix")


def profile_prefix(target: str, profile_id: str) -> str:
    """Folder of one profile, relative to the storage root."""
    return f"{target}/{profile_id}"


def profile_uri(root_uri: str, target: str, profile_id: str) -> str:
    """Full URI of one profile's folder under the storage root ``root_uri`` (normalized, no trailing slash)."""
    return f"{root_uri}/{profile_prefix(target, profile_id)}"


def manifest_key(target: str, profile_id: str) -> str:
    """Key of a profile's manifest, relative to the storage root."""
    return f"{profile_prefix(target, profile_id)}/{MANIFEST_NAME}"


def owner_key(target: str, profile_id: str) -> str:
    """Key of an unfinished profile's owner lease, relative to the storage root."""
    return f"{profile_prefix(target, profile_id)}/{OWNER_NAME}"


def cluster_state_prefix(cluster: str) -> str:
    """Folder of everything one cluster's controller keeps (its profiles' state, index, lease, watches...)."""
    return f"{STATE_ROOT}/{cluster}"


def state_prefix(cluster: str) -> str:
    """Folder of one cluster's saved controller state."""
    return f"{cluster_state_prefix(cluster)}/profiles"


def state_key(cluster: str, profile_id: str) -> str:
    """Key of a profile's saved controller state."""
    return f"{state_prefix(cluster)}/{profile_id}.json"


def index_key(cluster: str) -> str:
    """Key of the index of a cluster's finished profiles."""
    return f"{cluster_state_prefix(cluster)}/index.json"


def lease_prefix(cluster: str) -> str:
    """Folder of the lease a live controller holds on its cluster name: one record per renewal."""
    return f"{cluster_state_prefix(cluster)}/lease"


def lease_record_key(cluster: str, generation: int) -> str:
    """Key of one renewal of the cluster name's lease (zero-padded: keys sort as generations do)."""
    return f"{lease_prefix(cluster)}/{generation:020d}.json"


def profile_id(kind: str, at: datetime, suffix: str) -> str:
    """A new profile's id (``kind`` ``prof`` or ``stk``): sorts by time, and says when it was made."""
    return f"{kind}-{at.strftime(_ID_TIME)}-{suffix}"


def id_created_at(name: str) -> datetime | None:
    """When the profile of id ``name`` was made, else ``None`` for a name rayprof did not give."""
    m = _ID.match(name)
    return datetime.strptime(m.group(1), _ID_TIME).replace(tzinfo=timezone.utc) if m else None


def config_key(cluster: str) -> str:
    """Key of the storage a cluster's controller was configured with at run time."""
    return f"{cluster_state_prefix(cluster)}/storage.json"


def watches_prefix(cluster: str) -> str:
    """Folder of one cluster's saved watches."""
    return f"{cluster_state_prefix(cluster)}/watches"


def watch_key(cluster: str, watch_id: str) -> str:
    """Key of one saved watch."""
    return f"{watches_prefix(cluster)}/{watch_id}.json"


def history_prefix(cluster: str) -> str:
    """Folder of one cluster's saved step-time histories."""
    return f"{cluster_state_prefix(cluster)}/history"


def history_key(cluster: str, target: str, run: str) -> str:
    """Key of one run's saved step-time history (a run name may hold any character: quoted)."""
    return f"{history_prefix(cluster)}/{target}/{quote(run, safe='')}{HISTORY_SUFFIX}"


def rank_stacks_keys(rank: int) -> dict[str, str]:
    """Keys of one rank's files in a stacks bundle, relative to its folder, by artifact kind."""
    return {
        "stacks": f"stacks/rank{rank}.txt",
        "flight_recorder": f"stacks/rank{rank}.flight_recorder.json",
    }


def rank_artifact_keys(rank: int, host: str, pid: int) -> dict[str, str]:
    """Keys of one rank's artifacts, relative to the profile's folder, by artifact kind."""
    return {
        "trace": f"traces/rank{rank}.{host}.{pid}{TRACE_SUFFIXES[1]}",
        "memory_timeline": f"memory/rank{rank}.memory_timeline.json.gz",
        "op_table": f"ops/rank{rank}.key_averages.csv",
        "memory_snapshot": f"memory/rank{rank}.snapshot.pickle",
        "memory_view": f"memory/rank{rank}.snapshot.html",
    }


def parse_trace_name(name: str) -> tuple[int, str, int] | None:
    """``(rank, host, pid)`` of a trace file named by the capture pipeline, else ``None``."""
    m = _PIPELINE_NAME.match(name)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def rank_in_name(name: str) -> int | None:
    """A rank written into a file name by any tool (``rank3``, ``rank-3``, ``rank_3``), else ``None``."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def parse_profiler_step(name: str) -> int | None:
    """The global step of a ``ProfilerStep#N`` span name, else ``None``."""
    m = _PROFILER_STEP.match(name)
    return int(m.group(1)) if m else None
