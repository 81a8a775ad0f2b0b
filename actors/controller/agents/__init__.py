"""The workers the controller knows: registration, the long-poll, and when a run is gone."""
