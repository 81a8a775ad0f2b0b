"""What a controller restart (or a worker's) must not leave wedged: a post-window check in progress,
a watch firing between its action and its save, a command queued to a worker that re-registered."""

from __future__ import annotations

from orchestrator.models.requests import ProfileRequest
from tests.fake_agents import MONITORED, make_controller, run, start_agents, status_when, wait_terminal


def test_a_post_window_check_in_progress_at_a_restart_ends_instead_of_staying_pending(home):
    # A check needs far more steps after the window than this run will make: it is pending when the
    # controller restarts, and the window was long enough for the pending check to be saved with it.
    settings = dict(MONITORED, post_window_steps=100_000)

    async def scenario():
        first = make_controller(home, **settings)
        agents = await start_agents(first, 2, step_s=0.05)
        await first.ping()
        submitted = await first.submit(ProfileRequest(target="run", steps=20))
        ended, _ = await wait_terminal(first, submitted.id, timeout_s=20)
        for a in agents:
            await a.stop()
        second = make_controller(home, **settings)
        await second.ping()
        restored = await second.get(submitted.id)
        later = await status_when(
            second, submitted.id, lambda s: s.post_window is not None and s.post_window.final, timeout_s=10
        )
        return ended, restored, later

    ended, restored, later = run(scenario(), timeout_s=60)
    assert ended.post_window is not None and ended.post_window.verdict == "pending"  # as saved
    assert restored.post_window is not None and not restored.post_window.final
    assert later.post_window is not None and later.post_window.final, later.post_window
    assert later.post_window.verdict == "unknown"
