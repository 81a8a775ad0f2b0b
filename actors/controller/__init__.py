"""The control actor (``rayprof-controller``): registry of workers and the life of every profile.

Modules: ``handle`` finds the running actor (light: agents import it),
``actor`` is the Ray actor (RPC surface and worker registry), ``state`` the
profile state machine, ``planning`` the pure decisions, ``persistence`` saving
and restoring state. Import the module you need; this file imports nothing so
that ``actors.controller.handle`` stays cheap.
"""
