"""Real AIR jobs on 2 nodes x 2 ranks (gloo) under FSDP, HSDP, TP x FSDP, PP x FSDP and
PP x TP: the losses they log match a 1-rank reference computed here, step by step, for
the tiny Llama in both naming schemes (one job per layout trains both)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Parallelism, Resources

torch = pytest.importorskip("torch")

from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch  # noqa: E402

pytestmark = pytest.mark.slow

STEPS, BATCH, SEQ, LR = 5, 8, 16, 0.1

# Every rank takes its rows of one fixed global batch (the model memorizes it, so the
# loss falls visibly) and plain SGD: unlike Adam, SGD keeps a wrongly scaled gradient
# (a sum instead of a mean over ranks, a missing TP reduction) visible in the loss.
TRAIN = f"""
import sys
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict
import air_sdk.runtime as air
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn, synthetic_batch

schedule = sys.argv[1]
ctx = air.init()
torch.set_num_threads(1)
layout = air.parallel.layout_of(air.mesh())
dp = air.submesh("dp")
rows = slice(dp.get_local_rank() * {BATCH} // dp.size(), (dp.get_local_rank() + 1) * {BATCH} // dp.size())
for naming in ("hf", "titan"):
    config = LlamaConfig(naming=naming, n_kv_heads=2)
    tokens, targets = synthetic_batch(config, batch_size={BATCH}, seq_len={SEQ}, step=0)
    if layout.pp > 1:
        pipe = air.pipeline(build_llama(config), microbatches=2, loss_fn=loss_fn, schedule=schedule)
        params = list(pipe.parameters())
    else:
        model = air.parallelize(build_llama(config))
        params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr={LR})
    for step in range(1, {STEPS} + 1):
        if layout.pp > 1:
            loss = pipe.step(tokens[rows], targets[rows])
        else:
            loss = loss_fn(model(tokens[rows]), targets[rows])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        air.log(step=step, **{{"loss_" + naming: air.dp_mean(loss)}})
    # what a checkpoint saves: the plain model's names, this rank's stages' under PP
    parts = pipe.model_parts if layout.pp > 1 else [model]
    keys = set().union(*(get_state_dict(part, [])[0] for part in parts))
    whole = set(build_llama(config).state_dict())
    assert keys == whole if layout.pp == 1 else keys < whole, sorted(keys ^ whole)[:4]
    print(f"rank {{ctx.rank}} {{naming}}: state dict of {{len(keys)}} keys", flush=True)
print(f"rank {{ctx.rank}} done: {{layout.sizes()}}", flush=True)
air.shutdown()
"""

LAYOUTS = {
    "fsdp4": (Parallelism(dp_shard=4), "1F1B"),
    "hsdp2x2": (Parallelism(dp_replicate=2, dp_shard=2), "1F1B"),
    "tp2xfsdp2": (Parallelism(tp=2), "1F1B"),
    "pp2xfsdp2-1f1b": (Parallelism(pp=2), "1F1B"),
    "pp2xtp2-interleaved": (Parallelism(pp=2, tp=2), "Interleaved1F1B"),
}

# fp32 throughout; the jobs sum in another order than the reference (sharded gradient
# reductions over 2-4 ranks, TP's split matmuls, microbatch means), so the last bits
# differ: measured here, every layout's losses were within 4.8e-7 of the reference
# over the 5 steps (one float32 ulp at 5.5). 2e-5 leaves 40x room for other CPUs' math
# libraries; a real fault moves the loss by 1e-2 or more (a 2x gradient scale, as lr 0.2
# instead of 0.1, changes step 2's loss by 0.06).
TOLERANCE = 2e-5


def reference_losses(naming: str) -> list[float]:
    config = LlamaConfig(naming=naming, n_kv_heads=2)
    model = build_llama(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    tokens, targets = synthetic_batch(config, batch_size=BATCH, seq_len=SEQ, step=0)
    losses = []
    for _ in range(STEPS):
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def four_slot_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    home = tmp_path_factory.mktemp("parallel-home")
    opts = GatewayOptions(
        port=free_port(), home=home, num_nodes=2, slots_per_node=2, write_client_config=False
    )
    gw = start_detached(opts)
    yield Client(gw.url, gw.token)
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


@pytest.fixture(scope="module")
def references() -> dict[str, list[float]]:
    with torch.random.fork_rng():
        return {naming: reference_losses(naming) for naming in ("hf", "titan")}


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_a_parallel_layout_logs_the_reference_losses(
    four_slot_gateway, references, tmp_path, layout_name
):
    layout, schedule = LAYOUTS[layout_name]
    (tmp_path / "train.py").write_text(TRAIN)
    spec = JobSpec(
        name=layout_name,
        entrypoint="train.py",
        args=[schedule],
        resources=Resources(nodes=2, procs_per_node=2),
        parallelism=layout,
        env={"OMP_NUM_THREADS": "1"},
    )
    job = four_slot_gateway.submit(spec, workdir=tmp_path)
    record = job.wait(timeout=300)
    logs = "\n".join(line.text for line in job.logs())
    assert record.state is JobState.SUCCEEDED, (record.state_reason, logs[-3000:])
    sizes = layout.resolve(4).sizes()
    assert f"rank 0 done: {sizes}" in logs
    assert logs.count(": state dict of ") == 8  # 4 ranks x 2 namings
    for naming, expected in references.items():
        rows = job.metrics(name=f"loss_{naming}")
        assert {row.rank for row in rows} == {0, 1, 2, 3}
        for rank in range(4):  # every rank logs the same mean, pipeline stages included
            logged = [row.values[f"loss_{naming}"] for row in rows if row.rank == rank]
            assert logged == pytest.approx(expected, abs=TOLERANCE), (naming, rank)
    assert references["hf"][-1] < references["hf"][0] - 0.2  # it trains, not just agrees
