"""Sharded checkpoints through a real gateway, 2 nodes x 2 ranks (gloo): an FSDP(4) job
with a rank SIGKILLed resumes through the runner's recovery and ends exactly where an
uninterrupted one does; a second job with another `parallelism` (TP(2) x FSDP(2)) and
the first job's checkpoint directory resumes it with the same losses (to fp32 rounding:
see tests/unit/runtime/test_checkpoint_layouts.py for the tolerance)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from airtest import no_processes_left, stop_gateway_and_its_jobs

from air_sdk.client import Client, Job
from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import CheckpointSpec, JobSpec, JobState, Parallelism, Resources

pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-5, 1e-6
TOTAL = 10

TRAIN = """
import json, os, signal, sys
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
import air_sdk.runtime as air

total, every, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
die_at, resume = int(sys.argv[4]), int(sys.argv[5])  # 0: no death; 0: the newest checkpoint
ctx = air.init()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.w2(torch.tanh(self.w1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(6, 16), nn.Linear(16, 3)
        self.layers = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


layout = json.loads(os.environ["AIR_PARALLELISM"])  # the job's resolved parallelism
dp, tp = layout["dp_shard"], layout["tp"]
mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp_shard", "tp"))
torch.manual_seed(0)
model = Net()
if tp > 1:
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
for block in model.layers:
    fully_shard(block, mesh=mesh["dp_shard"])
fully_shard(model, mesh=mesh["dp_shard"])
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
state = {"model": model, "optim": optim}
step = (air.checkpoint.load(state, step=resume) if resume else air.checkpoint.load(state)) or 0
fresh = step == 0
per = 8 // dp
lo = per * mesh["dp_shard"].get_local_rank()
while step < total:
    step += 1
    if fresh and ctx.rank == 1 and step == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(8, 6, generator=g)[lo : lo + per], torch.randn(8, 3, generator=g)[lo : lo + per]
    optim.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optim.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean, group=mesh["dp_shard"].get_group())
    air.log(step=step, loss=mean.item() / dp)
    if every and step % every == 0:
        air.checkpoint.save(state, step=step)
air.checkpoint.wait()
full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # every rank takes part
if air.is_main():
    torch.save(full, out)
del model, optim, state
air.shutdown()
"""


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """2 virtual nodes of 2 slots: a 2 x 2 job fills them."""
    home = tmp_path_factory.mktemp("air-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=2,
        slots_per_node=2,
        write_client_config=False,
        sandbox_binds=(tmp_path_factory.getbasetemp(),),  # the jobs write tmp_path
    )
    gw = start_detached(opts)
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


@pytest.fixture(scope="module")
def gateway(gateway_process: GatewayProcess) -> Client:
    return Client(gateway_process.url, gateway_process.token)


def submit(
    gateway: Client,
    src: Path,
    out: Path,
    parallelism: Parallelism,
    ckpt: Path,
    *,
    every: int = 2,
    die_at: int = 0,
    resume: int = 0,
    max_restarts: int = 0,
) -> Job:
    return gateway.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(TOTAL), str(every), str(out), str(die_at), str(resume)],
            resources=Resources(nodes=2, procs_per_node=2),
            parallelism=parallelism,
            checkpoint=CheckpointSpec(dir=str(ckpt)),
            max_restarts=max_restarts,
            failure={"backoff_base_s": 0.2, "backoff_max_s": 0.5},
        ),
        workdir=src,
    )


def losses(job: Job) -> dict[int, float]:
    """Rank 0's logged loss per step, from the attempt that trained it last."""
    rows = sorted(job.metrics(name="loss", rank=0), key=lambda r: (r.step, r.attempt))
    return {r.step: r.values["loss"] for r in rows}


@pytest.fixture(scope="module")
def straight(gateway: Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted FSDP(4) run: its losses, final parameters, checkpoint directory."""
    root = tmp_path_factory.mktemp("straight")
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text(TRAIN)
    job = submit(gateway, root / "src", root / "final.pt", Parallelism(dp_shard=4), root / "ckpt")
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    return {
        "losses": losses(job),
        "params": torch.load(root / "final.pt", weights_only=True),
        "ckpt": root / "ckpt",
        "src": root / "src",
    }


def test_a_killed_rank_of_an_fsdp_job_resumes_to_the_uninterrupted_result(
    gateway: Client, straight: dict[str, object], tmp_path: Path
) -> None:
    job = submit(
        gateway,
        straight["src"],  # type: ignore[arg-type]
        tmp_path / "final.pt",
        Parallelism(dp_shard=4),
        tmp_path / "ckpt",
        die_at=7,  # rank 1 SIGKILLs itself as step 7 starts, after step 6's save began
        max_restarts=1,
    )
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    attempts = job.attempts()
    assert len(attempts) == 2 and attempts[1].resumed_from_step in (4, 6)
    assert losses(job) == straight["losses"]  # every step, the resumed ones included
    expected = straight["params"]
    got = torch.load(tmp_path / "final.pt", weights_only=True)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)  # type: ignore[attr-defined]
    assert no_processes_left(job.id)


def test_a_job_with_another_layout_resumes_the_first_ones_checkpoint(
    gateway: Client, straight: dict[str, object], tmp_path: Path
) -> None:
    job = submit(
        gateway,
        straight["src"],  # type: ignore[arg-type]
        tmp_path / "final.pt",
        Parallelism(tp=2),  # dp_shard=-1: 2
        straight["ckpt"],  # type: ignore[arg-type]
        every=0,  # leave the first job's checkpoints as they are
        resume=6,  # retention kept 6, 8 and 10
    )
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, [x.text for x in job.logs()][-40:]
    assert job.attempts()[0].resumed_from_step == 6
    want: dict[int, float] = straight["losses"]  # type: ignore[assignment]
    got = losses(job)
    assert sorted(got) == list(range(7, TOTAL + 1))
    assert all(abs(v - want[k]) <= ATOL + RTOL * abs(want[k]) for k, v in got.items()), got
    logs = [line.text for line in job.logs(rank=0)]
    assert any(
        "saved under dp_shard=4 (4 ranks), resharded to dp_shard=2 x tp=2 (4 ranks)" in t
        for t in logs
    ), logs[-20:]
    expected = straight["params"]
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final.keys() == expected.keys()  # type: ignore[attr-defined]
    for k, v in final.items():
        assert torch.allclose(v, expected[k], rtol=RTOL, atol=ATOL), k  # type: ignore[index]
    assert no_processes_left(job.id)
