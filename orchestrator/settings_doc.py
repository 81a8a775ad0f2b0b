"""docs/configuration.md, generated: every setting of :mod:`orchestrator.settings` with its meaning.

The meaning of each ``RAYPROF_*`` variable lives here, beside the code that renders it; numeric
defaults are read from the ``DEFAULT_*`` constants, so the page cannot disagree with the code
(tests/unit/test_settings_doc.py checks that the page is current and that every setting has a row).
docs/generate.py writes the page (``make docs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import settings as s

__all__ = ["SECTIONS", "Row", "Section", "documented", "render"]

_MIB = 2**20


@dataclass(frozen=True)
class Row:
    """One line of the table: one variable, or a pair read together (default / largest)."""

    env_vars: tuple[str, ...]
    meaning: str
    # Shown as is; None: the DEFAULT_* constants of env_vars, formatted.
    default: str | None = None

    def default_text(self) -> str:
        if self.default is not None:
            return self.default
        return " / ".join(_format(_default_of(env)) for env in self.env_vars)


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    rows: tuple[Row, ...]


def _default_of(env: str) -> int | float:
    stem = next(name.removesuffix("_ENV_VAR") for name in dir(s) if name.endswith("_ENV_VAR") and getattr(s, name) == env)
    value = getattr(s, f"DEFAULT_{stem}")
    if not isinstance(value, int | float):
        raise TypeError(f"{env}: DEFAULT_{stem} is not a number; give the row its default text")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, int) and value >= _MIB and value % _MIB == 0:
        return f"{value // _MIB} MiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


SECTIONS: tuple[Section, ...] = (
    Section(
        'Storage',
        "Where profiles, bundles and the controller's state go. The location is configured on the cluster side, never by a request.",
        (
        Row((s.STORAGE_ENV_VAR,), 'a shared path (`/mnt/cluster_storage/rayprof`), `file:///path` or `s3://bucket/prefix`', '`/mnt/cluster_storage/rayprof` if that folder exists, else `/tmp/rayprof`'),
        Row((s.S3_ENDPOINT_URL_ENV_VAR,), 'S3-compatible endpoint, e.g. MinIO `http://minio:9000`', 'AWS'),
        Row((s.S3_REGION_ENV_VAR,), 'region', '`us-east-1`'),
        ),
    ),
    Section(
        'Windows and requests',
        'What one profiling window may record and how long requests wait.',
        (
        Row((s.MAX_STEPS_ENV_VAR,), 'most steps one window may record'),
        Row((s.MAX_WARMUP_STEPS_ENV_VAR,), 'most warmup steps'),
        Row((s.MAX_TRACE_BYTES_ENV_VAR,), 'most raw trace bytes one rank keeps per window: a larger trace is cut to its leading whole steps, and the next window with the same options is planned short enough to fit ([faults.md](faults.md))'),
        Row((s.REQUEST_TIMEOUT_S_ENV_VAR, s.MAX_REQUEST_TIMEOUT_S_ENV_VAR), 'default / largest per-request timeout'),
        Row((s.MAX_QUEUED_PER_TARGET_ENV_VAR,), 'queued requests per target'),
        Row((s.UPLOAD_RETRIES_ENV_VAR,), 'attempts per upload, with backoff'),
        Row((s.MAX_MERGED_BYTES_ENV_VAR,), "most raw bytes of `merged.trace.json.gz`: over it the merged view keeps every rank's step markers, collectives, copies and longest ops and kernels, and says what it dropped"),
        Row((s.SYNC_TIMEOUT_S_ENV_VAR,), "longest wait for fresh step counts before a window's start is chosen"),
        Row((s.POSTPROCESS_TIMEOUT_S_ENV_VAR,), 'longest merge + analysis of one profile (one Ray task per rank per step; `status` shows e.g. `analysing 12/64 ranks` meanwhile); past it the tasks are cancelled and the manifest says so'),
        ),
    ),
    Section(
        'Agents and the control loop',
        '',
        (
        Row((s.MEMORY_SNAPSHOT_MAX_ENTRIES_ENV_VAR,), 'newest allocator events a `memory_snapshot` keeps per rank (~1 KiB each with its Python stack; read in the workers)'),
        Row((s.FRAME_SAMPLE_MS_ENV_VAR,), "while a window records, how often the training thread's Python stack is sampled into the trace (`rayprof_frames`), so the report names waits that run no op (Ray Data's next batch, `ray.train.report()`) without `with_stack`; 0: never (read in the workers; at most "
            f"{s.FRAME_SAMPLES_MAX:,} samples a window)"),
        Row((s.OOM_HOLD_S_ENV_VAR,), 'under an OOM watch, how long the rank that ran out of CUDA memory waits, before the error reaches the job, for its snapshot to be stored (read in the workers)'),
        Row((s.POLL_TIMEOUT_S_ENV_VAR,), 'agent long-poll length; also the heartbeat'),
        Row((s.RELAY_MIN_WORLD_SIZE_ENV_VAR,), 'agents of a job with at least this many ranks poll through one relay per node (read in the workers); 0: never'),
        Row((s.WORKER_EXPIRY_GRACE_S_ENV_VAR,), 'a worker silent for poll timeout + this is gone'),
        Row((s.ARM_LEAD_S_ENV_VAR,), "the least lead (in training time) between choosing a window's start and the start; larger jobs get what arming them takes ([architecture.md](architecture.md))"),
        Row((s.DISCOVERY_INTERVAL_S_ENV_VAR,), 'how often an agent looks for the control actor until it finds it'),
        ),
    ),
    Section(
        'Retention and garbage collection',
        '',
        (
        Row((s.RETENTION_COUNT_ENV_VAR,), 'finished profiles and bundles a user asked for kept; older ones are deleted from storage'),
        Row((s.RETENTION_AUTO_COUNT_ENV_VAR,), 'finished profiles and bundles the controller took by itself (a watch, stacks on STALLED) kept; a budget of their own, so they only push out other automatic ones, never a requested one'),
        Row((s.RETENTION_DAYS_ENV_VAR,), 'finished profiles older than this are deleted from storage'),
        Row((s.GC_GRACE_HOURS_ENV_VAR,), "`rayprof gc` deletes a profile folder with no manifest, no saved state it can see and no live owner lease (a crashed postprocess's remains) once its profile is older than this"),
        Row((s.OWNER_LEASE_S_ENV_VAR,), "an unfinished profile's folder holds `owner.json`, renewed by its controller every third of this; no cluster's `gc` deletes a folder whose lease has not run out"),
        ),
    ),
    Section(
        'Stacks, stalls, watches',
        '',
        (
        Row((s.STACKS_TIMEOUT_S_ENV_VAR,), "how long `rayprof stacks` waits for every rank's answer"),
        Row((s.STACKS_MAX_RANK_BYTES_ENV_VAR,), "most bytes of one rank's stacks answer: over it the flight recorder dump, then the native frames' tail, other threads and outer frames are cut, and the bundle says so for that rank"),
        Row((s.STALL_MIN_S_ENV_VAR, s.STALL_STEP_FACTOR_ENV_VAR), 'a target is STALLED when no rank advanced for max(this, factor × its median step time), while a rank still heartbeats'),
        Row((s.STALL_AUTO_STACKS_ENV_VAR,), "1: on entering STALLED the controller takes every rank's stacks once by itself; 0: off"),
        Row((s.LAG_STEPS_ENV_VAR,), f'a rank this many steps behind the leader, and at least {s.LAG_MIN_S:g} s of the median step (heartbeats are dated on arrival), is named as lagging in `targets`'),
        Row((s.MONITOR_INTERVAL_S_ENV_VAR,), 'how often the controller checks stalls and watches (from heartbeats only)'),
        Row((s.MAX_WATCHES_ENV_VAR,), 'most watches one controller keeps'),
        Row((s.WATCH_MAX_FAILURES_ENV_VAR,), 'a watch whose action failed this many times in a row is PAUSED, its reason shown in `rayprof watches`, until it is deleted and created again'),
        ),
    ),
    Section(
        'Telemetry',
        "Read from heartbeats on the controller's monitor tick; nothing on the step path.",
        (
        Row((s.METRICS_ENV_VAR,), "export step time, lag, stalls and profile counts through Ray's metrics API (0: off)"),
        Row((s.METRICS_ENDED_KEPT_S_ENV_VAR,), "an ended run's gauges stay exported at their final value this long, then leave with the process that set them"),
        Row((s.HISTORY_ENV_VAR,), "keep each live run's step-time history per rank (0: off)"),
        Row((s.HISTORY_SAVE_INTERVAL_S_ENV_VAR,), 'how often the history is saved, so it survives a controller restart'),
        Row((s.POST_WINDOW_SLOWDOWN_ENV_VAR,), 'after a window, a rank slower than this x its steps before it is flagged ...'),
        Row((s.POST_WINDOW_STEPS_ENV_VAR,), '... once it stays so for more than this many steps ("the profiler may not have let go")'),
        ),
    ),
    Section(
        'Controller identity',
        '',
        (
        Row((s.CLUSTER_NAME_ENV_VAR,), "namespace of the controller's saved state; set it to keep history across clusters sharing one root", 'the Ray cluster id'),
        Row((s.CLUSTER_NAME_LEASE_S_ENV_VAR,), 'the controller holds a lease on its cluster name (`_rayprof/{cluster}/lease/{generation}.json`, each renewal a new record written only if absent), renewed every third of this; a controller of another live Ray cluster with the same name refuses to start (HTTP 503 `cluster_name_in_use`) until it has seen the renewals stand still this long by its own clock'),
        ),
    ),
    Section(
        'Service and CLI',
        '',
        (
        Row((s.TOKEN_FILE_ENV_VAR,), "a file holding the service's bearer token (read by the service and the CLI); keeps it out of argv and out of `runtime_env`; at least 16 characters", 'unset'),
        Row((s.TOKEN_ENV_VAR,), 'the bearer token itself (set at most one of the two); set but empty, or shorter than 16 characters, is a configuration error (CLI exit 2), never "no auth"', 'unset: no auth, loopback Host names only'),
        Row((s.ALLOWED_HOSTS_ENV_VAR,), 'comma-separated Host names a service *without* a token also answers (`*` for any); stops DNS rebinding', 'loopback names only'),
        Row((s.MCP_READ_ONLY_ENV_VAR,), "1 or true: the service's `/mcp` leaves out the tools that act (profile, take_stacks, create_watch, delete_watch), as `rayprof mcp --read-only` does; 0 or false: serves them; anything else is a configuration error. The app arg `mcp_read_only` (`rayprof serve --mcp-read-only`) wins over it"),
        Row((s.URL_ENV_VAR,), 'the service the CLI talks to', '`http://127.0.0.1:8000`'),
        Row((s.CACHE_DIR_ENV_VAR,), '`rayprof report ID` downloads each profile here (under `profiles/TARGET/ID`) and reuses the files whose checksum matches its manifest, so a profile reported again is not fetched again', '`$XDG_CACHE_HOME/rayprof`, else `~/.cache/rayprof`'),
        Row((s.CACHE_PROFILES_ENV_VAR,), 'how many of the most recently reported profiles the cache keeps; older ones are removed from it (never from storage)'),
        ),
    ),
)


def documented() -> list[str]:
    """Every variable the page names, in its order."""
    return [env for section in SECTIONS for row in section.rows for env in row.env_vars]


def render() -> str:
    out = [
        "# Configuration",
        "",
        "<!-- Generated by docs/generate.py (`make docs`) from",
        "orchestrator/settings_doc.py; edit there, not here. -->",
        "",
        "Every setting is an environment variable of the process that reads it: the control actor",
        "and the service (`rayprof serve` / the Serve app), or, where a row says so, the training",
        "workers (set it in the job's `runtime_env`). A malformed number is an error naming the variable, never a silent default.",
        "",
        "S3 credentials come only from the standard AWS chain (environment, shared config, instance",
        "role) of the training workers and the service; they are never part of a request, a manifest",
        "or a log line. `ProfilingClient.in_cluster(storage=..., s3_endpoint_url=...)` sets the storage",
        "for new profiles too.",
    ]
    for section in SECTIONS:
        out += ["", f"## {section.title}", ""]
        if section.intro:
            out += [section.intro, ""]
        out += ["| setting | meaning | default |", "|---|---|---|"]
        for row in section.rows:
            names = " / ".join(f"`{env}`" for env in row.env_vars)
            out.append(f"| {names} | {row.meaning} | {row.default_text()} |")
    return "\n".join(out) + "\n"
