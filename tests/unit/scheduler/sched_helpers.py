"""Small builders shared by the scheduler tests."""

from __future__ import annotations

from air_sdk.scheduler import JobRequest, NodeSpec, RunningJob
from air_sdk.schema import NodeAssignment, Placement


def gpu_nodes(
    count: int,
    gpus: int = 8,
    *,
    pool: str = "default",
    accelerator: str = "a100",
    prefix: str = "n",
    **labels: str,
) -> list[NodeSpec]:
    return [
        NodeSpec(
            f"{prefix}{i}",
            gpus,
            tuple(range(gpus)),
            pool=pool,
            accelerator=accelerator,
            labels=dict(labels),
        )
        for i in range(count)
    ]


def job(
    job_id: str,
    nodes: int = 1,
    gpus: int = 8,
    *,
    at: float = 0.0,
    tenant: str = "default",
    priority: str = "normal",
    est: float | None = None,
    pool: str = "default",
    accelerator: str | None = None,
) -> JobRequest:
    return JobRequest(
        job_id,
        nodes=nodes,
        slots_per_node=max(gpus, 1),
        gpus_per_node=gpus,
        pool=pool,
        accelerator=accelerator,
        tenant=tenant,
        priority=priority,
        submitted_at=at,
        est_duration_s=est,
    )


def running(
    job_id: str,
    nodes: list[str],
    gpus: int = 8,
    *,
    first_gpu: int = 0,
    tenant: str = "default",
    priority: str = "normal",
    started: float = 0.0,
    end: float | None = None,
    terminating: bool = False,
    pool: str = "default",
) -> RunningJob:
    placement = Placement(
        job_id=job_id,
        pool=pool,
        nodes=tuple(
            NodeAssignment(node=n, slots=gpus, gpus=tuple(range(first_gpu, first_gpu + gpus)))
            for n in nodes
        ),
    )
    return RunningJob(
        placement,
        tenant=tenant,
        priority=priority,
        started_at=started,
        est_end=end,
        terminating=terminating,
    )


def started(decision) -> list[str]:  # type: ignore[no-untyped-def]
    return [p.job_id for p in decision.placements]
