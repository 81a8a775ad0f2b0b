"""The controller's settings in force: one holder every part reads when it acts.

The settings are fixed at start but for the storage of new profiles, which ``configure`` and the
restore (the storage an earlier controller saved) change. Every part holds this one object and
calls it for the current settings, so a change reaches all of them at once and none keeps a copy.
"""

from __future__ import annotations

from typing import Any

from orchestrator.models.agent_protocol import StorageSpec
from orchestrator.models.control import ControllerConfig

__all__ = ["LiveConfig"]


class LiveConfig:
    """``config()``: the settings in force now."""

    def __init__(self, config: ControllerConfig) -> None:
        self._config = config

    def __call__(self) -> ControllerConfig:
        return self._config

    def use_storage(self, storage: StorageSpec) -> None:
        """New profiles go to ``storage`` from now on."""
        self.update(storage=storage)

    def update(self, **changes: Any) -> None:
        """Settings changed in force (validated as a whole, as at start)."""
        self._config = ControllerConfig.model_validate({**self._config.model_dump(), **changes})
