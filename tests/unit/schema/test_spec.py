import pytest
from pydantic import ValidationError

from air_sdk.schema import Event, JobSnapshot, JobSpec, JobState, Parallelism, Resources
from air_sdk.schema.state import InvalidTransitionError, check_transition


def test_valid_spec_defaults():
    spec = JobSpec(entrypoint="train.py", resources=Resources(nodes=2))
    assert spec.resources.world_size == 2
    assert spec.api_version == "air/v1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"entrypoint": "t.py", "resources": {"nodes": 0}}, "resources.nodes"),
        ({"entrypoint": "/etc/passwd"}, "entrypoint"),
        ({"entrypoint": "../x.py"}, "entrypoint"),
        ({"entrypoint": "t.py", "name": "has space"}, "name"),
        ({"entrypoint": "t.py", "env": {"RANK": "3"}}, "env"),
        ({"entrypoint": "t.py", "env": {"AIR_JOB_ID": "x"}}, "env"),
        ({"entrypoint": "t.py", "max_restarts": -1}, "max_restarts"),
        ({"entrypoint": "t.py", "unknown": 1}, "unknown"),
    ],
)
def test_invalid_specs_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        JobSpec(**kwargs)
    locs = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert any(loc.startswith(field) for loc in locs), locs


def test_exactly_one_program():
    with pytest.raises(ValidationError, match="exactly one of entrypoint"):
        JobSpec()
    with pytest.raises(ValidationError, match="exactly one of entrypoint"):
        JobSpec(entrypoint="a.py", code="print(1)")


def test_gpus_imply_one_rank_per_gpu():
    assert Resources(nodes=2, gpus_per_node=8).world_size == 16
    with pytest.raises(ValidationError, match="one rank per GPU"):
        Resources(procs_per_node=3, gpus_per_node=8)


def test_terminal_states_are_final():
    assert JobState.SUCCEEDED.terminal and not JobState.RUNNING.terminal
    check_transition(JobState.QUEUED, JobState.SCHEDULED)
    with pytest.raises(InvalidTransitionError):
        check_transition(JobState.SUCCEEDED, JobState.RUNNING)
    with pytest.raises(InvalidTransitionError):
        check_transition(JobState.QUEUED, JobState.RUNNING)


def ev(seq, type, data, rank=None):
    return Event(seq=seq, job_id="j", ts=float(seq), type=type, data=data, rank=rank)


def test_snapshot_folds_events_and_ignores_repeats():
    events = [
        ev(1, "state", {"state": "QUEUED"}),
        ev(2, "attempt", {"attempt": 1, "phase": "started"}),
        ev(3, "state", {"state": "RUNNING"}),
        ev(
            4,
            "metrics",
            {
                "points": [
                    {"step": 1, "ts": 10.0, "values": {"loss": 2.0}},
                    {"step": 11, "ts": 12.0, "values": {"loss": 1.0}},
                ]
            },
            rank=0,
        ),
        ev(5, "log", {"lines": ["hello"]}, rank=1),
        ev(6, "state", {"state": "SUCCEEDED", "reason": "every rank exited 0"}),
    ]
    snap = JobSnapshot.fold("j", events)
    snap.apply(events[3])  # a repeat after a reconnect changes nothing
    assert snap.state is JobState.SUCCEEDED and snap.attempt == 1
    assert snap.step == 11 and snap.latest["loss"] == 1.0
    assert snap.series["loss"] == [(1, 2.0), (11, 1.0)]
    assert snap.steps_per_second == pytest.approx(5.0)
    assert snap.log_tail[1] == ["hello"]
    assert snap.last_seq == 6


def test_snapshot_keeps_failure_utilization_and_checkpoints():
    events = [
        ev(
            1,
            "state",
            {
                "state": "RESTARTING",
                "reason": "rank 1 exit code 3",
                "failure": {
                    "attempt": 1,
                    "reason": "rank 1 exit code 3",
                    "rank": 1,
                    "exit_code": 3,
                },
            },
        ),
        ev(
            2,
            "util",
            {
                "samples": [
                    {"node": "node-0", "device": "cpu", "ts": 2.0, "util_pct": 50.0},
                    {"node": "node-0", "device": "cpu", "ts": 3.0, "util_pct": 75.0},
                ]
            },
            rank=0,
        ),
        ev(
            3,
            "checkpoint",
            {
                "step": 100,
                "path": "/ckpt/100",
                "world_size": 2,
                "size_bytes": 10,
                "num_files": 3,
                "blocked_s": 0.1,
                "durable_s": 1.0,
            },
        ),
    ]
    snap = JobSnapshot.fold("j", events)
    assert snap.failure is not None and (snap.failure.rank, snap.failure.exit_code) == (1, 3)
    assert snap.num_restarts == 1
    assert snap.utilization["node-0/cpu"].util_pct == 75.0
    assert [c.step for c in snap.checkpoints] == [100]


# -- parallelism: the mesh sizes a job asks for ------------------------------------------


def _spec(nodes: int = 2, procs: int = 2, gpus: int = 0, **layout: int) -> JobSpec:
    return JobSpec(
        entrypoint="train.py",
        resources=Resources(nodes=nodes, procs_per_node=procs, gpus_per_node=gpus),
        parallelism=Parallelism(**layout),
    )


def test_dp_shard_minus_one_takes_what_the_other_sizes_leave() -> None:
    assert _spec(tp=2).parallelism.resolve(4).sizes() == {
        "pp": 1,
        "dp_replicate": 1,
        "dp_shard": 2,
        "cp": 1,
        "tp": 2,
    }
    assert _spec(pp=2, tp=2).parallelism.resolve(4).dp_shard == 1


def test_a_layout_whose_product_is_not_the_world_size_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(ValidationError) as err:
        _spec(dp_shard=2, tp=1)  # 2 ranks asked, 4 in the job
    message = str(err.value)
    assert "dp_shard=2" in message and "= 2 ranks, but the job has 4" in message
    assert "dp_shard=-1" in message


def test_sizes_that_do_not_divide_the_world_are_refused() -> None:
    with pytest.raises(ValidationError, match="does not divide the job's 4 ranks"):
        _spec(pp=3)


def test_tensor_parallel_stays_inside_one_node() -> None:
    with pytest.raises(ValidationError, match="tp=4 must stay inside one node") as err:
        _spec(nodes=2, procs=2, tp=4)
    assert "raise procs_per_node" in str(err.value)
    _spec(nodes=2, procs=2, tp=2)  # two ranks of one node: fine


def test_context_parallel_needs_gpus() -> None:
    with pytest.raises(ValidationError, match="cp=2 needs GPUs"):
        _spec(cp=2)
    assert _spec(nodes=1, procs=1, gpus=4, cp=2).parallelism.cp == 2


def test_dp_shard_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="dp_shard=0"):
        Parallelism(dp_shard=0)


def test_the_default_layout_fits_any_world_size_and_round_trips() -> None:
    spec = _spec(nodes=3, procs=1)
    assert spec.parallelism.is_default
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert spec.parallelism.resolve(3).dp_shard == 3


def test_a_job_may_set_the_runtimes_throughput_knobs_but_no_other_air_variable():
    from air_sdk.schema import JobSpec

    spec = JobSpec(entrypoint="t.py", env={"AIR_PEAK_FLOPS": "4e14", "AIR_MFU_DTYPE": "fp8"})
    assert spec.env["AIR_PEAK_FLOPS"] == "4e14"
    with pytest.raises(ValueError, match="AIR_FLOPS_PER_TOKEN is set by AIR"):
        JobSpec(entrypoint="t.py", env={"AIR_FLOPS_PER_TOKEN": "1"})


def test_a_job_may_turn_autolog_off_but_set_no_other_air_variable():
    assert JobSpec(entrypoint="t.py", env={"AIR_AUTOLOG": "0"}).env == {"AIR_AUTOLOG": "0"}
    with pytest.raises(ValidationError, match="set by AIR"):
        JobSpec(entrypoint="t.py", env={"AIR_AUTOLOGX": "0"})


def test_a_librarys_loss_is_shown_first_and_is_the_summarys_loss():
    from air_sdk.schema.snapshot import loss_name, metric_order

    names = ["epoch", "val_loss", "train_loss", "lr", "grad_norm"]
    assert sorted(names, key=metric_order) == ["train_loss", "val_loss", "epoch", "grad_norm", "lr"]
    assert sorted(["train_loss", "loss"], key=metric_order) == ["loss", "train_loss"]
    assert loss_name(["epoch", "train/loss"]) == "train/loss"
    assert loss_name(["eval_loss", "epoch"]) == "eval_loss" and loss_name(["acc"]) is None


def test_a_module_job_is_one_program_with_a_dotted_name():
    assert JobSpec(module="pkg.train").module == "pkg.train"
    with pytest.raises(ValueError, match="exactly one of entrypoint .a script., module"):
        JobSpec(module="pkg.train", entrypoint="train.py")
    with pytest.raises(ValueError, match="not a dotted module name such as pkg.train"):
        JobSpec(module="pkg/train.py")
    with pytest.raises(ValueError, match="starts with '-': python would read it as an option"):
        JobSpec(entrypoint="-m.py")


def test_output_dir_must_be_absolute_or_a_url_and_says_why():
    assert JobSpec(entrypoint="t.py", output_dir="/data/runs/7").output_dir == "/data/runs/7"
    assert JobSpec(entrypoint="t.py", output_dir="s3://b/runs").output_dir == "s3://b/runs"
    with pytest.raises(
        ValueError, match="'runs/x' is relative: ranks start in the job's code copy"
    ):
        JobSpec(entrypoint="t.py", output_dir="runs/x")
    with pytest.raises(ValueError, match="holds '..'"):
        JobSpec(entrypoint="t.py", output_dir="/data/../etc")
