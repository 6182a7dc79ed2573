"""The command lines a rank's sandbox is built from (bwrap, `_jail.py`), what a
sandboxed launch is given, and the choice of sandbox; no process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.local import LocalBackend
from air_sdk.runner.node.launch import NodeLaunch, RankLaunch
from air_sdk.runner.node.sandbox import (
    Sandbox,
    SandboxSpec,
    bwrap_argv,
    choose_sandbox,
    gpu_devices,
    is_sandbox_wrapper,
    sandboxed_returncode,
    unshare_argv,
)

SPEC = SandboxSpec(
    hide=["/home/u/air", "/home/u/.config/air"],
    writable=["/home/u/air/jobs/j/code", "/home/u/air/jobs/j/attempts/2", "/data/ckpt"],
    tmp="/home/u/air/jobs/j/tmp",
    shm="/dev/shm/air-j",
    shared=["/data/shared"],
    hide_files=["/etc/air/tls.key"],
    read_only=["/home/u/air/jobs/j/attempts/2/nodes"],
    devices=["/dev/nvidia0", "/dev/nvidiactl", "/dev/dri"],
    cwd="/home/u/air/jobs/j/code",
)


def _pairs(argv: list[str], option: str, width: int = 2) -> list[list[str]]:
    return [argv[i + 1 : i + 1 + width] for i, a in enumerate(argv) if a == option]


def test_bwrap_shows_a_read_only_root_and_hides_the_home_but_the_jobs_directories():
    argv = bwrap_argv(SPEC, bwrap="/usr/bin/bwrap")
    assert argv[:4] == ["/usr/bin/bwrap", "--ro-bind", "/", "/"]
    assert argv[-1] == "--"
    assert _pairs(argv, "--tmpfs", 1) == [["/home/u/air"], ["/home/u/.config/air"]]
    assert _pairs(argv, "--bind") == [
        ["/dev/shm/air-j", "/dev/shm"],
        ["/home/u/air/jobs/j/tmp", "/tmp"],
        ["/data/shared", "/data/shared"],  # before the hiding: a home inside stays hidden
        *[[p, p] for p in SPEC.writable],
    ]
    assert argv.index("/data/shared") < argv.index("--tmpfs")
    # every bind of the job's own comes after the hiding it punches through
    last_hide = max(i for i, a in enumerate(argv) if a == "--tmpfs")
    assert all(argv.index(p) > last_hide for p in SPEC.writable)
    ro = _pairs(argv, "--ro-bind-try")
    assert ["/dev/null", "/etc/air/tls.key"] in ro
    assert ro[-1] == ["/home/u/air/jobs/j/attempts/2/nodes"] * 2
    assert _pairs(argv, "--dev-bind-try") == [[d, d] for d in SPEC.devices]
    assert _pairs(argv, "--chdir", 1) == [["/home/u/air/jobs/j/code"]]
    # its own /proc and pid namespace, no network namespace: ranks reach 127.0.0.1
    assert {"--proc", "--unshare-pid", "--die-with-parent", "--new-session"} <= set(argv)
    assert not {"--unshare-net", "--unshare-all"} & set(argv)
    # no capability, under a root gateway too (issue 19, item 4)
    assert _pairs(argv, "--cap-drop", 1) == [["ALL"]] and "--unshare-user" in argv


def test_bwrap_mounts_tmp_before_the_hidden_home_so_a_home_under_tmp_stays_hidden():
    argv = bwrap_argv(SandboxSpec(hide=["/tmp/h"], writable=["/tmp/h/c"], tmp="/tmp/h/t"))
    assert argv.index("/tmp") < argv.index("--tmpfs") < argv.index("/tmp/h/c")


def test_the_unshare_jail_gets_the_whole_spec_and_runs_without_site_packages():
    argv = unshare_argv(SPEC, python="/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-I", "-S"]  # isolated: no job's PYTHONPATH
    assert Path(argv[3]).name == "_jail.py" and Path(argv[3]).is_file()
    assert json.loads(argv[4]) == SPEC.__dict__
    assert argv[5:] == ["--"]


def test_a_sandbox_s_processes_are_told_from_a_rank_s():
    assert is_sandbox_wrapper(bwrap_argv(SPEC, bwrap="/usr/bin/bwrap"))
    assert is_sandbox_wrapper(unshare_argv(SPEC))
    assert not is_sandbox_wrapper(["/usr/bin/python3", "-u", "train.py", "x_jail.py"])
    assert not is_sandbox_wrapper([])


def test_gpu_devices_are_the_nvidia_dri_kfd_and_rdma_entries(tmp_path):
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "dri", "kfd", "sda", "null", "infiniband"):
        (tmp_path / name).touch()
    assert [Path(p).name for p in gpu_devices(str(tmp_path))] == [
        "dri",
        "infiniband",
        "kfd",
        "nvidia-uvm",
        "nvidia0",
        "nvidiactl",
    ]


def test_off_means_no_sandbox_and_says_what_that_exposes():
    sandbox = choose_sandbox("off")
    assert not sandbox.enabled and sandbox.wrapper(SPEC) == []
    assert "NOT sandboxed" in sandbox.describe() and "secrets" in sandbox.describe()
    assert (
        Sandbox("bwrap", "", "/usr/bin/bwrap")
        .describe()
        .startswith("ranks run sandboxed with bwrap")
    )


def test_an_unknown_sandbox_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="auto, bwrap, unshare, off"):
        choose_sandbox("docker")


def test_bwraps_128_plus_n_reads_as_signal_n_only_behind_bwrap():
    assert sandboxed_returncode(137, ["/usr/bin/bwrap", "--"]) == -9  # an OOM kill stays one
    assert sandboxed_returncode(143, ["/usr/bin/bwrap"]) == -15
    assert sandboxed_returncode(5, ["/usr/bin/bwrap"]) == 5
    assert sandboxed_returncode(137, []) == 137
    assert sandboxed_returncode(-15, ["python", "-S", "_jail.py"]) == -15


def _launch(root: Path, checkpoint: str | None) -> NodeLaunch:
    env = {"RANK": "0"}
    if checkpoint:
        env["AIR_CHECKPOINT_DIR"] = checkpoint
    return NodeLaunch(
        "j1",
        2,
        "node-0",
        str(root / "code"),
        ["train.py"],
        [RankLaunch(0, 0, env)],
        str(root / "attempts" / "2"),
        str(root / "attempts" / "2" / "nodes" / "node-0.log"),
    )


def test_a_sandboxed_launch_gets_the_jobs_own_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_CONFIG_FILE", str(tmp_path / "cfg" / "air" / "config.toml"))
    (tmp_path / "cfg" / "air").mkdir(parents=True)
    home = tmp_path / "home"
    root = home / "jobs" / "j1"
    backend = LocalBackend(
        1,
        1,
        sandbox="off",
        home=home,
        hidden_files=[tmp_path / "key.pem"],
        allowed_data_roots=[tmp_path / "data"],  # the operator approved it
    )
    backend.shm_root = tmp_path / "shm"
    backend.shm_root.mkdir()
    data = tmp_path / "data" / "default" / "ckpt"  # the system tenant's part of the root
    spec = backend.sandbox_spec("j1", root / "attempts" / "2", _launch(root, str(data)))
    assert spec.hide == [str(home), str(tmp_path / "cfg" / "air")]
    # every attempt's directory: the same sandbox serves the next attempt's warm ranks
    assert spec.writable == [str(root / "code"), str(root / "attempts"), str(data)]
    assert data.is_dir()  # bound in, so it must exist
    assert spec == backend.sandbox_spec("j1", root / "attempts" / "3", _launch(root, str(data)))
    assert spec.tmp == str(root / "tmp") and (root / "tmp").is_dir()
    assert spec.hide_files == [str(tmp_path / "key.pem")]
    assert spec.cwd == str(root / "code")
    assert spec.shm == str(tmp_path / "shm" / "air-j1")  # the job's own /dev/shm


def test_the_jobs_default_output_dir_in_the_home_is_bound_and_anothers_refused(tmp_path):
    home = tmp_path / "home"
    root = home / "jobs" / "j1"
    backend = LocalBackend(1, 1, sandbox="off", home=home)
    backend.shm_root = tmp_path / "shm"
    launch = _launch(root, None)
    own = home / "outputs" / "j1"  # where `air outputs` reads it (runner.outputs)
    launch.ranks[0].env["AIR_OUTPUT_DIR"] = str(own)
    spec = backend.sandbox_spec("j1", root / "attempts" / "2", launch)
    assert str(own) in spec.writable and own.is_dir()
    launch.ranks[0].env["AIR_OUTPUT_DIR"] = str(home / "outputs" / "j2")
    with pytest.raises(ConfigError, match="output_dir .* not in this job's directory"):
        backend.sandbox_spec("j1", root / "attempts" / "2", launch)


def test_a_checkpoint_dir_in_another_jobs_directory_is_refused(tmp_path):
    home = tmp_path / "home"
    root = home / "jobs" / "j1"
    backend = LocalBackend(1, 1, sandbox="off", home=home)
    backend.shm_root = tmp_path / "shm"
    other = str(home / "jobs" / "j2" / "checkpoints")
    with pytest.raises(ConfigError, match="not in this job's directory"):
        backend.sandbox_spec("j1", root / "attempts" / "2", _launch(root, other))
    assert not (home / "jobs" / "j2").exists()


def test_a_forged_node_record_gets_no_foreign_process_dumped_or_killed(tmp_path):
    """A sandboxed job can write its attempts' records: a pid there counts only when it
    runs below the job's NodeRunner (here this test's process, with no such child)."""
    import os

    from air_sdk.procs import create_time
    from air_sdk.runner.backends.local import LocalAttempt, _Node
    from air_sdk.runner.node.process import NodeProcess, attempt_record_path
    from air_sdk.runner.node.records import AttemptRecord, RankRecord, write_json

    attempt_dir = tmp_path / "jobs" / "j1" / "attempts" / "1"
    record_path = attempt_record_path(attempt_dir, "node-0")
    forged = AttemptRecord(
        job_id="j1",
        attempt=1,
        node="node-0",
        runner_pid=1,
        runner_create_time=create_time(1),
        ranks=[RankRecord(rank=0, local_rank=0, pid=1, create_time=create_time(1))],
    )
    write_json(record_path, forged)
    runner = NodeProcess(tmp_path / "jobs" / "j1" / "nodes" / "node-0", os.getpid(), None)
    node = _Node("node-0", runner, record_path, attempt_dir / "nodes" / "node-0.log")
    backend = LocalBackend(1, 1, sandbox="off")
    assert backend._live_ranks(LocalAttempt("j1", 1, attempt_dir, [node])) == {}
    # nor does a gateway that restarts adopt pid 1 as the job's NodeRunner
    assert backend.attach("j1", 1, attempt_dir, 1) is None
