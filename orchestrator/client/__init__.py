"""Client side: ``ProfilingClient`` over the control actor (in the cluster) or the HTTP service."""

from orchestrator.client.client import ProfileHandle, ProfilingClient

__all__ = ["ProfileHandle", "ProfilingClient"]
