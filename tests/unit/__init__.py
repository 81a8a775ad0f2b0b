"""Tests that run in this process (and at most a short child process): no Ray cluster, no service, no browser."""
