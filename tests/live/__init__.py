"""Tests against real parts: a local Ray cluster, the service, training jobs, a browser, network namespaces, a built wheel."""
