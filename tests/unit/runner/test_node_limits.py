"""Per-job limits (issue 19), the parts without processes: the sizes a user writes, the
operator's caps, the reason texts a user reads, how a limit hit is judged (failed at
once, never against the node), the rlimits a rank gets and the disk walk's counting.
The watch and the rlimits binding are tested through a real gateway in
`tests/integration/test_job_limits.py` (this file is not `test_limits.py`: that basename is the
gateway's request limits, and basenames are unique)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from air_sdk.runner.node.launch import NodeLaunch, RankLaunch
from air_sdk.runner.node.limits import (
    DATA_HEADROOM,
    NodeLimits,
    Usage,
    disk_usage,
    explain_exit,
    measure,
    over,
)
from air_sdk.runner.node.plan import localize, plan_node
from air_sdk.runner.policy import FailureAction, RestartPolicy, diagnose, node_evidence
from air_sdk.schema import JobLimits, JobSpec, RankExit, WorkerEnv
from air_sdk.schema.limits import parse_size

ASK = "ask the operator"


# ---- what a user writes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "num_bytes"),
    [
        ("512MiB", 512 << 20),
        ("4GiB", 4 << 30),
        ("2G", 2 << 30),
        ("2g", 2 << 30),
        ("500MB", 500_000_000),
        ("1.5GiB", 3 << 29),
        ("1048576", 1 << 20),
        (1 << 20, 1 << 20),
    ],
)
def test_sizes_are_read_as_people_write_them(text, num_bytes):
    assert parse_size(text) == num_bytes


@pytest.mark.parametrize("bad", ["lots", "-1GiB", "0", "4 parsecs", "1e9", ""])
def test_a_size_that_is_none_says_how_to_write_one(bad):
    with pytest.raises(ValidationError, match="memory limit"):
        JobLimits(memory=bad)


def test_a_limit_too_small_for_an_interpreter_is_refused_saying_so():
    with pytest.raises(ValidationError, match="below 1 MiB: not even an interpreter starts"):
        JobLimits(disk="4KiB")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        JobLimits(processes=0)


def test_limits_travel_in_the_spec_as_bytes():
    spec = JobSpec(entrypoint="t.py", limits={"memory": "64MiB", "disk": "1G", "processes": 8})
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again.limits == JobLimits(memory=64 << 20, processes=8, disk=1 << 30)


# ---- the operator's caps ------------------------------------------------------------------


def test_a_job_runs_under_the_smaller_of_its_limit_and_the_cap_and_under_the_cap_without_one():
    cap = JobLimits(memory="4GiB", processes=256)
    assert JobLimits(memory="1GiB").capped(cap) == JobLimits(memory=1 << 30, processes=256)
    assert JobLimits().capped(cap) == cap
    assert JobLimits(disk="1GiB").capped(JobLimits()) == JobLimits(disk=1 << 30)


def test_asking_more_than_a_cap_is_refused_naming_the_cap_and_both_ways_out():
    cap = JobLimits(memory="4GiB", processes=256, disk="10GiB")
    assert JobLimits(memory="4GiB", processes=256).over(cap) is None
    assert JobLimits(memory="8GiB").over(JobLimits()) is None
    assert JobLimits(processes=1000).over(cap) == (
        "process limit 1000 is over this gateway's cap of 256: ask for 256 or less"
        " (--max-processes), or ask the operator (air gateway start --max-job-processes)"
    )
    refusal = JobLimits(disk="11GiB").over(cap)
    assert refusal is not None
    assert "disk limit 11 GiB is over this gateway's cap of 10 GiB" in refusal
    assert "--disk-limit" in refusal and "--max-job-disk" in refusal


# ---- the reasons a user reads -------------------------------------------------------------


def test_the_watch_names_the_limit_and_both_numbers():
    limits = NodeLimits(memory=128 << 20, processes=64, disk=16 << 20)
    assert over(limits, Usage(5, 260 << 20), None, "node-0") == (
        "memory limit: job used 260 MiB > limit 128 MiB on node-0 (set --memory-limit / "
        + ASK
        + ")"
    )
    assert over(limits, Usage(212, 0), None, "node-0") == (
        "process limit: job ran 212 processes and threads > limit 64 on node-0"
        " (set --max-processes / " + ASK + ")"
    )
    assert over(limits, None, 40 << 20, "node-0") == (
        "disk limit: job's directories hold 40 MiB > limit 16 MiB (set --disk-limit / " + ASK + ")"
    )
    assert over(limits, Usage(64, 128 << 20), 16 << 20, "node-0") is None  # at, not past
    assert over(NodeLimits(), Usage(10**6, 1 << 40), 1 << 50, "n") is None


def test_an_rlimit_hit_is_read_from_the_ranks_end():
    limits = NodeLimits(memory=64 << 20, processes=32, disk=8 << 20)
    too_large = ["Traceback (most recent call last):", "OSError: [Errno 27] File too large"]
    assert explain_exit(limits, 0, 1, too_large) == (
        "disk limit: rank 0 wrote a file past 8 MiB, the job's disk limit (set --disk-limit / "
        + ASK
        + ")"
    )
    assert explain_exit(limits, 2, -25, [])  # SIGXFSZ: a program that does not ignore it
    memory = explain_exit(
        limits, 1, 1, ["numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8 GiB"]
    )
    assert memory is not None and memory.startswith(
        "memory limit: rank 1 could not allocate memory under the job's limit of 64 MiB"
    )
    fork = ["BlockingIOError: [Errno 11] Resource temporarily unavailable"]
    assert explain_exit(limits, 0, 1, fork, nproc=True).startswith("process limit: rank 0")
    assert explain_exit(limits, 0, 1, fork) is None  # no RLIMIT_NPROC was set
    # no limit of that kind, or a clean exit: the end says nothing of limits
    assert explain_exit(NodeLimits(), 0, 1, too_large + ["MemoryError"]) is None
    assert explain_exit(limits, 0, 0, ["MemoryError"]) is None
    assert explain_exit(limits, 0, 1, ["ValueError: bad lr"]) is None


# ---- how a limit hit is judged --------------------------------------------------------------


def test_a_limit_hit_fails_the_job_at_once_and_is_not_evidence_against_the_node():
    reason = "memory limit: job used 260 MiB > limit 128 MiB on node-0 (set --memory-limit / x)"
    killed = RankExit(rank=0, node="node-0", signal="SIGKILL", limit=reason)
    peer = RankExit(rank=1, node="node-0", signal="SIGKILL", limit=reason)
    failure = diagnose(1, [(1.0, killed), (1.1, peer)], [killed, peer], [], {})
    assert (failure.kind, failure.reason, failure.rank) == ("limit", reason, 0)
    decision = RestartPolicy(max_restarts=5).make_decision(failure, num_restarts=0)
    assert decision.action is FailureAction.FAIL
    assert decision.reason == f"{reason}; not restarted: raise the limit or use less"
    assert node_evidence(failure, tenant="a", job_id="j", now=1.0) is None
    # the same SIGKILL without a limit is a crash, restarted
    plain = diagnose(1, [(1.0, RankExit(rank=0, node="node-0", signal="SIGKILL"))], [], [], {})
    assert plain.kind == "crash"
    assert RestartPolicy(max_restarts=5).make_decision(plain, num_restarts=0).action is (
        FailureAction.RESTART
    )


# ---- what a rank gets ---------------------------------------------------------------------


def test_ranks_get_fsize_and_data_and_nproc_only_where_it_binds():
    limits = NodeLimits(memory=64 << 20, processes=32, disk=8 << 20)
    assert limits.rlimits(user_namespace=True, root=False) == {
        "DATA": (64 << 20) + DATA_HEADROOM,
        "FSIZE": 8 << 20,
        "NPROC": 32,
    }
    # root is never limited by RLIMIT_NPROC; without a user namespace of its own it would
    # count every process of the gateway's user
    assert "NPROC" not in limits.rlimits(user_namespace=True, root=True)
    assert "NPROC" not in limits.rlimits(user_namespace=False, root=False)
    assert NodeLimits().rlimits(user_namespace=True, root=False) == {}


def test_the_plan_gives_each_node_the_jobs_limits_and_its_writable_directories():
    spec = JobSpec(entrypoint="t.py", limits={"memory": "1GiB", "processes": 64, "disk": "2GiB"})
    worker = WorkerEnv(job_id="j", attempt=1, checkpoint_dir="/h/jobs/j/ckpt",
                       output_dir="s3://bucket/out")  # fmt: skip
    launch = plan_node(
        worker=worker, spec=spec, node="n0", group_rank=0, num_nodes=1, entrypoint="t.py",
        cwd="/h/jobs/j/code", attempt_dir="/h/jobs/j/attempts/1", log_path="/l",
        master=None, cuda_visible_devices="", loopback=True, warm=False,
    )  # fmt: skip
    assert launch.limits == NodeLimits(
        memory=1 << 30,
        processes=64,
        disk=2 << 30,
        disk_dirs=["/h/jobs/j/code", "/h/jobs/j/attempts", "/h/jobs/j/ckpt"],  # no URL
    )
    assert NodeLaunch.from_json(launch.to_json()) == launch
    moved = localize(launch, cwd="/r/code", attempt_dir="/r/attempts/1", log_path="/r/l")
    assert moved.limits.disk_dirs == ["/r/code", "/r/attempts", "/h/jobs/j/ckpt"]


def test_an_older_launch_without_limits_reads_as_none():
    launch = NodeLaunch("j", 1, "n", "/c", ["t.py"], [RankLaunch(0, 0, {})], "/a", "/a/l")
    data = launch.to_json().replace(
        ', "limits": {"memory": null, "processes": null, "disk": null, "disk_dirs": []}', ""
    )
    assert "limits" not in data
    assert NodeLaunch.from_json(data).limits == NodeLimits()


# ---- what the watch counts ------------------------------------------------------------------


def test_the_disk_walk_counts_each_file_once_and_follows_no_link(tmp_path: Path):
    job = tmp_path / "job"
    (job / "out" / "deep").mkdir(parents=True)
    (job / "out" / "deep" / "a").write_bytes(os.urandom(300_000))
    os.link(job / "out" / "deep" / "a", job / "out" / "hardlink-of-a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(2_000_000))
    (job / "out" / "link-out").symlink_to(outside)
    (job / "out" / "file-link").symlink_to(outside / "big")
    used = disk_usage([str(job), str(job / "out"), str(tmp_path / "missing")])
    assert 300_000 <= used < 400_000
    # a writable directory the job replaced by a link to elsewhere is not walked
    (tmp_path / "outputs-link").symlink_to(outside)
    assert disk_usage([str(tmp_path / "outputs-link")]) == 0


def test_the_process_count_includes_threads(tmp_path: Path):
    import threading

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(5)]
    for t in threads:
        t.start()
    try:
        usage = measure([os.getpid(), 2**22 + 12345])  # a pid that is gone counts nothing
        assert usage.tasks >= 6 and usage.memory > 1 << 20
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_an_operator_cap_that_is_no_size_is_refused_at_start_naming_its_flag():
    from air_sdk.errors import ConfigError
    from air_sdk.gateway.server import GatewayOptions, limit_caps

    assert limit_caps(GatewayOptions(max_job_disk="100GiB", max_job_processes=512)) == JobLimits(
        processes=512, disk=100 << 30
    )
    with pytest.raises(ConfigError, match="--max-job-disk: disk limit 'lots' is not a size"):
        limit_caps(GatewayOptions(max_job_disk="lots"))
    with pytest.raises(ConfigError, match="--max-job-memory: memory limit 512 KiB is below 1 MiB"):
        limit_caps(GatewayOptions(max_job_memory="512KiB"))
