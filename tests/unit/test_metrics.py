"""The exported metrics' names, the Grafana dashboard's queries against them, and what the controller records."""

from __future__ import annotations

import itertools
import json
import re

from actors.controller.agents.registry import Worker
from actors.controller.diagnosis.health import Health
from actors.controller.monitoring import metric_names as m
from actors.controller.monitoring.metrics import Metrics
from actors.controller.monitoring.recorder import MetricUpdate
from orchestrator.models.agent_protocol import WorkerInfo
from orchestrator.models.diagnosis import WatchSpec
from orchestrator.models.post_window import PostWindowCheck, RankPostWindow
from orchestrator.models.requests import ProfileRequest
from tests.support.common import REPO
from tests.support.fake_agents import MONITORED, make_controller, run, start_agents, until, wait_terminal
from tests.support.local_recorder import LocalRecorder, LocalRecorders, RecordingMetric

DASHBOARD = REPO / "deploy" / "grafana" / "rayprof.json"
_SERIES = re.compile(r"\bray_rayprof_[a-z_]+")


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def test_names_follow_prometheus_conventions_and_labels_are_bounded():
    names = [d.name for d in m.METRICS]
    assert len(set(names)) == len(names)
    for d in m.METRICS:
        assert re.fullmatch(r"rayprof_[a-z_]+", d.name), d.name
        assert not d.name.endswith("_total"), "Ray's exporter adds _total to counters"
        assert d.kind != "histogram" or d.name.endswith("_seconds"), d.name
        assert set(d.tags) <= {"target", "rank", "outcome", "trigger", "condition", "result", "verdict"}, d.tags


def test_every_dashboard_query_names_an_exported_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {s for d in m.METRICS for s in m.exported(d)}
    queries = _queries(dashboard)
    assert queries
    for q in queries:
        used = _SERIES.findall(q)
        assert used, f"query names no rayprof metric: {q}"
        assert set(used) <= exported, f"{q}: {set(used) - exported} not exported"
    shown = {s for q in queries for s in _SERIES.findall(q)}
    # What a user opens it for: step time per rank, lag, stalls, profiles.
    for metric in (m.STEP_TIME, m.STEPS_BEHIND, m.STALLED, m.PROFILES):
        assert set(m.exported(metric)) & shown, metric.name


def test_the_controller_records_gauges_on_its_tick_and_counts_what_ended(home):
    async def scenario():
        recorded = LocalRecorders()
        c = make_controller(home, recorder=recorded, **MONITORED)
        metrics = c._telemetry._metrics
        assert isinstance(metrics, Metrics)
        counted = {name: RecordingMetric() for name in metrics._m}  # the counters and histograms
        metrics._m = counted
        agents = await start_agents(c, 2)
        await c.ping()
        status = await c.submit(ProfileRequest(target="run", steps=3))
        final, _ = await wait_terminal(c, status.id)
        await c.stacks("run")
        assert await until(lambda: recorded.calls(m.STEP_TIME) and recorded.calls(m.STEPS_BEHIND), timeout_s=10)
        # A watch that fires: every rank stops advancing, the target turns STALLED.
        await c.create_watch(WatchSpec(target="run", stalled=True, for_s=0, action="stacks", cooldown_s=0))
        for a in agents:
            a.training = False
        assert await until(lambda: counted[m.WATCH_FIRINGS.name].calls, timeout_s=15)
        for a in agents:
            await a.stop()
        assert counted[m.WATCH_FIRINGS.name].calls[0] == (1.0, {"target": "run", "condition": "stalled", "result": "ok"})
        step_ranks = {tags["rank"] for _, tags in recorded.calls(m.STEP_TIME)}
        assert step_ranks == {"0", "1"}
        assert all(tags["target"] == "run" for _, tags in recorded.calls(m.STEP_TIME))
        assert [v for v, _ in itertools.groupby(v for v, _ in recorded.calls(m.STALLED))] == [0.0, 1.0]  # training, then STALLED
        assert counted[m.PROFILES.name].calls == [(1.0, {"target": "run", "outcome": final.state.value, "trigger": "manual"})]
        assert [t["trigger"] for _, t in counted[m.STACKS.name].calls][0] == "manual"
        assert {t["outcome"] for _, t in counted[m.STACKS.name].calls} == {"DONE"}
        assert counted[m.STORED_BYTES.name].calls  # the ranks' files and the stacks bundle's
        assert counted[m.WINDOW_DURATION.name].calls[0][0] > 0

    run(scenario())



_HOLD_S = 150.0


def _worker(rank: int) -> Worker:
    info = WorkerInfo(
        agent_id=f"a{rank}", target="run", world_rank=rank, world_size=2, local_rank=rank, node_rank=0,
        node_id="n", host="h", pid=100 + rank, device="cpu", torch_version="2",
    )
    return Worker(info=info, registered_at=0.0, secret="s", seen_at=0.0, step=10, step_time_s=0.1, advanced_at=0.0)


def test_the_recorder_sets_every_live_gauge_again_on_its_refresh_so_rays_exporter_keeps_it():
    # Ray 2.60's metrics agent drops a gauge's label set that was not set for two export
    # periods (20 s by default): a target that stays not-STALLED must not vanish from Prometheus.
    local = LocalRecorder()
    local.send(MetricUpdate(gauges=[(m.STALLED.name, ("run",), 0.0), (m.STEP_TIME.name, ("run", "0"), 0.1)]))
    local.send(MetricUpdate(ended=[(m.STEP_TIME.name, ("run", "0"), None)]))
    local.recorder.refresh()
    assert [v for v, _ in local.metrics[m.STALLED.name].calls] == [0.0, 0.0]
    assert [v for v, _ in local.metrics[m.STEP_TIME.name].calls] == [0.1]  # ended: kept at its last value, set no more


def test_an_unchanged_gauge_is_sent_to_the_recorder_once():
    # At 1,024 ranks sending every gauge on every tick would be thousands of values a second for nothing.
    recorders = LocalRecorders()
    metrics = Metrics(recorders, lambda: _HOLD_S)
    workers = {0: _worker(0), 1: _worker(1)}
    healthy = Health(stalled=False, stalled_s=0.0, threshold_s=60.0, median_step_s=0.1)
    for now in (0.0, 0.4, 0.5, 0.9):  # the same whole second since each rank's last step
        metrics.run("run", workers, healthy, now)
        metrics.flush(now)
    sent = [v for u in recorders.started[0].updates for v in u.gauges]
    assert [v for v in sent if v[0] == m.STALLED.name] == [(m.STALLED.name, ("run",), 0.0)]
    assert len([v for v in sent if v[0] == m.STEPS_BEHIND.name]) == 2  # one per rank


def test_a_post_window_ratio_stays_exported_while_its_target_is_live():
    recorders = LocalRecorders()
    metrics = Metrics(recorders, lambda: _HOLD_S)
    check = PostWindowCheck(threshold=1.1, steps=5, verdict="ok", ranks=[RankPostWindow(rank=0, ratio=1.02)], detail="ok")
    metrics.post_window("run", check)
    healthy = Health(stalled=False, stalled_s=0.0, threshold_s=60.0, median_step_s=0.1)
    metrics.run("run", {0: _worker(0)}, healthy, 0.0)
    metrics.flush(0.0)
    recorders.started[0].recorder.refresh()
    assert [v for v, _ in recorders.calls(m.POST_WINDOW_RATIO)] == [1.02, 1.02]
