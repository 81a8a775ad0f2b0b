"""What ``rayprof serve``/``demo`` and the service's builder refuse before anything starts: a storage rayprof cannot
use, an S3 endpoint that is no URL, a port or count out of range. Before, ``serve`` first asked Ray for a cluster and
answered "no running Ray cluster" to a bad flag, and a bad endpoint was found only when the controller made its S3
client."""

from __future__ import annotations

import pytest
import ray

from orchestrator.cli.main import _parser, main
from orchestrator.config import default_storage_spec, storage_spec
from orchestrator.errors import ConfigurationError
from orchestrator.service import app as service_app
from orchestrator.settings import S3_ENDPOINT_URL_ENV_VAR, STORAGE_ENV_VAR


@pytest.fixture
def no_cluster(monkeypatch):
    """Fails the test at once if ``serve`` gets as far as asking Ray for a cluster."""

    def refuse(*args, **kwargs):
        raise AssertionError("rayprof serve asked Ray for a cluster before checking its flags")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--storage", "s3://"], "storage 's3://' names no bucket; use s3://bucket/prefix"),
        (["--storage", "ftp://host/x"], "unsupported storage 'ftp://host/x'"),
        (["--storage", "s3://b/p", "--s3-endpoint", "minio:9000"], "--s3-endpoint 'minio:9000' is not a URL"),
    ],
)
def test_serve_refuses_a_storage_it_cannot_use_before_asking_for_a_cluster(no_cluster, capsys, flags, said):
    assert main(["serve", *flags]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_serve_refuses_a_port_out_of_range(port, capsys):
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["serve", "--port", port])
    assert exited.value.code == 2 and "--port" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--workers"])
def test_demo_refuses_a_count_under_one_before_starting_a_cluster(flag, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo", flag, "0"])
    assert f"argument {flag}: 0 is under 1: give 1 or more" in capsys.readouterr().err


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://s3.example.com", "http://minio:9000/"])
def test_an_endpoint_that_is_a_url_is_kept(endpoint):
    assert storage_spec("s3://b/p", endpoint).s3_endpoint_url == endpoint


def test_the_service_builder_refuses_an_endpoint_that_is_no_url():
    with pytest.raises(ConfigurationError, match="s3_endpoint_url 'localhost' is not a URL"):
        service_app.build_app({"storage": "s3://b/p", "s3_endpoint_url": "localhost"})


def test_the_env_vars_are_checked_the_same_way(monkeypatch):
    monkeypatch.setenv(STORAGE_ENV_VAR, "s3://b/p")
    monkeypatch.setenv(S3_ENDPOINT_URL_ENV_VAR, "minio:9000")
    with pytest.raises(ConfigurationError, match=f"{S3_ENDPOINT_URL_ENV_VAR} 'minio:9000' is not a URL"):
        default_storage_spec()


def test_an_endpoint_that_urllib_cannot_parse_is_refused_not_raised():
    # "http://[" made urllib raise ValueError: a traceback from `rayprof serve` before this check was shared.
    with pytest.raises(ConfigurationError, match=r"--s3-endpoint 'http://\[' is not a URL"):
        storage_spec("s3://b/p", "http://[", endpoint_from="--s3-endpoint")
