"""schema.WorkerEnv: the env contract of a rank, named once, read back as written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import air_sdk
from air_sdk.schema import WorkerEnv
from air_sdk.schema.worker_env import AIR_ENV_PREFIX, DEFAULTED_ENV, RESERVED_ENV


def full() -> WorkerEnv:
    return WorkerEnv(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=4,
        group_rank=1,
        group_world_size=2,
        role_name="default",
        role_rank=5,
        role_world_size=8,
        master_addr="10.0.0.1",
        master_port=29500,
        restart_count=2,
        max_restarts=3,
        run_id="job-9",
        use_agent_store=False,
        error_file="/tmp/err.json",
        cuda_visible_devices="0,1,2,3",
        job_id="job-9",
        attempt=3,
        gateway_url="http://127.0.0.1:8470",
        job_token="airw_secret",
        node_name="node-1",
        attempt_dir="/air/jobs/job-9/attempts/3",
        checkpoint_dir="/ckpt",
        checkpoint_keep=2,
        checkpoint_every=50,
        parallelism='{"dp_replicate":1,"dp_shard":8,"tp":1,"pp":1,"cp":1}',
        output_dir="/out",
        flops_per_token=855383040.0,
        flight_recorder="1",
        checkpoint_on_failure="0",
        checkpoint_snapshot="fork",
        autolog="0",
        peak_flops=989e12,
        mfu_dtype="bf16",
        count_flops="0",
        sample_interval_s=0.5,
        data_cache="/scratch/air-data",
        omp_num_threads=1,
        python_unbuffered="1",
        gloo_socket_ifname="lo",
        nccl_async_error_handling="1",
        pwd="/code",
    )


def test_every_field_round_trips_through_the_environment():
    worker = full()
    env = worker.to_env()
    assert len(env) == len(WorkerEnv.model_fields)  # every field set, every one rendered
    assert WorkerEnv.from_env(env) == worker


def test_the_names_are_torchruns_and_airs():
    env = full().to_env()
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_RANK"]) == (
        "5",
        "1",
        "8",
        "1",
    )
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2" and env["TORCHELASTIC_RUN_ID"] == "job-9"
    # torch compares this one with str(True): it must be written as torchrun writes it
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert env["AIR_PARALLELISM"].startswith("{") and env["AIR_OUTPUT_DIR"] == "/out"
    assert env["PWD"] == "/code"


def test_unknown_and_empty_variables_are_ignored():
    worker = WorkerEnv.from_env({"RANK": "2", "WORLD_SIZE": " 4 ", "LOCAL_RANK": "", "PATH": "/b"})
    assert (worker.rank, worker.world_size, worker.local_rank) == (2, 4, 0)


def test_a_bad_value_names_the_variable_and_what_to_do():
    with pytest.raises(ValueError, match="MASTER_PORT='99999'.*launch with torchrun"):
        WorkerEnv.from_env({"MASTER_PORT": "99999"})


def test_the_job_token_stays_out_of_the_repr():
    assert "airw_secret" not in repr(full())


def test_a_job_may_not_set_what_air_sets_but_may_set_the_defaults():
    assert {"RANK", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "PWD"} <= RESERVED_ENV
    assert {
        "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED",
        "GLOO_SOCKET_IFNAME",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    } == DEFAULTED_ENV
    assert not DEFAULTED_ENV & RESERVED_ENV


def _string_constants(path: Path) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_module_spells_a_contract_variable_itself():
    """AIR's variables and torchrun's are named in worker_env.py only; everything else
    asks WorkerEnv for the name."""
    root = Path(air_sdk.__file__).parent
    contract = {n for n in WorkerEnv.names() if n.startswith(AIR_ENV_PREFIX)} | RESERVED_ENV
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = str(path.relative_to(root))
        if path.name == "worker_env.py" or relative in BEFORE_PYDANTIC:
            continue
        for line, value in _string_constants(path):
            if value in contract and not (path.name == "terminal_views.py" and value == "RANK"):
                found.append(f"{relative}:{line}: {value!r}")
    assert found == []  # cli/terminal_views.py's "RANK" is a table's column title


#: modules that run in a rank (or the NodeRunner) before pydantic may be imported: they
#: spell the names they read, and those must be the contract's
BEFORE_PYDANTIC = {"runtime/_rank_main.py", "runtime/supervise.py", "runtime/_flight_recorder.py"}


def test_modules_that_start_before_pydantic_spell_only_contract_names():
    root = Path(air_sdk.__file__).parent
    for relative in BEFORE_PYDANTIC:
        spelled = {
            value
            for _, value in _string_constants(root / relative)
            if value.startswith(AIR_ENV_PREFIX) and value.isupper()
        }
        assert spelled and spelled <= WorkerEnv.names(), (relative, spelled - WorkerEnv.names())
