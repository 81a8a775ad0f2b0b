"""A client of one rayprof release with a service, a stored profile or a downloaded folder of another.

Every release adds fields. What a process only reads (the service's answers, a manifest) it reads leniently,
leaving out what it does not know; a request carries only what its caller set; and what still does not fit is
an ``IncompatibleRecordError`` that says so, never a usage error. The newer records here are real ones (a
profile the real service in process ran, the analysis of a recorded trace) with fields added at several depths.
"""

from __future__ import annotations

import copy
import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import ProfilingClient
from orchestrator.analysis.diff_inputs import load_folder
from orchestrator.analysis.front import analyze_folder
from orchestrator.cli.main import main
from orchestrator.client import http as http_backend
from orchestrator.errors import EXIT_FAILED, IncompatibleRecordError
from orchestrator.layout import MANIFEST_NAME, manifest_key
from orchestrator.manifest import read_manifest
from orchestrator.mcp.tool_errors import tool_error
from orchestrator.models.analysis import Summary
from orchestrator.models.common import read_lenient
from orchestrator.models.profile import Manifest
from orchestrator.models.requests import ProfileRequest
from orchestrator.settings import ALLOWED_HOSTS_ENV_VAR, TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR
from orchestrator.storage import open_storage
from tests.support.fake_agents import make_controller, run, start_agents, wait_terminal
from tests.support.inprocess_service import service_client

DATA = Path(__file__).resolve().parents[1] / "data"
LATER = {"added_by_a_later_release": {"kind": "anything", "values": [1, 2]}}


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    for name in (TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, ALLOWED_HOSTS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    """The analysis of a recorded two-rank trace, as this release writes it."""
    return analyze_folder(DATA / "traces" / "straggler").model_dump(mode="json")


@pytest.fixture
def served(home, monkeypatch, summary) -> dict[str, Any]:
    """A profile the real service in process ran to DONE with fake agents: its status and manifest answers,
    the manifest carrying the analysis (the fake agents' profiles are not analysed)."""

    async def go():
        c = make_controller(home)
        agents = await start_agents(c, 2)
        async with service_client(monkeypatch, c) as http:
            submitted = (await http.post("/v1/profiles", json={"target": "run", "steps": 2})).json()
            await wait_terminal(c, submitted["id"])
            status = (await http.get(f"/v1/profiles/{submitted['id']}")).json()
            manifest = (await http.get(f"/v1/profiles/{submitted['id']}/manifest")).json()
        for a in agents:
            await a.stop()
        return status, manifest

    status, manifest = run(go())
    return {"status": status, "manifest": {**manifest, "summary": summary}}


def later(record: dict[str, Any], *paths: tuple[Any, ...]) -> dict[str, Any]:
    """``record`` as a later release writes it: new fields at its top and in each object at ``paths``."""
    newer = copy.deepcopy(record)
    for path in ((), *paths):
        place = newer
        for part in path:
            place = place[part]
        place.update(LATER)
    return newer


# Objects of four kinds of model, three levels down, as between_ms arrived in StepBreakdown.
SUMMARY_DEPTHS = [("ranks", 0), ("ranks", 0, "steps", 0), ("ranks", 0, "mean_phases"), ("findings", 0)]


class Service:
    """A service of another release, as the HTTP client meets it: fixed answers by path; the requests it got."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json=self.answers[request.url.path])


def _client(service: Service) -> ProfilingClient:
    return ProfilingClient(backend=http_backend.HttpBackend("http://svc", transport=httpx.MockTransport(service)))


def _answers(status: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    path = f"/v1/profiles/{status['id']}"
    return {path: status, f"{path}/manifest": manifest}


def test_a_status_from_a_newer_service_reads_without_the_fields_this_client_does_not_know(served):
    status = served["status"]
    newer = later(status, ("request",), ("ranks", 0))
    today = _client(Service(_answers(status, served["manifest"]))).get(status["id"]).status()

    read = _client(Service(_answers(newer, served["manifest"]))).get(status["id"]).status()

    assert read == today and read.state.value == status["state"] == "DONE"


def test_a_manifest_from_a_newer_service_reads_with_its_analysis(served):
    status, manifest = served["status"], served["manifest"]
    newer = later(manifest, ("ranks", 0), *[("summary", *depth) for depth in SUMMARY_DEPTHS])
    today = _client(Service(_answers(status, manifest))).get(status["id"]).manifest()

    read = _client(Service(_answers(status, newer))).get(status["id"]).manifest()

    assert read == today
    assert read.summary is not None and read.summary.findings[0].code == manifest["summary"]["findings"][0]["code"]


def test_an_answer_that_does_not_fit_is_an_incompatible_record_naming_the_field(served):
    status = dict(served["status"])
    status["phase"] = status.pop("state")  # a field renamed: no leniency reads that
    client = _client(Service(_answers(status, served["manifest"])))

    with pytest.raises(IncompatibleRecordError, match=r"the service's answer cannot be read .*state: Field required"):
        client.get(status["id"])


def test_the_cli_calls_an_unreadable_answer_another_release_not_a_usage_error(served, monkeypatch, capsys):
    status = dict(served["status"])
    status["phase"] = status.pop("state")
    service = Service(_answers(status, served["manifest"]))
    monkeypatch.setattr(http_backend, "HttpBackend", partial(http_backend.HttpBackend, transport=httpx.MockTransport(service)))

    code = main(["status", status["id"], "--url", "http://svc", "--json"])

    assert code == EXIT_FAILED
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "incompatible_record" and "another rayprof release" in out["detail"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(body=JSON, bytes_=st.binary(max_size=64))
def test_whatever_comes_back_is_a_record_or_an_incompatible_record_error(body, bytes_):
    for data in (body, bytes_):
        try:
            read = read_lenient(Manifest, data, source="an answer")
        except IncompatibleRecordError as e:
            assert e.message.startswith("an answer cannot be read by this rayprof (")
        else:
            assert isinstance(read, Manifest)


def test_an_mcp_tool_says_to_install_the_services_release():
    error = tool_error(IncompatibleRecordError("the service's answer cannot be read by this rayprof (state: Field required)"))

    assert "[incompatible_record] the service's answer cannot be read" in str(error)
    assert "install the service's release" in str(error)


def test_a_manifest_a_newer_release_stored_is_read_by_this_one(home, served):
    manifest = served["manifest"]
    storage = open_storage(home)
    newer = later(manifest, *[("summary", *depth) for depth in SUMMARY_DEPTHS])
    storage.put_bytes(json.dumps(newer).encode(), manifest_key(manifest["target"], manifest["profile_id"] + "-x"), "manifest")

    read = read_manifest(storage, manifest["target"], manifest["profile_id"] + "-x")

    assert read == Manifest.model_validate(manifest)


def test_a_downloaded_folder_a_newer_release_wrote_is_compared_by_this_one(tmp_path, served):
    manifest = served["manifest"]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(later(manifest, *[("summary", *d) for d in SUMMARY_DEPTHS])))

    side = load_folder(tmp_path)

    assert side.summary == Summary.model_validate(manifest["summary"])


def test_a_summary_the_first_release_wrote_is_read_by_this_one():
    # `rayprof analyze --json` of ../shared/gpu-traces/seed003_before at 4ac8d9a (2026-11-23), the first day's
    # code: a release may add fields, never drop or rename one a stored profile carries.
    written = json.loads((DATA / "records" / "summary_4ac8d9a.json").read_text())

    summary = Summary.model_validate(written)

    assert summary.findings[0].code == written["findings"][0]["code"] == "dataloader_bound"
    assert [s.duration_ms for s in summary.ranks[0].steps] == [s["duration_ms"] for s in written["ranks"][0]["steps"]]


def test_a_request_carries_only_the_options_its_caller_set(served):
    service = Service({"/v1/profiles": served["status"]})

    _client(service).profile("run", 3, with_stack=True)

    sent = json.loads(service.requests[0].content)
    assert sent == {"target": "run", "steps": 3, "with_stack": True}
    assert ProfileRequest.model_validate(sent) == ProfileRequest(target="run", steps=3, with_stack=True)


def test_the_cli_sends_no_option_left_at_its_default(served, monkeypatch):
    service = Service({"/v1/profiles": served["status"]})
    monkeypatch.setattr(http_backend, "HttpBackend", partial(http_backend.HttpBackend, transport=httpx.MockTransport(service)))

    assert main(["profile", "run", "--steps", "3", "--url", "http://svc"]) == 0

    assert json.loads(service.requests[0].content) == {"target": "run", "steps": 3}


def test_the_service_names_an_unknown_field_as_perhaps_a_newer_clients_option(home, monkeypatch):
    async def go():
        async with service_client(monkeypatch, make_controller(home)) as http:
            return await http.post("/v1/profiles", json={"target": "run", "steps": 1, "trace_everything": True})

    refused = run(go())

    assert refused.status_code == 422 and refused.json()["error"] == "validation_error"
    detail = refused.json()["detail"]
    assert "trace_everything: Extra inputs are not permitted" in detail and "a newer rayprof" in detail
