"""Readers for the Philly and PAI trace formats, on small files written here."""

from __future__ import annotations

import json

import pytest

from air_sdk.scheduler.sim import read_pai, read_philly, simulate
from air_sdk.scheduler.sim.readers import PAI_JOB_COLUMNS, PAI_TASK_COLUMNS
from air_sdk.scheduler.sim.trace import TraceJob


def _attempt(start: str | None, end: str | None, servers: dict[str, int]) -> dict:
    return {
        "start_time": start,
        "end_time": end,
        "detail": [{"ip": ip, "gpus": [f"gpu{g}" for g in range(n)]} for ip, n in servers.items()],
    }


def test_philly_cluster_job_log(tmp_path):
    log = [
        {  # retried once: run time spans both attempts, GPUs from the first
            "status": "Pass",
            "vc": "ee9e8c",
            "jobid": "application_1",
            "submitted_time": "2017-10-07 01:11:39",
            "user": "u1",
            "attempts": [
                _attempt("2017-10-07 01:12:09", "2017-10-07 01:13:23", {"m47": 8}),
                _attempt("2017-10-07 01:13:30", "2017-10-07 02:13:09", {"m412": 8}),
            ],
        },
        {  # two servers x 8 GPUs: a 2-node gang
            "status": "Killed",
            "vc": "b436b2",
            "jobid": "application_2",
            "submitted_time": "2017-10-07 01:00:00",
            "user": "u2",
            "attempts": [
                _attempt("2017-10-07 01:30:00", "2017-10-07 03:30:00", {"m1": 8, "m2": 8})
            ],
        },
        {  # still running when the snapshot was taken: skipped
            "status": "Pass",
            "vc": "x",
            "jobid": "application_3",
            "submitted_time": "2017-10-07 01:05:00",
            "user": "u3",
            "attempts": [_attempt("2017-10-07 01:06:00", None, {"m3": 1})],
        },
        {  # never scheduled: skipped
            "status": "Failed",
            "vc": "x",
            "jobid": "application_4",
            "submitted_time": "2017-10-07 01:05:00",
            "user": "u3",
            "attempts": [],
        },
    ]
    path = tmp_path / "cluster_job_log"
    path.write_text(json.dumps(log))
    jobs = read_philly(path)
    assert [j.job_id for j in jobs] == ["application_2", "application_1"]
    two, one = jobs
    assert (two.arrival, two.nodes, two.gpus_per_node, two.duration) == (0.0, 2, 8, 7200.0)
    assert two.tenant == "b436b2"
    assert one.arrival == 11 * 60 + 39
    assert (one.nodes, one.gpus_per_node) == (1, 8)
    assert one.duration == pytest.approx(3660.0)  # 01:12:09 -> 02:13:09
    assert read_philly(path, statuses=("Pass",))[0].job_id == "application_1"


def _csv(path, rows, header=None) -> None:  # type: ignore[no-untyped-def]
    lines = [",".join(header)] if header else []
    lines += [",".join(str(c) for c in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("with_header", [False, True])
def test_pai_job_and_task_tables(tmp_path, with_header):
    jobs_csv, tasks_csv = tmp_path / "pai_job_table.csv", tmp_path / "pai_task_table.csv"
    header_j = PAI_JOB_COLUMNS if with_header else None
    header_t = PAI_TASK_COLUMNS if with_header else None
    _csv(
        jobs_csv,
        [
            ("jobA", "instA", "userA", "Terminated", 1000.0, 5000.0),
            ("jobB", "instB", "userB", "Terminated", 1500.0, 9000.0),
            ("jobC", "instC", "userA", "Failed", 1200.0, 1300.0),
            ("jobD", "instD", "userC", "Terminated", 1600.0, 1700.0),
        ],
        header_j,
    )
    _csv(
        tasks_csv,
        [
            # half a GPU: rounded up to one whole GPU
            ("jobA", "tensorflow", 1.0, "Terminated", 1100.0, 4000.0, 600.0, 29.3, 50.0, "MISC"),
            # 4 workers x 4 GPUs + a CPU-only ps: 16 GPUs, a 2 x 8 gang
            ("jobB", "worker", 4.0, "Terminated", 2000.0, 8000.0, 800.0, 60.0, 400.0, "V100"),
            ("jobB", "ps", 1.0, "Terminated", 1900.0, 8100.0, 600.0, 20.0, "", ""),
            ("jobC", "worker", 1.0, "Failed", 1250.0, 1260.0, 600.0, 10.0, 100.0, "T4"),
            # CPU only: not a GPU job
            ("jobD", "worker", 1.0, "Terminated", 1600.0, 1650.0, 600.0, 10.0, 0.0, ""),
        ],
        header_t,
    )
    jobs = read_pai(jobs_csv, tasks_csv, keep_gpu_type=True)
    assert [j.job_id for j in jobs] == ["jobA", "jobB"]
    a, b = jobs
    assert (a.arrival, a.nodes, a.gpus_per_node, a.duration) == (0.0, 1, 1, 2900.0)
    assert (a.tenant, a.accelerator) == ("userA", "misc")
    assert (b.arrival, b.nodes, b.gpus_per_node, b.duration) == (500.0, 2, 8, 6200.0)
    assert b.accelerator == "v100"
    assert [j.job_id for j in read_pai(jobs_csv, tasks_csv, statuses=("Failed",))] == ["jobC"]


def test_read_traces_replay_in_the_simulator(tmp_path):
    from sched_helpers import gpu_nodes

    jobs = [
        TraceJob("a", 0.0, 1, 1, 100.0),
        TraceJob("b", 5.0, 2, 8, 50.0),
    ]
    result = simulate(jobs, gpu_nodes(2))
    assert sorted(o.job_id for o in result.outcomes) == ["a", "b"]
