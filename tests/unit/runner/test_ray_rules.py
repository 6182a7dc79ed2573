"""The Ray backend's rules, without Ray: which nodes AIR places on, where checkpoints go
(and which paths a multi-node job may not use) and the token the gateway sends. The env
contract each rank gets is the NodeRunner's plan: tests/unit/runner/test_node_plan.py."""

from __future__ import annotations

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.ray_rules import auth_env, checkpoint_dir, ray_nodes


def row(node_id: str, cpus: float, gpus: float = 0, alive: bool = True, **extra) -> dict:
    resources = {"CPU": cpus, "memory": 1e9}
    if gpus:
        resources["GPU"] = gpus
    return {
        "NodeID": node_id * 56,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.7",
        "Resources": resources,
        "Labels": {"ray.io/node-id": node_id * 56, **extra},
    }


def test_the_inventory_is_every_alive_node_that_can_run_a_rank():
    nodes = ray_nodes([row("a", 0), row("b", 4), row("c", 2, alive=False), row("d", 8, 2)])
    assert [(n.spec.name, n.spec.slots, n.spec.gpus) for n in nodes] == [
        ("ray-bbbbbbbbbbbb", 4, ()),
        ("ray-dddddddddddd", 8, (0, 1)),
    ]
    assert nodes[1].spec.accelerator == "gpu" and nodes[0].spec.accelerator == "cpu"
    assert nodes[0].address == "10.0.0.7"
    assert "ray.io/node-id" not in nodes[0].spec.labels


def test_a_node_label_names_its_pool():
    (node,) = ray_nodes([row("e", 4, **{"air-pool": "big"})])
    assert node.spec.pool == "big"


def test_checkpoints_default_to_the_shared_storage():
    assert (
        checkpoint_dir(job_id="j1", explicit=None, default="/gw", num_nodes=2, storage="/mnt/s")
        == "/mnt/s/jobs/j1/checkpoints"
    )
    assert (
        checkpoint_dir(job_id="j1", explicit=None, default="/gw", num_nodes=2, storage="gs://b/x/")
        == "gs://b/x/jobs/j1/checkpoints"
    )


@pytest.mark.parametrize("explicit", ["s3://bucket/run", "/mnt/s/team/run"])
def test_a_multi_node_job_may_checkpoint_where_every_node_can_read(explicit):
    got = checkpoint_dir(
        job_id="j", explicit=explicit, default="/gw", num_nodes=2, storage="/mnt/s"
    )
    assert got == explicit


@pytest.mark.parametrize("explicit", ["/tmp/run", "file:///tmp/run", "memory://run", "/mnt/s2/x"])
def test_a_node_local_path_is_refused_for_a_multi_node_job(explicit):
    with pytest.raises(ConfigError, match="path on one machine.*s3://"):
        checkpoint_dir(job_id="j", explicit=explicit, default="/gw", num_nodes=2, storage="/mnt/s")


def test_without_shared_storage_a_multi_node_job_must_name_one():
    with pytest.raises(ConfigError, match="AIR_RAY_STORAGE"):
        checkpoint_dir(job_id="j", explicit=None, default="/gw", num_nodes=2, storage=None)
    # one node: its own disk is fine (the gateway's default)
    assert checkpoint_dir(job_id="j", explicit=None, default="/gw", num_nodes=1, storage=None) == (
        "/gw"
    )


def test_token_auth_is_turned_on_when_a_token_is_there(tmp_path):
    assert auth_env({"RAY_AUTH_TOKEN": "t"}) == (
        {"RAY_AUTH_MODE": "token"},
        "token from RAY_AUTH_TOKEN",
    )
    token = tmp_path / "tok"
    token.write_text("t")
    assert auth_env({"RAY_AUTH_TOKEN_PATH": str(token)})[0] == {"RAY_AUTH_MODE": "token"}
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    assert auth_env({}, home=tmp_path)[0] == {"RAY_AUTH_MODE": "token"}


def test_an_explicit_auth_mode_is_never_overridden(tmp_path):
    assert auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"})[0] == {}
    assert auth_env({}, home=tmp_path) == (
        {},
        "no Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)",
    )
