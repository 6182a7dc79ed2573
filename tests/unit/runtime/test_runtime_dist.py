"""`air.init()` / `air.shutdown()` in real processes (each test runs its own interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_runtime_shipper import FakeGateway

import air_sdk
import air_sdk.runtime as air
from air_sdk.errors import ConfigError
from air_sdk.schema.events import WorkerReport

pytest.importorskip("torch")

REPO_ROOT = Path(air_sdk.__file__).resolve().parents[1]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("AIR_")}
    return {**env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **extra}


def run_script(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120
    )


def test_init_without_a_launcher_makes_a_world_of_one_and_shutdown_ends_it(
    tmp_path: Path,
) -> None:
    done = run_script(
        tmp_path,
        """
        import json
        import torch, torch.distributed as dist
        import air_sdk.runtime as air

        ctx = air.init()
        assert air.init() == ctx  # a second call leaves the group alone
        total = torch.ones(3)
        dist.all_reduce(total)
        seen = {"rank": ctx.rank, "world": ctx.world_size, "dist_world": dist.get_world_size(),
                "backend": dist.get_backend(), "sum": total.tolist()}
        air.shutdown()
        air.shutdown()  # runs once
        seen["initialized_after"] = dist.is_initialized()
        print(json.dumps(seen))
        """,
        bare_env(),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "rank": 0,
        "world": 1,
        "dist_world": 1,
        "backend": "gloo",
        "sum": [1.0, 1.0, 1.0],
        "initialized_after": False,
    }


def test_a_ddp_script_that_never_calls_shutdown_exits_cleanly(tmp_path: Path) -> None:
    done = run_script(
        tmp_path,
        """
        import torch
        import air_sdk.runtime as air

        air.init(timeout_s=60)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.randn(8, 4)).sum().backward()
        print("trained")
        """,
        bare_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"


def test_a_world_without_a_master_address_says_how_to_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="MASTER_ADDR.*torchrun"):
        air.init()


@pytest.mark.slow
def test_two_ranks_under_torchrun_and_the_supervisor(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            import air_sdk.runtime as air

            ctx = air.init(timeout_s=60)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
            for step in range(3):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                air.log(step=step, loss=loss.detach())
            total = torch.tensor([float(ctx.rank)])
            dist.all_reduce(total)
            print(f"world {ctx.world_size} sum {total.item()}")
            del model
            air.shutdown()
            """
        )
    )
    gateway = FakeGateway()
    try:
        env = bare_env(
            AIR_JOB_ID="job-1",
            AIR_ATTEMPT="0",
            AIR_GATEWAY_URL=gateway.base_url,
            AIR_JOB_TOKEN="tok",
            AIR_ATTEMPT_DIR=str(tmp_path / "attempt"),
            GLOO_SOCKET_IFNAME="lo",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        )
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "-m", "air_sdk.runtime.supervise", "train.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        for rank in (0, 1):
            assert f"[rank {rank}] world 2 sum 1.0" in done.stdout.splitlines()
            exit_file = tmp_path / f"attempt/exits/rank-{rank}.json"
            assert json.loads(exit_file.read_text())["exit_code"] == 0
        reports = [WorkerReport.model_validate(body) for body in gateway.reports]
        for rank in (0, 1):
            steps = [p.step for r in reports if r.rank == rank for p in r.points]
            assert steps == [0, 1, 2]
            assert any(r.exit is not None and r.exit.ok for r in reports if r.rank == rank)
    finally:
        gateway.close()
