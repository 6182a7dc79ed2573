"""`air.resumable_loader` splits the data by the layout's data-parallel rank, on 4 real
gloo ranks under every layout (FSDP, TP, TP x FSDP, HSDP, PP x TP, PP x FSDP, CP x
FSDP): the ranks of one replica (tp, cp and pp peers) read the same sample ids, the
replicas read disjoint parts that cover the dataset, each part is what torch's own
`DistributedSampler` gives that data-parallel rank, and a pipeline's first and last stage
(as `air.pipeline` builds them) read the same samples.

One torchrun of 4 ranks goes through the layouts: each sets `AIR_PARALLELISM` as the
runner does and drops the meshes of the one before (tests/parallel_worlds.py does the
same between tests), so the real env path builds every layout's Layout and mesh.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from airtest import torchrun_ranks

from air_sdk.schema import Parallelism

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

WORLD, SAMPLES, BATCH, SEED = 4, 16, 2, 3

LAYOUTS = {
    "fsdp": Parallelism(dp_shard=4),
    "tp": Parallelism(tp=4),
    "tp2xfsdp2": Parallelism(tp=2),
    "hsdp2x2": Parallelism(dp_replicate=2, dp_shard=2),
    "pp2xtp2": Parallelism(pp=2, tp=2),
    "pp2xfsdp2": Parallelism(pp=2),
    "cp2xfsdp2": Parallelism(cp=2),  # the mesh and the data split; the attention needs GPUs
}

SCRIPT = """
import json, os, sys
import torch
import air_sdk.runtime as air
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn
from air_sdk.runtime.parallel.meshes import _forget_meshes

ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
for name, layout_json in json.loads(sys.argv[1]).items():
    _forget_meshes()
    os.environ["AIR_PARALLELISM"] = layout_json
    layout = air.layout()
    mesh = air.mesh()
    loader = air.resumable_loader(list(range(SAMPLES)), batch_size=BATCH, seed=SEED)
    ids = [int(i) for batch in loader for i in batch]
    dp = air.submesh("dp")
    row = {
        "layout": name,
        "rank": ctx.rank,
        "ids": ids,
        "dp_rank": layout.dp_rank,
        "dp_size": layout.dp_size,
        "mesh_dp": [dp.get_local_rank(), dp.size()],
        "coords": layout.coordinates,
        "mesh_coords": {d: mesh[d].get_local_rank() for d in mesh.mesh_dim_names},
        "pp_rank": layout.pp_rank,
    }
    if layout.pp_size > 1:
        config = LlamaConfig(n_layers=2, n_kv_heads=2)
        pipe = air.pipeline(build_llama(config), microbatches=2, loss_fn=loss_fn)
        row["first"], row["last"] = pipe.is_first, pipe.is_last
    with open(os.path.join(sys.argv[2], f"{name}-{ctx.rank}.json"), "w") as f:
        json.dump(row, f)  # a file per rank: their stdout lines interleave
air.shutdown()
"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("layout-data")
    script = root / "loader.py"
    code = textwrap.dedent(SCRIPT)
    for name, value in (("SAMPLES", SAMPLES), ("BATCH", BATCH), ("SEED", SEED)):
        code = code.replace(name, str(value))
    script.write_text(code)
    layouts = json.dumps({n: p.resolve(WORLD).model_dump_json() for n, p in LAYOUTS.items()})
    torchrun_ranks(WORLD, script, layouts, str(root), timeout_s=480)
    return {
        name: [json.loads((root / f"{name}-{rank}.json").read_text()) for rank in range(WORLD)]
        for name in LAYOUTS
    }


def expected_dp_rank(layout: Parallelism, rank: int) -> tuple[int, int]:
    """(data-parallel rank, size) read off the mesh torch builds: ranks laid out as
    `arange(world).reshape(pp, dp_replicate, dp_shard, cp, tp)`."""
    sizes = layout.resolve(WORLD).sizes()
    grid = torch.arange(WORLD).reshape(tuple(sizes.values()))
    pp, rep, shard, cp, tp = (int(i) for i in (grid == rank).nonzero()[0])
    return rep * sizes["dp_shard"] + shard, sizes["dp_replicate"] * sizes["dp_shard"]


def distributed_sampler_ids(dp_rank: int, dp_size: int) -> list[int]:
    sampler = torch.utils.data.DistributedSampler(
        range(SAMPLES), num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=SEED
    )
    sampler.set_epoch(0)
    return list(sampler)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_splits_the_data_by_its_data_parallel_rank(rows, name):
    layout = LAYOUTS[name]
    got = rows[name]
    assert [r["rank"] for r in got] == list(range(WORLD))
    by_part: dict[int, list[int]] = {}
    for row in got:
        dp_rank, dp_size = expected_dp_rank(layout, row["rank"])
        assert (row["dp_rank"], row["dp_size"]) == (dp_rank, dp_size), row
        assert row["mesh_dp"] == [dp_rank, dp_size]  # the Layout and the mesh agree
        assert row["coords"] == row["mesh_coords"]
        assert row["ids"] == distributed_sampler_ids(dp_rank, dp_size), row
        # the tp, cp and pp ranks of one replica read exactly the same samples
        assert by_part.setdefault(dp_rank, row["ids"]) == row["ids"], (row, by_part)
    covered = sorted(i for ids in by_part.values() for i in ids)
    assert covered == list(range(SAMPLES))  # the replicas split the data, none repeats


@pytest.mark.parametrize("name", ["pp2xtp2", "pp2xfsdp2"])
def test_a_pipelines_first_and_last_stage_read_the_same_samples(rows, name):
    got = rows[name]
    assert all(r["pp_rank"] == r["coords"]["pp"] for r in got)
    for dp_rank in {r["dp_rank"] for r in got}:
        replica = [r for r in got if r["dp_rank"] == dp_rank]
        first = [r for r in replica if r["first"]]
        last = [r for r in replica if r["last"]]
        assert first and last and all(not (r["first"] and r["last"]) for r in replica)
        assert {tuple(r["ids"]) for r in first + last} == {tuple(first[0]["ids"])}
