"""The deploy/ configs, loaded by the tools that consume them: Anyscale's SDK and Ray Serve's schema.

``anyscale job submit -f`` and ``anyscale service deploy -f`` build these same
config models from the YAML, so a key they would reject fails here first.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
from pathlib import Path

import pytest
import yaml
from anyscale.job.models import JobConfig
from anyscale.service.models import ServiceConfig
from ray.serve import Application
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from orchestrator.cli.example_job import TRAIN_JOB
from tests.support.common import REPO

DEPLOY = REPO / "deploy"
JOB_YAML = DEPLOY / "anyscale" / "job.yaml"
SERVICE_YAML = DEPLOY / "anyscale" / "service.yaml"
SERVE_YAML = DEPLOY / "serve_config.yaml"
SETUP_HOOK = "actors.agent.install"
BUILDER = "orchestrator.service.app:build_app"


def _train_job_module():
    spec = importlib.util.spec_from_file_location("train_job", TRAIN_JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve(import_path: str):
    module, _, attr = import_path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _build(app_config: dict) -> Application:
    """What Serve does with an application entry: import the builder, call it with ``args``."""
    return _resolve(app_config["import_path"])(app_config.get("args"))


def test_anyscale_job_config_runs_the_example_job_with_the_setup_hook():
    config = JobConfig.from_yaml(str(JOB_YAML))
    argv = shlex.split(config.entrypoint)
    train_job = _train_job_module()
    args = train_job.parse_args(argv[2:])

    assert argv[:2] == ["python", "deploy/examples/train_job.py"]
    assert (REPO / config.working_dir / argv[1]).resolve() == TRAIN_JOB
    assert train_job.job_runtime_env(args) == {"worker_process_setup_hook": SETUP_HOOK}
    assert callable(_resolve(SETUP_HOOK))
    assert args.name == "fashion-resnet" and args.workers == 2
    assert args.storage_path.startswith("/mnt/cluster_storage/")
    assert config.env_vars == {"RAYPROF_STORAGE": "/mnt/cluster_storage/rayprof"}
    assert ".venv" in config.excludes and config.max_retries == 0


def test_anyscale_service_config_serves_the_rayprof_builder():
    config = ServiceConfig.from_yaml(str(SERVICE_YAML))
    (app,) = config.applications

    assert app["import_path"] == BUILDER
    ServeApplicationSchema.model_validate(app)
    assert isinstance(_build(app), Application)
    assert config.env_vars["RAYPROF_STORAGE"] == app["args"]["storage"] == "s3://my-bucket/rayprof"
    assert config.query_auth_token_enabled is True


def test_anyscale_sdk_rejects_a_key_it_does_not_know(tmp_path):
    config = yaml.safe_load(JOB_YAML.read_text())
    config["entry_point"] = config.pop("entrypoint")
    misspelled = tmp_path / "job.yaml"
    misspelled.write_text(yaml.safe_dump(config))

    with pytest.raises(TypeError, match="entry_point"):
        JobConfig.from_yaml(str(misspelled))


@pytest.mark.parametrize("path", [JOB_YAML, SERVICE_YAML], ids=["job", "service"])
def test_only_the_image_tag_and_compute_config_are_left_unverified(path: Path):
    lines = path.read_text().splitlines()
    # A "# (unverified) ..." comment line marks the key on the line after it.
    marked = [lines[i + 1].split(":")[0] for i, line in enumerate(lines) if line.startswith("# (unverified)")]

    assert marked == ["image_uri", "compute_config"]
    assert sum("(unverified)" in line for line in lines) == len(marked) + 1  # + the header that explains it


def test_serve_config_is_a_valid_serve_deploy_file_for_the_rayprof_builder():
    config = ServeDeploySchema.model_validate(yaml.safe_load(SERVE_YAML.read_text()))
    (app,) = config.applications

    assert app.import_path == BUILDER
    assert isinstance(_build(app.model_dump()), Application)
    assert config.proxy_location == "HeadOnly" and config.http_options.host == "127.0.0.1"


@pytest.mark.parametrize("path", [JOB_YAML, SERVICE_YAML, SERVE_YAML], ids=["job", "service", "serve"])
def test_no_config_puts_the_token_in_env_vars(path: Path):
    config = yaml.safe_load(path.read_text())
    env_blocks = [config.get("env_vars") or {}]
    env_blocks += [(a.get("runtime_env") or {}).get("env_vars") or {} for a in config.get("applications", [])]

    assert all("RAYPROF_TOKEN" not in env for env in env_blocks)
