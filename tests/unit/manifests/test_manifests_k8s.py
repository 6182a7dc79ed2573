"""`air render k8s`: every TrainJob it writes passes the published TrainJob CRD schema
(vendored in tests/data) and its CEL rules, and says what the JobSpec says."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from air_sdk.cli.main import app
from air_sdk.errors import SpecError
from air_sdk.manifests import K8sOptions, render_trainjob, to_yaml
from air_sdk.manifests.k8s import k8s_name
from air_sdk.schema import JobSpec

SCHEMA = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "data" / "trainjob_v1alpha1_schema.yaml").read_text()
)
IMAGE = "ghcr.io/acme/train:1.0"


def assert_valid_trainjob(manifest: dict) -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(manifest)
    # The CRD's x-kubernetes-validations (CEL), which jsonschema does not run:
    name = manifest["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob"


SPECS = {
    "cpu, one node": JobSpec(entrypoint="train.py"),
    "2 nodes x 4 GPUs, args, env, deadline": JobSpec(
        name="Llama_FT.v2",
        entrypoint="src/train.py",
        args=["--lr", "3e-4"],
        env={"WANDB_MODE": "offline", "HF_TOKEN": "hf_abcdefghijklmnopqrst"},
        resources={"nodes": 2, "gpus_per_node": 4},
        checkpoint={"dir": "s3://bucket/llama"},
        timeout_s=7200.5,
        max_restarts=3,
    ),
    "8 ranks per CPU node": JobSpec(entrypoint="t.py", resources={"nodes": 3, "procs_per_node": 8}),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_rendered_trainjob_passes_the_crd_schema(spec):
    manifest = render_trainjob(spec, K8sOptions(image=IMAGE, gateway_url="https://air.example"))
    assert_valid_trainjob(manifest)
    assert_valid_trainjob(yaml.safe_load(to_yaml(manifest)))  # and so does its YAML


def test_the_trainjob_says_what_the_jobspec_says():
    spec = SPECS["2 nodes x 4 GPUs, args, env, deadline"]
    job = render_trainjob(spec, K8sOptions(image=IMAGE, namespace="ml"))
    trainer = job["spec"]["trainer"]
    assert job["metadata"] == {
        "name": "llama-ft-v2",
        "namespace": "ml",
        "labels": {"app.kubernetes.io/managed-by": "air", "air.dev/job-name": "llama-ft-v2"},
        "annotations": {"air.dev/max-restarts": "3", "air.dev/pool": "default"},
    }
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["command"] == ["torchrun", "-m", "air_sdk.runtime.supervise", "src/train.py"]
    assert trainer["args"] == ["--lr", "3e-4"]
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "4"}
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    env = {e["name"]: e for e in trainer["env"]}
    assert env["AIR_CHECKPOINT_DIR"]["value"] == "s3://bucket/llama"
    assert env["WANDB_MODE"]["value"] == "offline"


def test_secrets_never_appear_in_the_manifest():
    spec = SPECS["2 nodes x 4 GPUs, args, env, deadline"]
    job = render_trainjob(spec, K8sOptions(image=IMAGE, gateway_url="https://air.example"))
    text = to_yaml(job)
    assert "hf_abcdefghijklmnopqrst" not in text
    env = {e["name"]: e for e in job["spec"]["trainer"]["env"]}
    for key in ("HF_TOKEN", "AIR_JOB_TOKEN"):
        assert env[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "llama-ft-v2-env", "key": key}},
        }


def test_a_field_the_api_server_would_prune_fails_validation():
    manifest = render_trainjob(SPECS["cpu, one node"], K8sOptions(image=IMAGE))
    manifest["spec"]["trainer"]["numProcsPerNode"] = 2  # a typo of numProcPerNode
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(manifest)


def test_inline_code_cannot_be_rendered_and_the_error_says_why():
    with pytest.raises(SpecError, match="inline code"):
        render_trainjob(JobSpec(code="print(1)"), K8sOptions(image=IMAGE))


@pytest.mark.parametrize(
    ("name", "expected"), [("mnist", "mnist"), ("My_Run.v2", "my-run-v2"), ("2nd", "air-2nd")]
)
def test_job_names_become_dns_labels(name, expected):
    assert k8s_name(name) == expected


def test_air_render_k8s_writes_a_valid_trainjob(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: mnist\nentrypoint: train.py\nresources: {nodes: 2}\n")
    out = tmp_path / "trainjob.yaml"
    result = CliRunner().invoke(
        app, ["render", "k8s", str(job_file), "--image", IMAGE, "--namespace", "ml", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(out.read_text())
    assert_valid_trainjob(manifest)
    assert manifest["metadata"]["namespace"] == "ml"
    assert manifest["spec"]["trainer"]["numNodes"] == 2


def test_air_render_k8s_names_the_bad_field(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("entrypoint: train.py\nresources: {nodes: 0}\n")
    result = CliRunner().invoke(app, ["render", "k8s", str(job_file), "--image", IMAGE])
    assert result.exit_code == 2
    assert "resources.nodes" in result.output


def test_a_module_job_runs_python_m_under_the_supervisor():
    job = render_trainjob(
        JobSpec(module="pkg.train", args=["--epochs", "3"]), K8sOptions(image=IMAGE)
    )
    assert_valid_trainjob(job)
    trainer = job["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "-m", "air_sdk.runtime.supervise", "-m", "pkg.train"]
    assert trainer["args"] == ["--epochs", "3"]
