"""Readers for the public GPU cluster traces, for users who have the files.

- Microsoft Philly (msr-fiddle/philly-traces): `cluster_job_log`, a JSON list of
  jobs with `status`, `vc`, `jobid`, `submitted_time`, `user` and `attempts`
  (each with `start_time`, `end_time` and `detail`: one entry per server with its
  `ip` and `gpus`). Times are "YYYY-MM-DD HH:MM:SS"; missing ones are None/"None".
- Alibaba PAI 2020 (alibaba/clusterdata, cluster-trace-gpu-v2020):
  `pai_job_table.csv` (job_name, inst_id, user, status, start_time, end_time) and
  `pai_task_table.csv` (job_name, task_name, inst_num, status, start_time, end_time,
  plan_cpu, plan_mem, plan_gpu, gpu_type). The released CSVs have no header line
  (the columns are in separate .header files); both forms are read. Times are
  seconds; `plan_gpu` is a percentage of one GPU (50 = half a GPU).

Both map to `TraceJob`: arrival relative to the first submission, the gang shape
from the GPUs asked (whole GPUs: AIR does not share a GPU), run time from the first
start to the last end, tenant = Philly virtual cluster / PAI user.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from air_sdk.scheduler.sim.trace import TraceJob, gang_shape

PHILLY_TIME = "%Y-%m-%d %H:%M:%S"
PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)


def _philly_time(value: object) -> datetime | None:
    if value is None or value in ("", "None"):
        return None
    return datetime.strptime(str(value), PHILLY_TIME)


def read_philly(
    path: str | Path,
    *,
    gpus_per_node: int = 8,
    statuses: Iterable[str] = ("Pass", "Killed", "Failed"),
) -> list[TraceJob]:
    """Jobs of a Philly `cluster_job_log`, sorted by arrival.

    GPUs come from the first attempt (as the trace's analysis notebook counts them);
    run time is the last attempt's end minus the first attempt's start. Jobs without
    attempts or with missing times (logging gaps, still running) are skipped.
    """
    wanted = set(statuses)
    raw = json.loads(Path(path).read_text())
    rows = []
    for job in raw:
        if job.get("status") not in wanted or not job.get("attempts"):
            continue
        submitted = _philly_time(job.get("submitted_time"))
        first, last = job["attempts"][0], job["attempts"][-1]
        start, end = _philly_time(first.get("start_time")), _philly_time(last.get("end_time"))
        if submitted is None or start is None or end is None or end < start:
            continue
        per_server = [len(d.get("gpus") or []) for d in first.get("detail") or []]
        total = sum(per_server)
        if total == 0:
            continue
        if len(per_server) > 1 and len(set(per_server)) == 1:
            nodes, per_node = len(per_server), per_server[0]
        else:
            nodes, per_node = gang_shape(total, gpus_per_node)
        rows.append(
            (
                submitted,
                str(job.get("jobid")),
                nodes,
                per_node,
                (end - start).total_seconds(),
                str(job.get("vc") or "default"),
            )
        )
    if not rows:
        return []
    t0 = min(r[0] for r in rows)
    rows.sort(key=lambda r: (r[0], r[1]))
    return [
        TraceJob(
            job_id=job_id,
            arrival=(submitted - t0).total_seconds(),
            nodes=nodes,
            gpus_per_node=per_node,
            duration=duration,
            tenant=vc,
            est_duration=duration,
        )
        for submitted, job_id, nodes, per_node, duration, vc in rows
    ]


def _csv_rows(path: str | Path, columns: tuple[str, ...]) -> Iterator[dict[str, str]]:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        first = next(reader, None)
        if first is None:
            return
        if [c.strip() for c in first] == list(columns):
            header = columns
        else:
            header = columns
            yield dict(zip(header, first, strict=False))
        for row in reader:
            if row:
                yield dict(zip(header, row, strict=False))


def _float(value: str | None) -> float | None:
    if value is None or value.strip() in ("", "nan", "NaN", "None"):
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    return None if math.isnan(x) else x


@dataclass
class _PaiJob:
    submitted: float
    user: str
    status: str
    gpus: float = 0.0
    start: float = math.inf
    end: float = -math.inf
    gpu_type: str | None = None


def read_pai(
    job_table: str | Path,
    task_table: str | Path,
    *,
    gpus_per_node: int = 8,
    statuses: Iterable[str] = ("Terminated",),
    keep_gpu_type: bool = False,
) -> list[TraceJob]:
    """GPU jobs of the PAI 2020 trace, sorted by arrival.

    A job asks for the sum over its tasks of inst_num x plan_gpu / 100 GPUs, rounded
    up to whole GPUs; it runs from its first task start to its last task end. Only
    jobs of `statuses` (default: the successful "Terminated") with GPUs are kept.
    `keep_gpu_type` names the task's gpu_type as the job's accelerator (lower case).
    """
    wanted = set(statuses)
    jobs: dict[str, _PaiJob] = {}
    for row in _csv_rows(job_table, PAI_JOB_COLUMNS):
        submitted = _float(row.get("start_time"))
        if submitted is None or row.get("status") not in wanted:
            continue
        jobs[row["job_name"]] = _PaiJob(submitted, row.get("user") or "default", row["status"])
    for row in _csv_rows(task_table, PAI_TASK_COLUMNS):
        job = jobs.get(row.get("job_name", ""))
        if job is None:
            continue
        plan = _float(row.get("plan_gpu")) or 0.0
        instances = _float(row.get("inst_num")) or 1.0
        job.gpus += instances * plan / 100.0
        start, end = _float(row.get("start_time")), _float(row.get("end_time"))
        if start is not None:
            job.start = min(job.start, start)
        if end is not None:
            job.end = max(job.end, end)
        gpu_type = (row.get("gpu_type") or "").strip()
        if plan > 0 and gpu_type and job.gpu_type is None:
            job.gpu_type = gpu_type.lower()
    kept = [
        (name, j)
        for name, j in jobs.items()
        if j.gpus > 0 and math.isfinite(j.start) and math.isfinite(j.end) and j.end >= j.start
    ]
    if not kept:
        return []
    t0 = min(j.submitted for _, j in kept)
    kept.sort(key=lambda e: (e[1].submitted, e[0]))
    out = []
    for name, j in kept:
        nodes, per_node = gang_shape(math.ceil(j.gpus - 1e-9), gpus_per_node)
        out.append(
            TraceJob(
                job_id=name,
                arrival=j.submitted - t0,
                nodes=nodes,
                gpus_per_node=per_node,
                duration=j.end - j.start,
                tenant=j.user,
                est_duration=j.end - j.start,
                accelerator=j.gpu_type if keep_gpu_type else None,
            )
        )
    return out
