"""`air.layout()`: the one runtime object that knows the data-parallel rank and size, the
pipeline stage and the throughput divisor, read from the env contract or the process
group; the loader and the throughput meter take theirs from it, and a loader split that
disagrees with it under TP/PP/CP is refused. (Real ranks: tests/integration/
test_layout_data.py.)"""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runtime._layout import Layout, layout
from air_sdk.runtime._throughput import meter_from_env
from air_sdk.schema import MESH_DIMS, Parallelism

LAYOUTS = [
    Parallelism(dp_shard=8),
    Parallelism(tp=2),
    Parallelism(tp=8),
    Parallelism(dp_replicate=2, dp_shard=2, tp=2),
    Parallelism(pp=2, tp=2),
    Parallelism(pp=2, cp=2),
    Parallelism(pp=2, dp_replicate=2, cp=2),
]


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("RANK", "WORLD_SIZE", "AIR_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("parallelism", LAYOUTS, ids=str)
def test_coordinates_are_the_meshs_and_one_replica_shares_its_data(parallelism):
    torch = pytest.importorskip("torch")
    resolved = parallelism.resolve(8)
    sizes = resolved.sizes()
    grid = torch.arange(8).reshape(tuple(sizes.values()))  # what init_device_mesh lays out
    parts: dict[int, set[tuple[int, int, int]]] = {}
    for rank in range(8):
        lay = Layout(resolved, rank=rank, world_size=8)
        where = [int(i) for i in (grid == rank).nonzero()[0]]
        assert lay.coordinates == dict(zip(MESH_DIMS, where, strict=True))
        assert lay.dp_size == sizes["dp_replicate"] * sizes["dp_shard"]
        assert lay.non_data_parallel == sizes["tp"] * sizes["pp"] * sizes["cp"]
        assert lay.pp_rank == where[0]
        c = lay.coordinates
        parts.setdefault(lay.dp_rank, set()).add((c["dp_replicate"], c["dp_shard"], 0))
        # every tp/cp/pp peer of this rank reads the same part of the data
        for dim in ("pp", "cp", "tp"):
            for index in range(sizes[dim]):
                peer = grid[tuple(index if d == dim else c[d] for d in MESH_DIMS)]
                assert Layout(resolved, rank=int(peer), world_size=8).dp_rank == lay.dp_rank
    assert sorted(parts) == list(range(sizes["dp_replicate"] * sizes["dp_shard"]))
    assert all(len(p) == 1 for p in parts.values())  # one replica coordinate per part


def test_the_layout_comes_from_the_env_contract(no_launcher):
    no_launcher.setenv("RANK", "5")
    no_launcher.setenv("WORLD_SIZE", "8")
    no_launcher.setenv("AIR_PARALLELISM", Parallelism(pp=2, tp=2).resolve(8).model_dump_json())
    lay = layout()
    assert (lay.rank, lay.world_size, lay.dp_rank, lay.dp_size, lay.pp_rank) == (5, 8, 0, 2, 1)
    assert layout() is lay  # built once while the contract holds
    no_launcher.setenv("RANK", "6")
    assert layout().dp_rank == 1


def test_without_a_launcher_it_is_one_data_parallel_rank(no_launcher):
    lay = layout()
    assert (lay.rank, lay.world_size, lay.dp_size, lay.non_data_parallel) == (0, 1, 1, 1)


def test_a_layout_that_does_not_fit_the_world_says_what_to_change(no_launcher):
    no_launcher.setenv("WORLD_SIZE", "6")
    no_launcher.setenv("AIR_PARALLELISM", '{"tp": 4}')
    with pytest.raises(ConfigError, match=r"does not divide the job's 6 ranks"):
        layout()
    with pytest.raises(ConfigError, match=r"resolve it for the world size first"):
        Layout(Parallelism(tp=2), rank=0, world_size=2)


def test_the_loader_splits_by_the_data_parallel_rank(no_launcher):
    pytest.importorskip("torch")
    import air_sdk.runtime as air

    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("AIR_PARALLELISM", Parallelism(tp=2).resolve(4).model_dump_json())
    ids = {}
    for rank in range(4):
        no_launcher.setenv("RANK", str(rank))
        loader = air.resumable_loader(list(range(8)), batch_size=2, shuffle=False)
        ids[rank] = [int(i) for batch in loader for i in batch]
    assert ids == {0: [0, 2, 4, 6], 1: [0, 2, 4, 6], 2: [1, 3, 5, 7], 3: [1, 3, 5, 7]}


@pytest.mark.parametrize("parallelism", [Parallelism(tp=2), Parallelism(pp=2), Parallelism(cp=2)])
def test_a_global_rank_split_under_tp_pp_or_cp_is_refused_with_the_fix(no_launcher, parallelism):
    pytest.importorskip("torch")
    import air_sdk.runtime as air

    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("AIR_PARALLELISM", parallelism.resolve(4).model_dump_json())
    with pytest.raises(
        ConfigError,
        match=r"given rank=1 of num_replicas=4, but under this layout .* reads part \d of 2"
        r".*drop rank= and num_replicas=",
    ):
        air.resumable_loader(list(range(8)), num_replicas=4, rank=1)
    # what the layout says is accepted as given
    lay = air.layout()
    loader = air.resumable_loader(
        list(range(8)), num_replicas=lay.dp_size, rank=lay.dp_rank, shuffle=False
    )
    assert [int(i) for batch in loader for i in batch] == list(range(lay.dp_rank, 8, 2))


def test_under_plain_data_parallelism_a_split_by_hand_stays_allowed(no_launcher):
    pytest.importorskip("torch")
    import air_sdk.runtime as air

    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")
    everything = air.resumable_loader(list(range(4)), num_replicas=1, rank=0, shuffle=False)
    assert [int(i) for batch in everything for i in batch] == [0, 1, 2, 3]


def test_the_throughput_divisor_is_the_layouts(no_launcher):
    env = {"RANK": "3", "WORLD_SIZE": "16", "AIR_PARALLELISM": '{"pp": 2, "tp": 2, "cp": 2}'}
    lay = Layout.from_env(env)
    meter = meter_from_env(env)
    assert (meter.data_parallel, meter.non_data_parallel) == (lay.dp_size, lay.non_data_parallel)
    assert (meter.data_parallel, meter.non_data_parallel) == (2, 8)
    no_launcher.setenv("WORLD_SIZE", "8")
    no_launcher.setenv("AIR_PARALLELISM", Parallelism(tp=4).resolve(8).model_dump_json())
    assert meter_from_env().data_parallel == layout().dp_size == 2  # the process's Layout


def test_a_mesh_made_with_a_layout_becomes_the_process_layout(fake_world):
    pytest.importorskip("torch")
    import air_sdk.runtime as air
    from air_sdk.runtime.parallel.meshes import layout_object

    fake_world(8)
    mesh = air.mesh(Parallelism(pp=2, tp=2))
    lay = air.layout()
    assert lay.parallelism == Parallelism(pp=2, tp=2).resolve(8) and lay.world_size == 8
    assert layout_object(mesh) == lay
    assert air.submesh("dp").size() == lay.dp_size == 2
    assert air.submesh("dp").get_local_rank() == lay.dp_rank == 0


def test_the_runtime_exports_the_layout():
    import air_sdk.runtime as air

    assert air.layout is layout and air.Layout is Layout
    assert "layout" in air.__all__ and air.__all__ == sorted(air.__all__)


def test_a_checkpoint_records_the_process_layout_pipeline_included(fake_world):
    pytest.importorskip("torch")
    import air_sdk.runtime as air
    from air_sdk.runtime.checkpoint._adapters import layout as checkpoint_layout

    fake_world(8)
    air.mesh(Parallelism(pp=2, tp=2))  # outside AIR: no AIR_PARALLELISM, no DTensor in state
    assert checkpoint_layout({}) == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
