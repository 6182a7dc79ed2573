"""The planner's per-GPU bytes for weights, gradients and AdamW state equal what a real
4-rank gloo job holds locally under each layout (DDP, FSDP, HSDP, TP x FSDP, PP x FSDP):
first with torch's FSDP2 / tensor-parallel APIs directly, then through
`air_sdk.runtime.parallel` where this version of AIR has it."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import shardbytes  # noqa: E402  (imports torch)

from air_sdk.planner import Cluster, TrainSetup, device_spec, estimate  # noqa: E402
from air_sdk.schema import Parallelism  # noqa: E402

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measured(tmp_path: Path, use_air: bool) -> dict[str, list[dict[str, int]]]:
    mp.start_processes(
        shardbytes.run,
        args=(_free_port(), str(tmp_path), use_air),
        nprocs=shardbytes.WORLD,
        join=True,
        start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(shardbytes.WORLD)]
    return {name: [rank[name] for rank in ranks] for name in ranks[0]}


def _check(measured: dict[str, list[dict[str, int]]]) -> None:
    cluster = Cluster(device_spec("h100"), nodes=1, gpus_per_node=shardbytes.WORLD)
    setup = TrainSetup(seq_len=shardbytes.SEQ, micro_batch=2, precision="fp32")
    for name, ranks in measured.items():
        layout = Parallelism(**shardbytes.LAYOUTS[name]).resolve(shardbytes.WORLD)
        planned = estimate(shardbytes.SHAPE, layout, cluster, setup).memory
        # the busiest pipeline stage is what the planner sizes; FSDP shards evenly on
        # average (its last shard may be short)
        stages: dict[int, list[dict[str, int]]] = {}
        for rank in ranks:
            stages.setdefault(rank["stage"], []).append(rank)
        busiest = max(stages.values(), key=lambda rs: sum(r["params"] for r in rs))
        for part, plan_bytes in (
            ("params", planned.weights),
            ("grads", planned.grads),
            ("optimizer", planned.optimizer),
        ):
            mean = sum(r[part] for r in busiest) / len(busiest)
            assert mean == pytest.approx(plan_bytes, rel=1e-9), (name, part)


def test_planned_state_bytes_equal_torchs_local_shards(tmp_path):
    measured = _measured(tmp_path, use_air=False)
    assert set(measured) == set(shardbytes.LAYOUTS)
    _check(measured)


@pytest.mark.skipif(
    importlib.util.find_spec("air_sdk.runtime.parallel") is None,
    reason="air_sdk.runtime.parallel is not in this version of AIR",
)
def test_planned_state_bytes_equal_air_parallelize_shards(tmp_path):
    measured = _measured(tmp_path, use_air=True)
    assert "TP2 × FSDP2" in measured and "HSDP 2x2" in measured
    _check(measured)
