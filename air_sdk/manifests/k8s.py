"""A JobSpec as a Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1).

The TrainJob names a `ClusterTrainingRuntime` (by default `torch-distributed`, the
one Kubeflow Trainer ships), which runs torchrun on every node with the env it
needs; AIR adds its rank supervisor in front of the user's script, so logs,
metrics, rank exits and checkpoints reach an AIR gateway exactly as from the local
or Ray backends. The code must be in the image (`--image`), at its working
directory: a cluster should not fetch code from a laptop.

Secret env values never appear in the manifest: they become `secretKeyRef`s to a
Secret named `<job>-env`, which the user creates (`kubectl create secret`); with a
gateway URL, the job token the ranks post with (AIR_JOB_TOKEN) is one of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from air_sdk.errors import SpecError
from air_sdk.redact import is_secret_env
from air_sdk.schema import JobSpec, WorkerEnv

__all__ = ["TRAINJOB_API_VERSION", "K8sOptions", "render_trainjob", "to_yaml"]

TRAINJOB_API_VERSION = "trainer.kubeflow.org/v1alpha1"
#: the torch runtime Kubeflow Trainer installs
DEFAULT_RUNTIME = "torch-distributed"
#: RFC 1035 label: what the CRD's CEL rule asks of metadata.name
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME = 63


@dataclass(frozen=True, kw_only=True)
class K8sOptions:
    """Where and how the TrainJob runs.

    Example:
        >>> K8sOptions(image="ghcr.io/me/train:1").runtime
        'torch-distributed'
    """

    #: the container image holding the code, torch and air-runtime
    image: str
    namespace: str = "default"
    #: metadata.name; default: the JobSpec's name, made a DNS label
    name: str | None = None
    #: the ClusterTrainingRuntime to run on
    runtime: str = DEFAULT_RUNTIME
    #: where ranks report (an AIR gateway reachable from the pods, https in production)
    gateway_url: str | None = None

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise ValueError("image is empty: give the image that holds the code (--image)")


def k8s_name(name: str) -> str:
    """`name` as an RFC 1035 label of at most 63 characters.

    Example:
        >>> k8s_name("My_Run.v2")
        'my-run-v2'
        >>> k8s_name("2nd")
        'air-2nd'
    """
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not out or not out[0].isalpha():
        out = f"air-{out}".rstrip("-")
    out = out[:_MAX_NAME].rstrip("-")
    if not _DNS_LABEL.match(out):
        raise SpecError(f"cannot make a Kubernetes name of {name!r}: pass --name")
    return out


def render_trainjob(spec: JobSpec, options: K8sOptions) -> dict[str, Any]:
    """The TrainJob that runs `spec` on Kubernetes, as a dict ready for YAML.

    Example:
        >>> spec = JobSpec(name="mnist", entrypoint="train.py", resources={"nodes": 2})
        >>> job = render_trainjob(spec, K8sOptions(image="ghcr.io/me/train:1"))
        >>> job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["command"][:2]
        (2, ['torchrun', '-m'])
    """
    if spec.entrypoint is None and spec.module is None:
        raise SpecError(
            "this job is inline code; a TrainJob runs a script in its image:"
            " save the code as a file in the image and set entrypoint"
        )
    name = options.name or k8s_name(spec.name)
    if not _DNS_LABEL.match(name) or len(name) > _MAX_NAME:
        raise SpecError(
            f"name {name!r} is not a Kubernetes name: lower-case letters, digits and '-',"
            " starting with a letter, at most 63 characters"
        )
    r = spec.resources
    program = ["-m", spec.module] if spec.module is not None else [str(spec.entrypoint)]
    trainer: dict[str, Any] = {
        "image": options.image,
        "numNodes": r.nodes,
        "numProcPerNode": r.ranks_per_node,
        # torchrun reads the runtime's PET_* env (nodes, node rank, master address);
        # the supervisor runs the script and reports to the gateway as everywhere else.
        "command": ["torchrun", "-m", "air_sdk.runtime.supervise", *program],
        "env": _env(spec, name, options),
        "resourcesPerNode": _resources(spec),
    }
    if spec.args:
        trainer["args"] = list(spec.args)
    body: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": options.runtime,
        },
        "trainer": trainer,
    }
    if spec.timeout_s is not None:
        body["activeDeadlineSeconds"] = max(1, int(spec.timeout_s))
    return {
        "apiVersion": TRAINJOB_API_VERSION,
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {"app.kubernetes.io/managed-by": "air", "air.dev/job-name": name},
            "annotations": {
                "air.dev/max-restarts": str(spec.max_restarts),
                "air.dev/pool": spec.pool,
            },
        },
        "spec": body,
    }


def _env(spec: JobSpec, name: str, options: K8sOptions) -> list[dict[str, Any]]:
    env: dict[str, str] = dict(spec.env)
    # AIR's part of the contract (torchrun sets RANK, WORLD_SIZE, ... from the runtime's env)
    if spec.checkpoint.dir:
        env[WorkerEnv.env_name("checkpoint_dir")] = spec.checkpoint.dir
    env[WorkerEnv.env_name("checkpoint_keep")] = str(spec.checkpoint.keep)
    secret = {k for k, v in env.items() if is_secret_env(k, v)}
    if options.gateway_url:
        # Ranks post with a job token the gateway issued; it lives in the Secret too.
        env[WorkerEnv.env_name("gateway_url")] = options.gateway_url
        token = WorkerEnv.env_name("job_token")
        env[token] = ""
        secret.add(token)
    out: list[dict[str, Any]] = []
    for key in sorted(env):
        if key in secret:
            ref = {"name": f"{name}-env", "key": key}
            out.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
        else:
            out.append({"name": key, "value": env[key]})
    return out


def _resources(spec: JobSpec) -> dict[str, Any]:
    r = spec.resources
    amounts: dict[str, Any] = {"cpu": str(r.ranks_per_node)}
    if r.gpus_per_node:
        amounts["nvidia.com/gpu"] = str(r.gpus_per_node)
        return {"requests": dict(amounts), "limits": {"nvidia.com/gpu": str(r.gpus_per_node)}}
    return {"requests": amounts}


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, keys in the order written (needs PyYAML: the `k8s` extra).

    Example:
        >>> print(to_yaml({"kind": "TrainJob", "spec": {"suspend": False}}), end="")
        kind: TrainJob
        spec:
          suspend: false
    """
    try:
        import yaml
    except ImportError as exc:
        raise SpecError("rendering YAML needs PyYAML: pip install 'air-runtime[k8s]'") from exc
    return str(yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False))
