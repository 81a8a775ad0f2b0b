"""The controller's gauges and their recorder process: what is sent, when the process is replaced, and what
a failing one costs. Driven by ticks' ``now``; the recorder runs here (tests/support/local_recorder.py)."""

from __future__ import annotations

from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.series import MAX_BACKOFF_S, REPLACE_EVERY, SEND_TIMEOUT_S, Series
from tests.support.local_recorder import LocalRecorders

_HOLD_S = 10.0
_LIVE = (m.STALLED.name, ("live",))
_GONE = (m.STALLED.name, ("gone",))
_STEP = (m.STEP_TIME.name, ("gone", "0"))


def _series() -> tuple[Series, LocalRecorders]:
    recorders = LocalRecorders()
    return Series(recorders, lambda: _HOLD_S), recorders


def _sent(recorders: LocalRecorders, i: int = -1) -> dict[tuple[str, tuple[str, ...]], float | None]:
    r = recorders.started[i]
    return {(n, labels): v for u in r.updates for n, labels, v in [*u.gauges, *u.ended]}


def test_a_controller_with_no_gauge_set_starts_no_recorder():
    series, recorders = _series()
    for now in range(5):
        series.flush(float(now))
    assert recorders.started == []


def test_an_ended_state_gauge_is_sent_its_final_value_and_a_step_time_keeps_its_last():
    series, recorders = _series()
    series.gauge(_GONE, 1.0)
    series.gauge(_STEP, 0.25)
    series.flush(0.0)
    series.end([_GONE, _STEP], {m.STALLED.name: 0.0}, 1.0)
    series.flush(1.0)
    ended = recorders.started[0].updates[-1].ended
    assert sorted(ended) == sorted([(*_GONE, 0.0), (*_STEP, None)])
    assert recorders.calls(m.STALLED)[-1][0] == 0.0 and recorders.calls(m.STEP_TIME)[-1][0] == 0.25


def test_the_recorder_is_replaced_after_the_hold_and_the_old_one_ends_once_the_new_one_answered():
    series, recorders = _series()
    series.gauge(_LIVE, 1.0)
    series.gauge(_GONE, 1.0)
    series.flush(0.0)
    series.end([_GONE], {m.STALLED.name: 0.0}, 1.0)
    now = 1.0
    while len(recorders.started) == 1 and now < 10 * REPLACE_EVERY * _HOLD_S:  # bounded
        now += 1.0
        series.flush(now)
    assert now == REPLACE_EVERY * _HOLD_S  # not before the earliest replacement
    old, new = recorders.started
    assert not old.closed  # the new one has not answered yet: live series would have a gap
    series.flush(now + 1.0)
    assert old.closed and not new.closed
    assert _sent(recorders) == {_LIVE: 1.0}
    # For the two minutes Ray 2.43 still exports the old process's series, its copy of a live one reads
    # 0: a dashboard's max over both shows the new value.
    assert old.updates[-1].ended == [(*_LIVE, 0.0)]


def test_an_idle_controller_ends_its_recorder_and_starts_none():
    series, recorders = _series()
    series.gauge(_GONE, 1.0)
    series.flush(0.0)
    series.end([_GONE], {m.STALLED.name: 0.0}, 0.0)
    for now in range(1, int(2 * REPLACE_EVERY * _HOLD_S)):
        series.flush(float(now))
    assert len(recorders.started) == 1 and recorders.started[0].closed
    assert series.shown() == 0


def test_a_label_set_ended_within_its_hold_moves_to_the_new_recorder_at_its_final_value():
    series, recorders = _series()
    for key in (_LIVE, _GONE, _STEP):
        series.gauge(key, 1.0)
    series.flush(0.0)
    series.end([_STEP], {}, 1.0)
    late = REPLACE_EVERY * _HOLD_S - 1.0
    series.end([_GONE], {m.STALLED.name: 0.0}, late)  # ended just before the replacement
    for now in (late, late + 1.0):
        series.flush(now)
    assert len(recorders.started) == 2
    assert _sent(recorders) == {_LIVE: 1.0, _GONE: 0.0}  # _STEP's hold was over: it is not carried


def test_a_recorder_that_fails_a_send_is_replaced_with_everything_live():
    series, recorders = _series()
    series.gauge(_LIVE, 1.0)
    series.gauge(_STEP, 0.5)
    series.flush(0.0)
    recorders.started[0].fail = RuntimeError("actor died")
    series.gauge(_LIVE, 2.0)
    series.flush(1.0)  # this send fails
    for now in range(2, 60):  # ticks: the first backoff is a few seconds
        series.flush(float(now))
    assert recorders.started[0].closed and len(recorders.started) == 2
    assert _sent(recorders) == {_LIVE: 2.0, _STEP: 0.5}


def test_changes_made_while_a_send_is_unanswered_are_merged_and_an_overdue_recorder_is_replaced():
    series, recorders = _series()
    series.gauge(_LIVE, 1.0)
    series.flush(0.0)
    recorders.started[0].answer = False
    series.gauge(_LIVE, 2.0)
    series.flush(1.0)  # sent, never answered
    for value in (3.0, 4.0, 5.0):
        series.gauge(_LIVE, value)
        series.flush(1.0 + value)
    assert len(recorders.started[0].updates) == 2  # nothing more sent while one is unanswered
    for now in range(int(SEND_TIMEOUT_S), int(2 * SEND_TIMEOUT_S)):  # overdue, then the first backoff
        series.flush(1.0 + now)
    assert recorders.started[0].closed and len(recorders.started) == 2
    assert _sent(recorders) == {_LIVE: 5.0}
    assert recorders.started[0].updates[-1].gauges == [(*_LIVE, 2.0)]  # a failed process is not sent more


def test_a_recorder_that_keeps_failing_is_started_again_after_a_growing_backoff_not_on_every_tick():
    recorders = LocalRecorders()
    failing = recorders.__call__

    def start():
        recorder = failing()
        recorder.fail = RuntimeError("the actor cannot start")
        return recorder

    series = Series(start, lambda: _HOLD_S)
    series.gauge(_LIVE, 1.0)
    hour = 3600
    for now in range(hour):
        series.flush(float(now))
    # 5, 10, 20, ... 300 s apart: 17 starts in an hour, not 1,800.
    assert 10 <= len(recorders.started) <= hour / MAX_BACKOFF_S + 8


def test_a_run_that_ends_in_the_tick_of_a_replacement_is_not_left_at_its_live_value_in_the_old_recorder():
    # The old process's series stay on Ray 2.43's endpoint for a minute or two after it ends: an ended
    # run's copy there must read its final value (0), not STALLED.
    series, recorders = _series()
    series.gauge(_LIVE, 1.0)
    series.gauge(_GONE, 1.0)
    series.gauge(_STEP, 0.5)
    series.flush(0.0)
    series.end([_STEP], {}, 1.0)
    due = REPLACE_EVERY * _HOLD_S
    series.end([_GONE], {m.STALLED.name: 0.0}, due)  # ends in the very tick the replacement is due
    series.flush(due)
    series.flush(due + 1.0)
    old = recorders.started[0]
    assert old.closed
    last = {tags["target"]: v for v, tags in old.metrics[m.STALLED.name].calls}
    assert last == {"live": 0.0, "gone": 0.0}



def test_a_recorder_in_the_controllers_process_is_never_replaced_and_ended_gauges_are_dropped_after_the_hold():
    # Where Ray's agent forgets a gauge that is set no more (a TTL), a second process would cost a Ray
    # worker for nothing: the gauges are set in the controller's process and an ended one just stops.
    recorders = LocalRecorders(own_process=False)
    series = Series(recorders, lambda: _HOLD_S)
    series.gauge(_LIVE, 1.0)
    series.gauge(_GONE, 1.0)
    series.flush(0.0)
    series.end([_GONE], {m.STALLED.name: 0.0}, 1.0)
    for now in range(1, int(3 * REPLACE_EVERY * _HOLD_S)):
        series.flush(float(now))
    assert len(recorders.started) == 1 and not recorders.started[0].closed
    assert recorders.started[0].updates[-1].ended == [(*_GONE, 0.0)]
    assert series.shown() == 1  # what is held of the ended gauge went with its hold
