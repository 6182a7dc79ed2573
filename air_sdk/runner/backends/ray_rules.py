"""The Ray backend's decisions, as pure functions: which Ray nodes AIR may place on,
where a job's checkpoints go, and how the gateway authenticates to the cluster.

Nothing here imports Ray, so every rule has a plain unit test
(tests/unit/runner/test_ray_rules.py).
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from air_sdk.errors import ConfigError
from air_sdk.scheduler import NodeSpec

__all__ = [
    "LOST_NODE_GRACE_ENV",
    "PASSED_THROUGH_ENV",
    "POOL_LABEL",
    "STORAGE_ENV",
    "RayNode",
    "auth_env",
    "check_output_dir",
    "checkpoint_dir",
    "gateway_unreachable",
    "is_shared_location",
    "node_name",
    "ray_nodes",
]

#: a directory every Ray node mounts (NFS, Lustre, a FUSE bucket) or an fsspec URL
#: (s3://bucket/air): the default home of checkpoints on Ray
STORAGE_ENV = "AIR_RAY_STORAGE"
#: gateway env the ranks on Ray nodes get over their node's own (a private CA)
PASSED_THROUGH_ENV = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
#: how long a node that left the cluster stays in the inventory (unhealthy), so a job
#: that needs it waits for it or a replacement before being failed as unplaceable
LOST_NODE_GRACE_ENV = "AIR_RAY_LOST_NODE_GRACE_S"
#: the Ray node label (`ray start --labels air-pool=a100`) naming the AIR pool of a node
POOL_LABEL = "air-pool"
#: URL schemes whose paths live in one process or on one machine
_LOCAL_SCHEMES = frozenset({"", "file", "local", "memory"})


@dataclass(frozen=True)
class RayNode:
    """A Ray node as AIR sees it: the schedulable node and where it is."""

    spec: NodeSpec
    node_id: str
    address: str


def node_name(node_id: str) -> str:
    """The AIR name of a Ray node: stable for the node's life, short enough to read.

    Example:
        >>> node_name("64bf598ade38ae69c3703e3f8841e71e216b195a6a380531c7f0b596")
        'ray-64bf598ade38'
    """
    return f"ray-{node_id[:12]}"


def ray_nodes(table: Sequence[Mapping[str, Any]]) -> list[RayNode]:
    """The alive nodes of `ray.nodes()` that can run ranks (a head node started with
    `--num-cpus 0` cannot), as AIR nodes: slots are the node's CPUs, GPUs its GPUs.

    Example:
        >>> row = {"NodeID": "ab" * 28, "Alive": True, "NodeManagerAddress": "10.0.0.2",
        ...        "Resources": {"CPU": 8.0, "GPU": 2.0, "accelerator_type:A100": 1.0},
        ...        "Labels": {"air-pool": "a100"}}
        >>> n = ray_nodes([row])[0].spec
        >>> n.slots, n.gpus, n.pool, n.accelerator
        (8, (0, 1), 'a100', 'a100')
    """
    out = []
    for row in table:
        if not row.get("Alive"):
            continue
        resources = row.get("Resources") or {}
        labels = dict(row.get("Labels") or {})
        cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
        if cpus < 1:
            continue  # a head node kept free of work, or a GPU node with no CPU to run on
        kinds = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
        accelerator = kinds[0].lower() if kinds else ("gpu" if gpus else "cpu")
        node_id = str(row["NodeID"])
        spec = NodeSpec(
            name=node_name(node_id),
            slots=cpus,
            gpus=tuple(range(gpus)),
            pool=labels.get(POOL_LABEL, "default"),
            accelerator=accelerator,
            labels={k: str(v) for k, v in labels.items() if not k.startswith("ray.io/")},
        )
        out.append(RayNode(spec, node_id, str(row.get("NodeManagerAddress", ""))))
    return sorted(out, key=lambda n: n.spec.name)


def is_shared_location(location: str, storage: str | None) -> bool:
    """True if every node can reach `location`: a remote fsspec URL, or a path inside
    the shared `storage` directory.

    Example:
        >>> is_shared_location("s3://bucket/ckpt", None)
        True
        >>> is_shared_location("/tmp/ckpt", "/mnt/shared"), is_shared_location("/mnt/shared/j1", "/mnt/shared")
        (False, True)
    """
    scheme = urlparse(location).scheme if "://" in location else ""
    if scheme not in _LOCAL_SCHEMES:
        return True
    if not storage or "://" in storage:
        return False
    path = location.removeprefix("file://")
    try:
        return Path(os.path.normpath(path)).is_relative_to(os.path.normpath(storage))
    except ValueError:
        return False


def checkpoint_dir(
    *, job_id: str, explicit: str | None, default: str, num_nodes: int, storage: str | None
) -> str:
    """Where the ranks of a job on Ray keep checkpoints.

    The job's own `checkpoint.dir` when it set one, else `storage/jobs/<job>/checkpoints`,
    else (single-node jobs only) the gateway's default. A multi-node job must checkpoint
    where every node can read what the others wrote, and a restart may land on other
    machines: a path on one machine is refused with what to change.

    Example:
        >>> checkpoint_dir(job_id="j1", explicit=None, default="/home/air/jobs/j1/ckpt",
        ...                num_nodes=2, storage="s3://bucket/air")
        's3://bucket/air/jobs/j1/checkpoints'
    """
    if explicit:
        if num_nodes > 1 and not is_shared_location(explicit, storage):
            raise ConfigError(
                f"checkpoint.dir {explicit!r} is a path on one machine, but this {num_nodes}-node"
                " job runs on several Ray nodes, and a restart may run on others: use an fsspec"
                " URL (s3://bucket/path) or a directory under the shared storage"
                + (f" {storage!r}" if storage else f" (start the gateway with {STORAGE_ENV}=DIR)")
            )
        return explicit
    if storage:
        if "://" in storage:
            return storage.rstrip("/") + f"/jobs/{job_id}/checkpoints"
        return str(PurePosixPath(storage) / "jobs" / job_id / "checkpoints")
    if num_nodes > 1:
        raise ConfigError(
            f"this {num_nodes}-node job has no checkpoint.dir and the gateway has no shared"
            f" storage for Ray: start the gateway with {STORAGE_ENV} set to a directory every"
            " node mounts or an fsspec URL (s3://bucket/air), or set checkpoint.dir to one"
        )
    return default


def check_output_dir(explicit: str | None, *, num_nodes: int, storage: str | None) -> None:
    """Refuse a job's own `output_dir` that the nodes of a multi-node Ray job would not
    share (each would keep its ranks' files on its own disk). The default needs no
    check: it lies under the shared storage (`air_sdk.runner.outputs`).

    Example:
        >>> check_output_dir("/tmp/out", num_nodes=2, storage="/mnt/shared")
        Traceback (most recent call last):
        ...
        air_sdk.errors.ConfigError: output_dir '/tmp/out' is a path on one machine, but this 2-node job runs on several Ray nodes: use a directory under the shared storage '/mnt/shared' or an fsspec URL, or leave output_dir out
        >>> check_output_dir("/mnt/shared/runs/7", num_nodes=2, storage="/mnt/shared")
    """
    if explicit and num_nodes > 1 and not is_shared_location(explicit, storage):
        raise ConfigError(
            f"output_dir {explicit!r} is a path on one machine, but this {num_nodes}-node job"
            " runs on several Ray nodes: use a directory under the shared storage"
            + (f" {storage!r}" if storage else f" (start the gateway with {STORAGE_ENV}=DIR)")
            + " or an fsspec URL, or leave output_dir out"
        )


def auth_env(env: Mapping[str, str], home: Path | None = None) -> tuple[dict[str, str], str]:
    """What to add to this process's env before `ray.init`, and where the token comes
    from. Ray 2.60 turns token auth on for the clusters it starts, but a driver that
    joins an explicit address only sends a token in token mode: when a token is there
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) AIR turns that mode on.
    An explicit RAY_AUTH_MODE is left as it is.

    Example:
        >>> auth_env({"RAY_AUTH_TOKEN": "t"})
        ({'RAY_AUTH_MODE': 'token'}, 'token from RAY_AUTH_TOKEN')
        >>> auth_env({"RAY_AUTH_MODE": "token"})[0]
        {}
    """
    if env.get("RAY_AUTH_MODE"):
        return {}, f"RAY_AUTH_MODE={env['RAY_AUTH_MODE']} (from the environment)"
    if env.get("RAY_AUTH_TOKEN"):
        return {"RAY_AUTH_MODE": "token"}, "token from RAY_AUTH_TOKEN"
    path = env.get("RAY_AUTH_TOKEN_PATH")
    candidate = Path(path) if path else (home or Path.home()) / ".ray" / "auth_token"
    if candidate.is_file():
        return {"RAY_AUTH_MODE": "token"}, f"token from {candidate}"
    return {}, "no Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"


def gateway_unreachable(
    gateway_url: str, node_addresses: Sequence[str], local_addresses: Sequence[str]
) -> str | None:
    """Why ranks on these nodes cannot post to the gateway, or None if they can: a
    loopback gateway URL only works for nodes on the gateway's own machine.

    Example:
        >>> gateway_unreachable("http://127.0.0.1:8470", ["10.0.0.5"], ["127.0.0.1", "10.0.0.2"])[:34]
        'ranks on 10.0.0.5 cannot reach the'
        >>> gateway_unreachable("https://air.example.com", ["10.0.0.5"], ["10.0.0.2"]) is None
        True
    """
    host = urlparse(gateway_url).hostname or ""
    try:
        loopback = host == "localhost" or ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    remote = sorted({a for a in node_addresses if a and a not in set(local_addresses)})
    if not remote:
        return None
    return (
        f"ranks on {', '.join(remote)} cannot reach the gateway at {gateway_url} (loopback):"
        " start the gateway with --host NAME (a name every Ray node resolves) and"
        " --tls-cert/--tls-key (docs/scaling-out.md)"
    )


def local_addresses() -> list[str]:
    """This machine's IP addresses (a Ray node at one of them shares our loopback).

    Example:
        >>> "127.0.0.1" in local_addresses()
        True
    """
    import psutil

    found = {"127.0.0.1", "::1"}
    for addrs in psutil.net_if_addrs().values():
        found.update(
            a.address.split("%")[0] for a in addrs if a.family.name in ("AF_INET", "AF_INET6")
        )
    return sorted(found)


def zip_package(root: Path) -> bytes:
    """`root/air_sdk` as a deterministic zip (sources only: nodes compile their own)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((root / "air_sdk").rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            info = zipfile.ZipInfo(
                path.relative_to(root).as_posix(), date_time=(1980, 1, 1, 0, 0, 0)
            )
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return out.getvalue()


def unhealthy(spec: NodeSpec) -> NodeSpec:
    """`spec`, marked unhealthy (a node that left the cluster, still in the inventory)."""
    from dataclasses import replace

    return replace(spec, healthy=False)


def first_cause(exc: BaseException) -> str:
    """The line of a Ray error that says why an actor died."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for words in (("because",), ("killed", "died")):
        for line in lines:
            if any(w in line for w in words):
                return line
    return lines[0] if lines else type(exc).__name__
