"""The runner's side of a launch: one `NodeLaunch` per node, from the job's spec, the
placement and the attempt's `WorkerEnv` (the gateway knows the placement, so every
rank's RANK, WORLD_SIZE and MASTER_ADDR/PORT come from it: no rendezvous).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from air_sdk.planner.worker_env import flops_per_token
from air_sdk.runner.node.launch import NodeLaunch, RankLaunch, program_argv
from air_sdk.runner.node.limits import NodeLimits
from air_sdk.schema import JobSpec
from air_sdk.schema.worker_env import DEFAULTED_ENV, WorkerEnv

__all__ = ["attempt_worker", "localize", "plan_node"]

#: contract variables that stay the same from one attempt to the next on a node: a
#: warm interpreter starts with them (AIR_JOB_ID also tells whose process it is)
_STABLE = frozenset(
    WorkerEnv.env_name(f)
    for f in (
        "job_id",
        "node_name",
        "gateway_url",
        "checkpoint_dir",
        "checkpoint_keep",
        "checkpoint_every",
        "parallelism",
        "output_dir",
        "cuda_visible_devices",
        "pwd",
    )
)


def attempt_worker(
    *,
    job_id: str,
    attempt: int,
    spec: JobSpec,
    gateway_url: str,
    job_token: str,
    checkpoint_dir: str,
    output_dir: str | None = None,
) -> WorkerEnv:
    """The variables every rank of an attempt shares (the runner's part); `output_dir`
    is the job's durable output directory (`AIR_OUTPUT_DIR`).

    Example:
        >>> w = attempt_worker(job_id="j", attempt=2, spec=JobSpec(entrypoint="t.py"),
        ...                    gateway_url="http://g", job_token="t", checkpoint_dir="/c",
        ...                    output_dir="/home/air/outputs/j")
        >>> w.restart_count, w.run_id, w.output_dir
        (1, 'j', '/home/air/outputs/j')
    """
    return WorkerEnv(
        job_id=job_id,
        attempt=attempt,
        gateway_url=gateway_url,
        job_token=job_token,
        checkpoint_dir=checkpoint_dir,
        checkpoint_keep=spec.checkpoint.keep,
        checkpoint_every=spec.checkpoint.every_steps,  # air.checkpoint.due(step) reads it
        output_dir=output_dir,
        # validated at submit: the resolved mesh sizes, so no rank repeats the arithmetic
        parallelism=spec.parallelism.resolve(spec.resources.world_size).model_dump_json(),
        # torchrun counts its restarts of the worker group; AIR's attempts do that here
        restart_count=max(attempt - 1, 0),
        max_restarts=spec.max_restarts,
        run_id=job_id,
        use_agent_store=False,  # no agent: rank 0's init_process_group hosts the store
        flops_per_token=flops_per_token(spec),  # the model's, for MFU
        # NCCL's flight recorder, to explain a hang
        flight_recorder="1" if spec.resources.gpus_per_node else None,
    )


def plan_node(
    *,
    worker: WorkerEnv,
    spec: JobSpec,
    node: str,
    group_rank: int,
    num_nodes: int,
    entrypoint: str,
    cwd: str,
    attempt_dir: str,
    log_path: str,
    master: tuple[str, int] | None,
    cuda_visible_devices: str | None,
    loopback: bool,
    warm: bool,
    extra_env: Mapping[str, str] | None = None,
) -> NodeLaunch:
    """What `node` (the `group_rank`-th of `num_nodes`) runs for the attempt `worker`
    describes; `master` None: the node's NodeRunner learns it when it starts (Ray).
    `extra_env` goes under the job's `env`.

    Example:
        >>> w = WorkerEnv(job_id="j", attempt=1)
        >>> spec = JobSpec(entrypoint="t.py", resources={"nodes": 2, "procs_per_node": 2})
        >>> n = plan_node(worker=w, spec=spec, node="n1", group_rank=1, num_nodes=2,
        ...               entrypoint="t.py", cwd="/c", attempt_dir="/a", log_path="/a/n1.log",
        ...               master=("10.0.0.1", 29500), cuda_visible_devices="", loopback=False,
        ...               warm=True)
        >>> [(r.rank, r.env["LOCAL_RANK"], r.env["WORLD_SIZE"]) for r in n.ranks]
        [(2, '0', '4'), (3, '1', '4')]
    """
    per_node = spec.resources.ranks_per_node
    world = num_nodes * per_node
    ranks = []
    for local_rank in range(per_node):
        rank = group_rank * per_node + local_rank
        contract = worker.model_copy(
            update={
                "rank": rank,
                "local_rank": local_rank,
                "world_size": world,
                "local_world_size": per_node,
                "group_rank": group_rank,
                "group_world_size": num_nodes,
                "role_name": "default",
                "role_rank": rank,
                "role_world_size": world,
                "master_addr": master[0] if master else None,
                "master_port": master[1] if master else None,
                "node_name": node,
                "attempt_dir": attempt_dir,
                "cuda_visible_devices": cuda_visible_devices,
                "pwd": cwd,
            }
        )
        env = {**(extra_env or {}), **spec.env, **contract.to_env()}
        ranks.append(RankLaunch(rank, local_rank, env))
    defaults = {
        WorkerEnv.env_name("omp_num_threads"): "1",
        WorkerEnv.env_name("python_unbuffered"): "1",
        WorkerEnv.env_name("nccl_async_error_handling"): "1",
    }
    if loopback:  # virtual nodes of one machine talk over 127.0.0.1
        defaults[WorkerEnv.env_name("gloo_socket_ifname")] = "lo"
    assert set(defaults) <= DEFAULTED_ENV
    # the job's writable directories on this node (the local backend adds its /tmp and
    # /dev/shm); an fsspec URL is no directory here
    dirs = [cwd, os.path.dirname(attempt_dir), worker.checkpoint_dir, worker.output_dir]
    limits = NodeLimits(
        memory=spec.limits.memory,
        processes=spec.limits.processes,
        disk=spec.limits.disk,
        disk_dirs=list(dict.fromkeys(d for d in dirs if d and os.path.isabs(d))),
    )
    return NodeLaunch(
        job_id=worker.job_id or "",
        attempt=worker.attempt,
        node=node,
        cwd=cwd,
        command=[*program_argv(entrypoint), *spec.args],
        ranks=ranks,
        attempt_dir=attempt_dir,
        log_path=log_path,
        defaults=defaults,
        attempt_env=sorted(WorkerEnv.names() - _STABLE - DEFAULTED_ENV),
        warm=warm,
        limits=limits,
    )


def localize(launch: NodeLaunch, *, cwd: str, attempt_dir: str, log_path: str) -> NodeLaunch:
    """`launch` with its node-local paths set where the node chose them (a Ray node
    unpacks the code into a directory of its own).

    Example:
        >>> n = NodeLaunch("j", 1, "n", "?", ["t.py"], [RankLaunch(0, 0, {"PWD": "?"})], "?", "?")
        >>> localize(n, cwd="/c", attempt_dir="/a", log_path="/a.log").ranks[0].env["PWD"]
        '/c'
    """
    paths = {WorkerEnv.env_name("pwd"): cwd, WorkerEnv.env_name("attempt_dir"): attempt_dir}
    ranks = [RankLaunch(r.rank, r.local_rank, {**r.env, **paths}) for r in launch.ranks]
    moved = {launch.cwd: cwd, os.path.dirname(launch.attempt_dir): os.path.dirname(attempt_dir)}
    dirs = [moved.get(d, d) for d in launch.limits.disk_dirs]
    limits = replace(launch.limits, disk_dirs=list(dict.fromkeys(dirs)))
    return replace(
        launch, cwd=cwd, attempt_dir=attempt_dir, log_path=log_path, ranks=ranks, limits=limits
    )
