"""Server configuration read from the environment: where profiles go and the controller's limits.

The one place a ``RAYPROF_*`` variable becomes a value; names and defaults
live in ``orchestrator.settings``.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator import settings as c
from orchestrator.auth import is_http_url
from orchestrator.errors import ConfigurationError
from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig

__all__ = ["cache_profiles", "controller_config", "default_storage_spec", "max_merged_bytes", "mcp_read_only", "report_cache"]


def controller_config(storage: StorageSpec | None = None) -> ControllerConfig:
    """Settings from ``RAYPROF_*`` env vars, defaults for the rest."""
    return ControllerConfig(
        storage=storage or default_storage_spec(),
        max_steps=c.env_int(c.MAX_STEPS_ENV_VAR, c.DEFAULT_MAX_STEPS),
        max_warmup_steps=c.env_int(c.MAX_WARMUP_STEPS_ENV_VAR, c.DEFAULT_MAX_WARMUP_STEPS),
        poll_timeout_s=c.env_float(c.POLL_TIMEOUT_S_ENV_VAR, c.DEFAULT_POLL_TIMEOUT_S),
        worker_expiry_grace_s=c.env_float(c.WORKER_EXPIRY_GRACE_S_ENV_VAR, c.DEFAULT_WORKER_EXPIRY_GRACE_S),
        arm_lead_s=c.env_float(c.ARM_LEAD_S_ENV_VAR, c.DEFAULT_ARM_LEAD_S),
        sync_timeout_s=c.env_float(c.SYNC_TIMEOUT_S_ENV_VAR, c.DEFAULT_SYNC_TIMEOUT_S),
        request_timeout_s=c.env_float(c.REQUEST_TIMEOUT_S_ENV_VAR, c.DEFAULT_REQUEST_TIMEOUT_S),
        max_request_timeout_s=c.env_float(c.MAX_REQUEST_TIMEOUT_S_ENV_VAR, c.DEFAULT_MAX_REQUEST_TIMEOUT_S),
        max_trace_bytes=c.env_int(c.MAX_TRACE_BYTES_ENV_VAR, c.DEFAULT_MAX_TRACE_BYTES),
        max_queued_per_target=c.env_int(c.MAX_QUEUED_PER_TARGET_ENV_VAR, c.DEFAULT_MAX_QUEUED_PER_TARGET),
        postprocess_timeout_s=c.env_float(c.POSTPROCESS_TIMEOUT_S_ENV_VAR, c.DEFAULT_POSTPROCESS_TIMEOUT_S),
        retention_count=c.env_int(c.RETENTION_COUNT_ENV_VAR, c.DEFAULT_RETENTION_COUNT),
        retention_days=c.env_float(c.RETENTION_DAYS_ENV_VAR, c.DEFAULT_RETENTION_DAYS),
        retention_auto_count=c.env_int(c.RETENTION_AUTO_COUNT_ENV_VAR, c.DEFAULT_RETENTION_AUTO_COUNT),
        gc_grace_hours=c.env_float(c.GC_GRACE_HOURS_ENV_VAR, c.DEFAULT_GC_GRACE_HOURS),
        cluster_name=os.environ.get(c.CLUSTER_NAME_ENV_VAR) or None,
        cluster_name_lease_s=c.env_float(c.CLUSTER_NAME_LEASE_S_ENV_VAR, c.DEFAULT_CLUSTER_NAME_LEASE_S),
        stacks_timeout_s=c.env_float(c.STACKS_TIMEOUT_S_ENV_VAR, c.DEFAULT_STACKS_TIMEOUT_S),
        stacks_max_rank_bytes=c.env_int(c.STACKS_MAX_RANK_BYTES_ENV_VAR, c.DEFAULT_STACKS_MAX_RANK_BYTES),
        owner_lease_s=c.env_float(c.OWNER_LEASE_S_ENV_VAR, c.DEFAULT_OWNER_LEASE_S),
        stall_min_s=c.env_float(c.STALL_MIN_S_ENV_VAR, c.DEFAULT_STALL_MIN_S),
        stall_step_factor=c.env_float(c.STALL_STEP_FACTOR_ENV_VAR, c.DEFAULT_STALL_STEP_FACTOR),
        stall_auto_stacks=bool(c.env_int(c.STALL_AUTO_STACKS_ENV_VAR, c.DEFAULT_STALL_AUTO_STACKS)),
        lag_steps=c.env_int(c.LAG_STEPS_ENV_VAR, c.DEFAULT_LAG_STEPS),
        monitor_interval_s=c.env_float(c.MONITOR_INTERVAL_S_ENV_VAR, c.DEFAULT_MONITOR_INTERVAL_S),
        max_watches=c.env_int(c.MAX_WATCHES_ENV_VAR, c.DEFAULT_MAX_WATCHES),
        watch_max_failures=c.env_int(c.WATCH_MAX_FAILURES_ENV_VAR, c.DEFAULT_WATCH_MAX_FAILURES),
        metrics=bool(c.env_int(c.METRICS_ENV_VAR, c.DEFAULT_METRICS)),
        metrics_ended_kept_s=c.env_float(c.METRICS_ENDED_KEPT_S_ENV_VAR, c.DEFAULT_METRICS_ENDED_KEPT_S),
        history=bool(c.env_int(c.HISTORY_ENV_VAR, c.DEFAULT_HISTORY)),
        history_save_interval_s=c.env_float(c.HISTORY_SAVE_INTERVAL_S_ENV_VAR, c.DEFAULT_HISTORY_SAVE_INTERVAL_S),
        post_window_slowdown=c.env_float(c.POST_WINDOW_SLOWDOWN_ENV_VAR, c.DEFAULT_POST_WINDOW_SLOWDOWN),
        post_window_steps=c.env_int(c.POST_WINDOW_STEPS_ENV_VAR, c.DEFAULT_POST_WINDOW_STEPS),
    )


def max_merged_bytes() -> int:
    """The merged trace's byte cap (``RAYPROF_MAX_MERGED_BYTES``), read where the merge runs."""
    return c.env_int(c.MAX_MERGED_BYTES_ENV_VAR, c.DEFAULT_MAX_MERGED_BYTES)


def report_cache() -> Path:
    """Where `rayprof report ID` downloads profiles: ``RAYPROF_CACHE_DIR``, else the XDG cache folder's ``rayprof``."""
    if found := os.environ.get(c.CACHE_DIR_ENV_VAR):
        return Path(found).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rayprof"


def cache_profiles() -> int:
    """How many downloaded profiles the report cache keeps (``RAYPROF_CACHE_PROFILES``, at least 1)."""
    kept = c.env_int(c.CACHE_PROFILES_ENV_VAR, c.DEFAULT_CACHE_PROFILES)
    if kept < 1:
        raise ConfigurationError(f"{c.CACHE_PROFILES_ENV_VAR}={kept} keeps no profile: use 1 or more")
    return kept


def storage_spec(
    uri: str, s3_endpoint_url: str | None = None, s3_region: str | None = None, *, endpoint_from: str = "S3 endpoint"
) -> StorageSpec:
    """A storage root as a user gives it (a flag, an app arg, ``RAYPROF_*`` env vars), checked there: an unsupported
    scheme, a bucketless ``s3://`` or an endpoint that is no URL is a :class:`ConfigurationError` before anything
    starts, naming where the endpoint came from (``endpoint_from``). A stored :class:`StorageSpec` is read back as
    it was written."""
    if s3_endpoint_url and not is_http_url(s3_endpoint_url):
        raise ConfigurationError(
            f"{endpoint_from} {s3_endpoint_url!r} is not a URL: use http://host:port (MinIO) or https://host"
        )
    return StorageSpec(uri=uri, s3_endpoint_url=s3_endpoint_url or None, s3_region=s3_region or None)


def default_storage_spec() -> StorageSpec:
    """The storage configured for this process through ``RAYPROF_*`` env vars."""
    uri = os.environ.get(c.STORAGE_ENV_VAR)
    if not uri:
        base = Path(c.CLUSTER_STORAGE_ROOT)
        uri = str(base / "rayprof") if base.is_dir() else str(Path("/tmp/rayprof"))
    return storage_spec(
        uri,
        os.environ.get(c.S3_ENDPOINT_URL_ENV_VAR),
        os.environ.get(c.S3_REGION_ENV_VAR),
        endpoint_from=c.S3_ENDPOINT_URL_ENV_VAR,
    )



_FLAG_VALUES = {"0": False, "1": True, "false": False, "true": True}


def mcp_read_only(value: object = None) -> bool:
    """Whether the service's ``/mcp`` leaves out the acting tools: ``value`` (the app arg
    ``mcp_read_only``) when given, else ``RAYPROF_MCP_READ_ONLY``, else off.

    Strict on purpose, as it narrows what an agent may do: a bool, 0/1, or the strings
    0/1/true/false (what ``serve run ... mcp_read_only=true`` passes); anything else raises
    :class:`~orchestrator.errors.ConfigurationError` rather than guessing.
    """
    if value is None:
        raw = os.environ.get(c.MCP_READ_ONLY_ENV_VAR, "")
        if raw == "":
            return bool(c.DEFAULT_MCP_READ_ONLY)
        source = c.MCP_READ_ONLY_ENV_VAR
    else:
        raw, source = value, "mcp_read_only"
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | str):
        found = _FLAG_VALUES.get(str(raw).strip().lower())
        if found is not None:
            return found
    raise ConfigurationError(f"{source}={raw!r} is not a flag: use 1 or true (read-only), 0 or false")
