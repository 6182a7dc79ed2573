"""What a node runs: the env contract of each rank as the runner plans it (torchrun's
variables from the placement, AIR's own), what of the gateway's environment ranks
get, and the rules that let a warm interpreter become a rank (no processes here)."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.local import warm_ranks_enabled
from air_sdk.runner.node._warm import _key
from air_sdk.runner.node.env import allowed_env
from air_sdk.runner.node.launch import NodeLaunch
from air_sdk.runner.node.plan import attempt_worker, localize, plan_node
from air_sdk.schema import JobSpec, Resources

SPEC = JobSpec(
    entrypoint="train.py",
    args=["--lr", "1"],
    env={"WANDB_PROJECT": "p", "OMP_NUM_THREADS": "4"},
    resources=Resources(nodes=2, procs_per_node=2),
    max_restarts=5,
)


def node(attempt: int = 1, group_rank: int = 1, master=("10.0.0.1", 29400), **kw) -> NodeLaunch:
    worker = attempt_worker(
        job_id="j7",
        attempt=attempt,
        spec=SPEC,
        gateway_url="http://gw:8470",
        job_token=f"airw_token{attempt}",
        checkpoint_dir="/ckpt/j7",
    )
    options = dict(
        worker=worker,
        spec=SPEC,
        node="node-1",
        group_rank=group_rank,
        num_nodes=2,
        entrypoint="train.py",
        cwd="/jobs/j7/code",
        attempt_dir=f"/jobs/j7/attempts/{attempt}",
        log_path=f"/jobs/j7/attempts/{attempt}/nodes/node-1.log",
        master=master,
        cuda_visible_devices="",
        loopback=True,
        warm=True,
    )
    options.update(kw)
    return plan_node(**options)


def test_each_rank_gets_the_env_torchrun_would_give_it():
    ranks = node().ranks
    assert [(r.rank, r.local_rank) for r in ranks] == [(2, 0), (3, 1)]
    env = ranks[0].env
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")
    assert (env["ROLE_NAME"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("default", "2", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29400")
    assert env["TORCHELASTIC_RUN_ID"] == "j7" and env["TORCHELASTIC_MAX_RESTARTS"] == "5"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU job sees no GPU
    assert env["AIR_JOB_ID"] == "j7" and env["AIR_NODE_NAME"] == "node-1"
    assert env["AIR_ATTEMPT_DIR"] == "/jobs/j7/attempts/1"
    assert env["PWD"] == "/jobs/j7/code"  # the rank's working directory, as a shell sets it
    assert node().command == ["train.py", "--lr", "1"]


def test_the_restart_count_counts_airs_restarts():
    assert node(attempt=1).ranks[0].env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert node(attempt=4).ranks[0].env["TORCHELASTIC_RESTART_COUNT"] == "3"
    assert node(attempt=4).ranks[0].env["TORCHELASTIC_RUN_ID"] == "j7"  # one id across restarts


def test_the_jobs_env_is_there_and_overrides_airs_defaults():
    launch = node()
    env = launch.ranks[0].env
    assert env["WANDB_PROJECT"] == "p" and env["OMP_NUM_THREADS"] == "4"
    assert launch.defaults == {
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # virtual nodes of one machine
    }
    assert "GLOO_SOCKET_IFNAME" not in node(loopback=False).defaults


def test_a_plan_travels_as_json_and_a_ray_node_fills_in_its_paths():
    launch = node(master=None)
    assert "MASTER_ADDR" not in launch.ranks[0].env  # the node learns it when it starts
    assert NodeLaunch.from_json(launch.to_json()) == launch
    here = localize(launch, cwd="/tmp/n/code", attempt_dir="/tmp/n/a1", log_path="/tmp/n/a1.log")
    assert (here.cwd, here.ranks[1].env["PWD"], here.ranks[1].env["AIR_ATTEMPT_DIR"]) == (
        "/tmp/n/code",
        "/tmp/n/code",
        "/tmp/n/a1",
    )


def test_ranks_get_an_allow_list_of_the_gateways_environment():
    gateway = {
        "PATH": "/usr/bin",
        "HOME": "/home/air",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "CUDA_HOME": "/usr/local/cuda",
        "NCCL_DEBUG": "INFO",
        "HF_HOME": "/cache/hf",
        "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
        "AIR_CHECKPOINT_ON_FAILURE": "0",  # an operator default for the runtime
        # not for jobs:
        "AIR_TOKEN": "air_" + "a" * 43,
        "HF_TOKEN": "hf_secret",
        "AWS_SECRET_ACCESS_KEY": "k",
        "DATABASE_URL": "postgres://u:p@db/air",
        "RAY_ADDRESS": "head:6379",
        "HTTPS_PROXY": "http://user:pw@proxy:3128",
        "NCCL_IB_KEY": "k",
        "RANK": "7",  # AIR sets the contract itself
        "TORCHELASTIC_RUN_ID": "someone-elses",
        "CUDA_VISIBLE_DEVICES": "0",  # the placement decides
        "PYTHON_TOKEN_FOR_X": "air_" + "b" * 43,
    }
    assert allowed_env(gateway) == {
        "PATH": "/usr/bin",
        "HOME": "/home/air",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "CUDA_HOME": "/usr/local/cuda",
        "NCCL_DEBUG": "INFO",
        "HF_HOME": "/cache/hf",
        "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
        "AIR_CHECKPOINT_ON_FAILURE": "0",
    }
    assert allowed_env({"HTTPS_PROXY": "http://proxy:3128"}) == {"HTTPS_PROXY": "http://proxy:3128"}
    # a Ray node keeps the GPUs Ray gave its actor
    kept = allowed_env({"CUDA_VISIBLE_DEVICES": "2,3"}, keep=frozenset({"CUDA_VISIBLE_DEVICES"}))
    assert kept == {"CUDA_VISIBLE_DEVICES": "2,3"}


def full_env(launch: NodeLaunch, local_rank: int = 0, **base: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin", **base}
    for name, value in launch.defaults.items():
        env.setdefault(name, value)
    return {**env, **launch.ranks[local_rank].env}


def test_a_warm_interpreter_serves_any_rank_of_the_next_attempt_but_not_another_setup():
    first, second = node(attempt=1), node(attempt=2)
    # what changes from attempt to attempt (rank, token, restart count...) does not matter
    assert _key(first, full_env(first, 0)) == _key(second, full_env(second, 1))
    assert "AIR_JOB_TOKEN" in first.attempt_env and "AIR_JOB_ID" not in first.attempt_env
    # what shapes an interpreter's imports, or where it runs, does
    changed = full_env(second, PYTHONPATH="/other")
    assert _key(first, full_env(first)) != _key(second, changed)
    elsewhere = node(attempt=2, cwd="/jobs/j8/code")
    assert _key(first, full_env(first)) != _key(elsewhere, full_env(elsewhere))


def test_warm_interpreters_are_on_unless_turned_off(monkeypatch):
    monkeypatch.delenv("AIR_WARM_RANKS", raising=False)
    assert warm_ranks_enabled() is True
    monkeypatch.setenv("AIR_WARM_RANKS", "0")
    assert warm_ranks_enabled() is False
    assert warm_ranks_enabled(True) is True  # an explicit choice wins
    monkeypatch.setenv("AIR_WARM_RANKS", "many")
    with pytest.raises(ConfigError, match="AIR_WARM_RANKS='many': give 1"):
        warm_ranks_enabled()


def test_the_output_dir_and_checkpoint_interval_reach_every_rank_and_stay_warm():
    spec = SPEC.model_copy(
        update={"checkpoint": SPEC.checkpoint.model_copy(update={"every_steps": 25})}
    )
    worker = attempt_worker(
        job_id="j7",
        attempt=1,
        spec=spec,
        gateway_url="http://gw:8470",
        job_token="airw_t",
        checkpoint_dir="/ckpt/j7",
        output_dir="/home/air/outputs/j7",
    )
    launch = plan_node(
        worker=worker,
        spec=spec,
        node="node-0",
        group_rank=0,
        num_nodes=2,
        entrypoint="train.py",
        cwd="/jobs/j7/code",
        attempt_dir="/jobs/j7/attempts/1",
        log_path="/jobs/j7/attempts/1/nodes/node-0.log",
        master=("10.0.0.1", 29400),
        cuda_visible_devices="",
        loopback=True,
        warm=True,
    )
    for rank in launch.ranks:
        assert rank.env["AIR_OUTPUT_DIR"] == "/home/air/outputs/j7"
        assert rank.env["AIR_CHECKPOINT_EVERY"] == "25"
    # the same in every attempt: a warm interpreter may start with them
    assert "AIR_OUTPUT_DIR" not in launch.attempt_env
    assert "AIR_CHECKPOINT_EVERY" not in launch.attempt_env
    assert "AIR_CHECKPOINT_EVERY" not in node().ranks[0].env  # no interval asked: none set
