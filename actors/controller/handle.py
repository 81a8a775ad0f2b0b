"""Find the running control actor by name.

Agents import this to reach the controller; it imports only Ray, so a
training worker never loads the controller's planning, storage or analysis code.
"""

from __future__ import annotations

from typing import Any

import ray

from orchestrator.settings import CONTROLLER_NAME, CONTROLLER_NAMESPACE

__all__ = ["find_controller"]


def find_controller() -> Any:
    """Handle to the control actor, or ``None`` when none is running."""
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return None
