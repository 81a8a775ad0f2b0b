"""Every place where Ray's APIs differ across the releases rayprof supports, and every Ray internal it uses.

Supported: Ray 2.43 through 2.x (``pyproject.toml``); CI runs the whole suite on
the newest and the live core path on the oldest (``make test-oldest-ray``).
Tried by hand as well: 2.40 and 2.47 (docs/deploy.md, How the range is tested, says how they did).
Which releases take which path:

- **Token auth**: ``ray.exceptions.AuthenticationError`` exists from 2.52 (a
  GCS refuses a wrong token; a ``ray.init()`` that starts a local cluster turns
  token auth on from 2.60). 2.43-2.51 have no token auth: :func:`auth_errors` is
  empty there, so the CLI's pre-flight check and its ``except`` never match.
- **Ray Train v1 and v2**: the agent reads the same context calls in both
  (``get_experiment_name``, ranks, ``get_storage().experiment_fs_path``). v2 is
  the default from 2.51 (``RAY_TRAIN_V2_ENABLED``), v1 before; v1 stays
  selectable with ``RAY_TRAIN_V2_ENABLED=0`` in every supported release, and v2
  with ``=1`` in 2.43-2.50 (2.40 has no v2: :func:`has_train_v2`). The agent does
  not branch on it; the live tests run it under both where both exist.
- **Serve's class-based ingress**: 2.43-2.52 bind a FastAPI route to the
  deployment only when the route function's ``__qualname__`` contains the
  class's name; 2.53 on also look along the class's MRO. :func:`ingress` names
  the routes of mixin classes after the deployment class, so both find them.
  2.43-2.56 also need FastAPI < 0.137: from 0.137 FastAPI nests included routers
  under a node holding a lock, which their Serve neither walks nor can pickle
  (2.57 walks them). Ray 2.47's Serve (and older) also reads ``FieldDescriptor.label``,
  which protobuf 7 removed (2.60 runs on protobuf 7). A cluster image of those
  releases has such versions; a fresh environment pins them
  (``deploy/constraints-ray-oldest.txt``, docs/deploy.md).
- **Idle gauges**: Ray 2.43's metrics agent (OpenCensus) exports a gauge's label
  set for the life of the process that set it; the OpenTelemetry agent with a
  gauge TTL (``OpenTelemetryMetricRecorder``'s, in 2.60, on unless
  ``RAY_enable_open_telemetry=0``) drops one not set for a while. Between them
  (2.44-2.5x) the boundary was not tried: :func:`agent_forgets_idle_gauges`
  probes for the TTL, and the controller sets its gauges in a process it
  replaces wherever it is missing (``actors/controller/monitoring/recorder.py``).
- **Internals** (no public call exists in any supported release): the cluster id
  and the job's submission id from ``ray._private.worker``; why an actor died,
  from the GCS's actor table (``ray._private.state``: the state API's
  ``get_actor`` needs the dashboard, which a cluster may run without); Serve's
  controller from ``ray.serve._private.constants``; the GCS client (``ray._raylet``); the
  running clusters on this machine (``ray._private.services``); Ray Train's
  switch (``ray.train.v2._internal.constants``); the metrics agent's gauge TTL
  (``ray._private.telemetry``, present or not). Each is used from here only.

Ray is imported inside each function: importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "actor_death",
    "agent_forgets_idle_gauges",
    "auth_errors",
    "cluster_id",
    "gcs_client",
    "has_train_v2",
    "ingress",
    "running_gcs_addresses",
    "serve_controller",
    "submission_id",
    "train_v2_enabled",
]


def auth_errors() -> tuple[type[BaseException], ...]:
    """Ray's error for a refused auth token; empty on releases without token auth."""
    import ray.exceptions

    error = getattr(ray.exceptions, "AuthenticationError", None)
    return (error,) if error is not None else ()


def gcs_client(address: str) -> Any:
    """A GCS client of the cluster at ``address`` (``host:port``): the one `ray job submit` uses."""
    from ray._raylet import GcsClient

    return GcsClient(address=address)


def cluster_id() -> str:
    """The connected Ray cluster's id (hex)."""
    from ray._private.worker import global_worker

    return global_worker.node.cluster_id.hex()


def submission_id() -> str | None:
    """The submission id of this process's Ray job (`ray job submit`), or None for a plain driver's."""
    from ray._private.worker import global_worker

    return global_worker.core_worker.get_job_config().metadata.get("job_submission_id")


def actor_death(actor_id: str) -> str | None:
    """Ray's own words for why the actor ``actor_id`` (hex) died (e.g. "The actor is dead because it was killed by
    `ray.kill`."), "" when it is dead and Ray says no more; None while the GCS does not hold it dead (alive,
    restarting, or unknown to it). Needs a connected Ray; one GCS call."""
    from ray._private import state

    info = state.actors(actor_id)
    if not info or info.get("State") != "DEAD":
        return None
    cause = info.get("DeathCause")
    kind = cause.WhichOneof("context") if cause is not None else None
    return str(getattr(getattr(cause, kind), "error_message", "")) if kind else ""


def serve_controller() -> Any:
    """Serve's controller actor; raises ValueError when Serve runs nowhere in this cluster."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)


def running_gcs_addresses() -> set[str]:
    """GCS addresses of the Ray clusters running on this machine."""
    from ray._private.services import find_gcs_addresses

    return set(find_gcs_addresses())


def ingress(app: Any) -> Callable[[type], type]:
    """``serve.ingress(app)`` that also binds routes a mixin base class defines, on every supported Ray.

    Serve 2.43-2.52 binds a route to the deployment only if the route function's
    ``__qualname__`` contains the deployment class's name; a mixin's methods
    (``ConsoleRoutes.get_artifact``) would stay unbound and answer 422 for a
    missing ``self``. Naming them after the deployment class satisfies that check
    and the MRO check of later releases alike.
    """
    from ray import serve

    def decorate(cls: type) -> type:
        for base in cls.__mro__[1:-1]:
            for name, member in vars(base).items():
                if callable(member) and getattr(member, "__qualname__", "").startswith(base.__qualname__ + "."):
                    member.__qualname__ = f"{cls.__qualname__}.{name}"
        return serve.ingress(app)(cls)

    return decorate


def has_train_v2() -> bool:
    """Whether this release has Ray Train v2 at all (2.40 has not; 2.43 has)."""
    import importlib.util

    return importlib.util.find_spec("ray.train.v2") is not None


def train_v2_enabled() -> bool:
    """Whether a Ray Train job started from this process's environment runs on Train v2 (``RAY_TRAIN_V2_ENABLED``,
    whose default is on from 2.51)."""
    if not has_train_v2():
        return False
    from ray.train.v2._internal.constants import is_v2_enabled

    return is_v2_enabled()


def agent_forgets_idle_gauges() -> bool:
    """Whether Ray's metrics agent drops a gauge's label set that was not set for a while (the OpenTelemetry
    path with a gauge TTL, on in this process's environment), rather than export it for the life of the
    process that set it."""
    try:
        from ray._private import ray_constants
        from ray._private.telemetry.open_telemetry_metric_recorder import OpenTelemetryMetricRecorder
    except ImportError:
        return False
    enabled = bool(getattr(ray_constants, "RAY_ENABLE_OPEN_TELEMETRY", False))
    return enabled and hasattr(OpenTelemetryMetricRecorder, "_resolve_gauge_ttl_seconds")
