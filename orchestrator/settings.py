"""Every tunable in one place: an ``X_ENV_VAR`` name and its ``DEFAULT_X``.

Server-side settings only. A profile request never names a storage location;
it is read from here by whoever creates the control actor.
"""

from __future__ import annotations

import os
from typing import Final

CONTROLLER_NAME = "rayprof-controller"
CONTROLLER_NAMESPACE = "rayprof"

STORAGE_ENV_VAR = "RAYPROF_STORAGE"
S3_ENDPOINT_URL_ENV_VAR = "RAYPROF_S3_ENDPOINT_URL"
S3_REGION_ENV_VAR = "RAYPROF_S3_REGION"

# Where profiles go when nobody configured a root: cluster storage on Anyscale,
# a local folder elsewhere (fine for one machine, not shared across nodes).
CLUSTER_STORAGE_ROOT = "/mnt/cluster_storage"

MAX_STEPS_ENV_VAR = "RAYPROF_MAX_STEPS"
DEFAULT_MAX_STEPS = 50

MAX_WARMUP_STEPS_ENV_VAR = "RAYPROF_MAX_WARMUP_STEPS"
DEFAULT_MAX_WARMUP_STEPS = 10

# Entries of the CUDA allocator's history a memory snapshot keeps (the newest); each costs ~1 KiB
# with its Python stack, so the default bounds a rank's snapshot near 100 MiB. Read in the workers.
MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR = "RAYPROF_MEMORY_SNAPSHOT_MAX_ENTRIES"
DEFAULT_MEMORY_SNAPSHOT_MAX_ENTRIES = 100_000

# While a window records, the training thread's Python stack is sampled every this many ms (0: never), so the
# report can name what the loop runs where no op does: Ray Data's iterator handing over a batch, Ray Train's
# report() (read in the workers; actors/agent/frame_sampler.py). At most FRAME_SAMPLES_MAX samples a window.
FRAME_SAMPLE_MS_ENV_VAR = "RAYPROF_FRAME_SAMPLE_MS"
DEFAULT_FRAME_SAMPLE_MS = 5.0
FRAME_SAMPLES_MAX = 20_000
# A window also times the process's garbage collections (actors/agent/gc_watch.py), keeping at most this many of
# those long enough to record one by one (each ~150 bytes in the trace).
GC_RECORDS_MAX = 2_000

# Under an OOM watch, how long the rank that ran out of CUDA memory holds the failing thread,
# before the exception reaches the job, for its snapshot to be stored (read in the workers).
OOM_HOLD_S_ENV_VAR = "RAYPROF_OOM_HOLD_S"
DEFAULT_OOM_HOLD_S = 10.0

# How long one long-poll from an agent may wait at the controller. It is also
# the heartbeat: a worker silent for POLL_TIMEOUT + WORKER_EXPIRY_GRACE is gone.
POLL_TIMEOUT_S_ENV_VAR = "RAYPROF_POLL_TIMEOUT_S"
DEFAULT_POLL_TIMEOUT_S = 10.0

# Agents of a job with at least this many ranks poll through one relay per node
# (actors.relay), so the controller answers nodes, not ranks; 0: never.
RELAY_MIN_WORLD_SIZE_ENV_VAR = "RAYPROF_RELAY_MIN_WORLD_SIZE"
DEFAULT_RELAY_MIN_WORLD_SIZE = 32

WORKER_EXPIRY_GRACE_S_ENV_VAR = "RAYPROF_WORKER_EXPIRY_GRACE_S"
DEFAULT_WORKER_EXPIRY_GRACE_S = 10.0

# The least lead of a window's start over the fastest rank, in seconds of training
# (larger jobs get what arming them takes); converted to steps with the measured
# step time, never fewer than MIN_LEAD_STEPS.
ARM_LEAD_S_ENV_VAR = "RAYPROF_ARM_LEAD_S"
DEFAULT_ARM_LEAD_S = 0.3
MIN_LEAD_STEPS = 3

# How long the controller waits for fresh step counts before it picks S.
SYNC_TIMEOUT_S_ENV_VAR = "RAYPROF_SYNC_TIMEOUT_S"
DEFAULT_SYNC_TIMEOUT_S = 2.0

REQUEST_TIMEOUT_S_ENV_VAR = "RAYPROF_REQUEST_TIMEOUT_S"
DEFAULT_REQUEST_TIMEOUT_S = 300.0
MAX_REQUEST_TIMEOUT_S_ENV_VAR = "RAYPROF_MAX_REQUEST_TIMEOUT_S"
DEFAULT_MAX_REQUEST_TIMEOUT_S = 3600.0

MAX_TRACE_BYTES_ENV_VAR = "RAYPROF_MAX_TRACE_BYTES"
DEFAULT_MAX_TRACE_BYTES = 512 * 1024 * 1024

# Raw (uncompressed) JSON bytes of merged.trace.json.gz; past it the merge keeps
# step markers, collectives, copies and the longest ops and kernels.
MAX_MERGED_BYTES_ENV_VAR = "RAYPROF_MAX_MERGED_BYTES"
DEFAULT_MAX_MERGED_BYTES = 256 * 1024 * 1024

MAX_QUEUED_PER_TARGET_ENV_VAR = "RAYPROF_MAX_QUEUED_PER_TARGET"
DEFAULT_MAX_QUEUED_PER_TARGET = 8

# Merging and analysing a profile's traces, after every rank reported.
POSTPROCESS_TIMEOUT_S_ENV_VAR = "RAYPROF_POSTPROCESS_TIMEOUT_S"
DEFAULT_POSTPROCESS_TIMEOUT_S = 600.0

# Finished profiles kept: the newest RETENTION_COUNT, none older than RETENTION_DAYS.
# Older ones are deleted from storage (their folder and saved state).
RETENTION_COUNT_ENV_VAR = "RAYPROF_RETENTION_COUNT"
DEFAULT_RETENTION_COUNT = 1000
RETENTION_DAYS_ENV_VAR = "RAYPROF_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 30.0
# Bundles and profiles the controller took by itself (watches, stacks on STALLED) have
# their own budget: they only ever push out other automatic ones, never a requested one.
RETENTION_AUTO_COUNT_ENV_VAR = "RAYPROF_RETENTION_AUTO_COUNT"
DEFAULT_RETENTION_AUTO_COUNT = 100

# `rayprof gc` deletes profile folders with no manifest and no saved state (a
# crashed postprocess's remains) once their profile is older than this.
GC_GRACE_HOURS_ENV_VAR = "RAYPROF_GC_GRACE_HOURS"
DEFAULT_GC_GRACE_HOURS = 24.0
# Longest grace a gc request may ask for (ten years): past it a date cannot be computed.
MAX_GC_GRACE_HOURS = 87_600.0
# An unfinished profile's folder holds owner.json, renewed by its controller every third of this: any
# cluster's `gc` keeps a folder whose lease has not run out. Longer than a controller restart.
OWNER_LEASE_S_ENV_VAR = "RAYPROF_OWNER_LEASE_S"
DEFAULT_OWNER_LEASE_S = 900.0

# Saved controller state is kept per cluster; set a name to keep history
# across clusters that share one storage root (default: the Ray cluster id).
CLUSTER_NAME_ENV_VAR = "RAYPROF_CLUSTER_NAME"
# A controller holds a lease on its cluster name's saved state and renews it every third of
# this; a controller of another Ray cluster with the same name refuses to start until it expires.
CLUSTER_NAME_LEASE_S_ENV_VAR = "RAYPROF_CLUSTER_NAME_LEASE_S"
DEFAULT_CLUSTER_NAME_LEASE_S = 60.0

# Stacks of every rank: how long the controller waits for the ranks' answers.
STACKS_TIMEOUT_S_ENV_VAR = "RAYPROF_STACKS_TIMEOUT_S"
DEFAULT_STACKS_TIMEOUT_S = 10.0
# Most bytes of one rank's stacks answer (JSON): over it the rank cuts the flight recorder dump, native
# frames, other threads, outer frames (the bundle says what). Each answer is stored as it arrives, so
# the controller holds at most the answers in flight, not every rank's.
STACKS_MAX_RANK_BYTES_ENV_VAR = "RAYPROF_STACKS_MAX_RANK_BYTES"
DEFAULT_STACKS_MAX_RANK_BYTES = 8 * 2**20
MIN_STACKS_MAX_RANK_BYTES = 64 * 2**10

# A target is STALLED when no rank advanced for max(STALL_MIN_S, STALL_STEP_FACTOR x its median step time).
STALL_MIN_S_ENV_VAR = "RAYPROF_STALL_MIN_S"
DEFAULT_STALL_MIN_S = 60.0
STALL_STEP_FACTOR_ENV_VAR = "RAYPROF_STALL_STEP_FACTOR"
DEFAULT_STALL_STEP_FACTOR = 20.0
# On entering STALLED the controller takes every rank's stacks once by itself (0 turns it off).
STALL_AUTO_STACKS_ENV_VAR = "RAYPROF_STALL_AUTO_STACKS"
DEFAULT_STALL_AUTO_STACKS = 1
# A rank this many steps behind the leader is named as lagging in `targets`.
LAG_STEPS_ENV_VAR = "RAYPROF_LAG_STEPS"
DEFAULT_LAG_STEPS = 3
# ... and that many steps must come to this much time at the median step: heartbeats are dated on arrival, and
# two ranks' can arrive tens of milliseconds apart, several steps of a fast job in lockstep.
LAG_MIN_S = 0.25
# How often the controller checks health and watches (it reads heartbeats only; no call to any rank).
MONITOR_INTERVAL_S_ENV_VAR = "RAYPROF_MONITOR_INTERVAL_S"
DEFAULT_MONITOR_INTERVAL_S = 1.0
# Most watches one controller keeps.
MAX_WATCHES_ENV_VAR = "RAYPROF_MAX_WATCHES"
DEFAULT_MAX_WATCHES = 100
# A watch whose action failed this many times in a row is paused (its reason shown) until recreated.
WATCH_MAX_FAILURES_ENV_VAR = "RAYPROF_WATCH_MAX_FAILURES"
DEFAULT_WATCH_MAX_FAILURES = 3

# The controller's telemetry, all read from heartbeats on its monitor tick (nothing on the step path):
# step-time, lag and stall series and profile counts through Ray's metrics API (0 turns them off) ...
METRICS_ENV_VAR = "RAYPROF_METRICS"
DEFAULT_METRICS = 1
# An ended run's gauges stay exported at their final value at least this long (two of Prometheus'
# default scrape intervals), then leave with the recorder process that set them; that process is
# replaced at most every 4x this (actors/controller/monitoring/series.py).
METRICS_ENDED_KEPT_S_ENV_VAR = "RAYPROF_METRICS_ENDED_KEPT_S"
DEFAULT_METRICS_ENDED_KEPT_S = 150.0
# ... and each live run's step-time history per rank (0 turns it off), saved this often so it
# survives a controller restart.
HISTORY_ENV_VAR = "RAYPROF_HISTORY"
DEFAULT_HISTORY = 1
HISTORY_SAVE_INTERVAL_S_ENV_VAR = "RAYPROF_HISTORY_SAVE_INTERVAL_S"
DEFAULT_HISTORY_SAVE_INTERVAL_S = 300.0
# A run with no live worker for this long is forgotten: its history, the series its watches compare
# against, its stall's stacks, its metrics and the agents it retired (a long-lived controller sees
# thousands of runs, each with a unique name).
DEFAULT_ENDED_RUN_KEPT_S = 3600.0
# After a window, a rank whose steps stay over POST_WINDOW_SLOWDOWN x its steps before the window
# for more than POST_WINDOW_STEPS steps is reported: the profiler may not have let go.
POST_WINDOW_SLOWDOWN_ENV_VAR = "RAYPROF_POST_WINDOW_SLOWDOWN"
DEFAULT_POST_WINDOW_SLOWDOWN = 1.1
POST_WINDOW_STEPS_ENV_VAR = "RAYPROF_POST_WINDOW_STEPS"
DEFAULT_POST_WINDOW_STEPS = 50

UPLOAD_RETRIES_ENV_VAR = "RAYPROF_UPLOAD_RETRIES"
DEFAULT_UPLOAD_RETRIES = 5

MULTIPART_THRESHOLD_BYTES = 16 * 1024 * 1024

# Agents wait this long between attempts to find the control actor.
DISCOVERY_INTERVAL_S_ENV_VAR = "RAYPROF_DISCOVERY_INTERVAL_S"
DEFAULT_DISCOVERY_INTERVAL_S = 2.0

# The service's bearer token: the token itself, or a file that holds it (kept
# out of argv, where `ps` shows it, and out of runtime_env, where the dashboard does).
TOKEN_ENV_VAR = "RAYPROF_TOKEN"
TOKEN_FILE_ENV_VAR = "RAYPROF_TOKEN_FILE"

# Host names a service without a token answers (comma-separated, added to the
# loopback names; "*" for any). Stops DNS rebinding from a browser on this machine.
ALLOWED_HOSTS_ENV_VAR = "RAYPROF_ALLOWED_HOSTS"
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1")

# 1: the service's /mcp leaves out the tools that act on jobs (profile, take_stacks, create_watch,
# delete_watch), as `rayprof mcp --read-only` does; the app arg `mcp_read_only` wins over it.
MCP_READ_ONLY_ENV_VAR = "RAYPROF_MCP_READ_ONLY"
DEFAULT_MCP_READ_ONLY = 0

# Where the CLI and HTTP client find the service, and the Serve app's name.
URL_ENV_VAR = "RAYPROF_URL"
DEFAULT_URL = "http://127.0.0.1:8000"
SERVE_APP_NAME = "rayprof"
# Where `rayprof report ID` keeps the profiles it downloads, so one reported again is not fetched again (default
# $XDG_CACHE_HOME/rayprof, else ~/.cache/rayprof), and how many of the latest reported it keeps: each can be GBs.
CACHE_DIR_ENV_VAR = "RAYPROF_CACHE_DIR"
CACHE_PROFILES_ENV_VAR = "RAYPROF_CACHE_PROFILES"
DEFAULT_CACHE_PROFILES = 10

# Longest ?wait_s= long-poll over HTTP, kept well under proxy and client idle timeouts.
MAX_HTTP_WAIT_S = 30.0

# The span `rayprof history` and GET /v1/targets/{t}/history show by default, and the most one may ask.
DEFAULT_HISTORY_SPAN_S = 600.0
MAX_HISTORY_SPAN_S = 86_400.0
# Most points one history answer holds (all ranks together), and the most one may ask: past it the
# controller answers per-bucket min/median/max of the slowest ranks and one band of every rank
# (10 minutes at 1,024 ranks is 613k points, 26 MB, unbounded).
DEFAULT_HISTORY_MAX_POINTS = 4096
MAX_HISTORY_MAX_POINTS = 200_000

# Profiles per page of a list (HTTP, client, CLI), and the most one page may hold.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000

MANIFEST_VERSION: Final = 1


def env_float(name: str, default: float) -> float:
    """Read a float setting, failing loudly on a malformed value."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    """Read an integer setting, failing loudly on a malformed value."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
