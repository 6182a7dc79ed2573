"""`air.mesh()`: the layout from AIR_PARALLELISM (or an argument, or plain dp), the named
dims and the flattened data-parallel meshes, built once per process."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.schema import Parallelism

torch = pytest.importorskip("torch")

import air_sdk.runtime as air  # noqa: E402
from air_sdk.runtime.parallel.meshes import layout_of, read_layout  # noqa: E402


def test_layout_comes_from_the_env_the_runner_sets(monkeypatch):
    monkeypatch.setenv("AIR_PARALLELISM", Parallelism(tp=2, pp=2).resolve(8).model_dump_json())
    assert read_layout(8).sizes() == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}


def test_without_the_env_every_rank_is_a_data_parallel_rank(monkeypatch):
    monkeypatch.delenv("AIR_PARALLELISM", raising=False)
    assert read_layout(4).sizes() == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}


def test_an_argument_wins_over_the_env(monkeypatch):
    monkeypatch.setenv("AIR_PARALLELISM", '{"tp": 2}')
    assert read_layout(4, Parallelism(pp=4)).pp == 4


def test_a_layout_that_does_not_fit_the_world_says_what_to_change(monkeypatch):
    monkeypatch.delenv("AIR_PARALLELISM", raising=False)
    with pytest.raises(ConfigError, match=r"= 4 ranks, but the job has 6 .*dp_shard=-1"):
        read_layout(6, Parallelism(dp_shard=2, tp=2))


def test_a_broken_env_value_is_named(monkeypatch):
    monkeypatch.setenv("AIR_PARALLELISM", '{"tp": 0}')
    with pytest.raises(ConfigError, match=r"AIR_PARALLELISM='\{\"tp\": 0\}' is not a layout"):
        read_layout(4)


def test_mesh_has_the_named_dims_and_the_flattened_dp_meshes(fake_world, monkeypatch):
    fake_world(16)
    layout = Parallelism(dp_replicate=2, tp=2, pp=2).resolve(16)
    monkeypatch.setenv("AIR_PARALLELISM", layout.model_dump_json())
    mesh = air.mesh()
    assert mesh.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert tuple(mesh.shape) == (2, 2, 2, 1, 2)
    assert mesh.device_type == "cpu"
    assert air.submesh("dp").size() == 4  # dp_replicate x dp_shard: how the batch splits
    assert air.submesh("dp_shard_cp").size() == 2  # what FSDP shards over
    assert air.submesh("dp_cp").size() == 4  # what the loss is averaged over
    assert air.submesh("tp").size() == 2 and air.submesh("pp").size() == 2
    # tensor-parallel peers are consecutive ranks (inside one node); rank 0's groups:
    assert air.submesh("tp").mesh.tolist() == [0, 1]
    assert air.submesh("dp").mesh.tolist() == [0, 2, 4, 6]
    assert air.submesh("pp").mesh.tolist() == [0, 8]
    assert layout_of(mesh) == layout


def test_mesh_is_built_once_per_process(fake_world):
    fake_world(4)
    first = air.mesh(Parallelism(tp=2))
    assert air.mesh() is first  # no argument: the mesh made earlier
    assert air.mesh(Parallelism(tp=2, dp_shard=2)) is first  # the same resolved layout
    other = air.mesh(Parallelism(pp=4))
    assert other is not first and air.mesh() is other


def test_unknown_dim_and_foreign_mesh_are_refused(fake_world):
    fake_world(4)
    air.mesh()
    with pytest.raises(ConfigError, match=r"no mesh dim 'fsdp': use one of pp, .*dp_cp"):
        air.submesh("fsdp")
    from torch.distributed.device_mesh import init_device_mesh

    foreign = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    with pytest.raises(ConfigError, match="was not made by air.mesh"):
        air.submesh("dp", foreign)


def test_dp_mean_averages_over_the_data_parallel_ranks(gloo_world):
    air.mesh()
    assert air.dp_mean(torch.tensor(2.5)) == 2.5
    assert air.dp_mean(1) == 1.0


def test_mesh_joins_the_group_itself_and_is_rebuilt_after_shutdown(tmp_path):
    import json
    import subprocess
    import sys
    import textwrap

    from test_runtime_dist import bare_env

    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import json
            import torch.distributed as dist
            import air_sdk.runtime as air

            first = air.mesh()  # no air.init(): mesh() joins a 1-process group itself
            seen = {"initialized": dist.is_initialized(), "dims": list(first.mesh_dim_names),
                    "same": air.mesh() is first}
            air.shutdown()  # the group goes, and the meshes made on it with it
            second = air.mesh()
            seen["rebuilt"] = second is not first and air.submesh("dp").size() == 1
            air.shutdown()
            print(json.dumps(seen))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=bare_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "initialized": True,
        "dims": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
        "same": True,
        "rebuilt": True,
    }
