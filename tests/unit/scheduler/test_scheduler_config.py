"""Cluster TOML: pools, nodes, labels, tenants and switches."""

from __future__ import annotations

import pytest

from air_sdk.scheduler import JobRequest, decide, load_cluster_config, parse_cluster_config

EXAMPLE = """
[[pools]]
name = "a100"
accelerator = "A100"
labels = { region = "eu-west" }
  [[pools.nodes]]
  name = "gpu-{i}"
  count = 3
  gpus = 8
  [[pools.nodes]]
  name = "gpu-odd"
  gpus = [0, 2]
  slots = 4
  healthy = false
  labels = { rack = "r9" }

[[pools]]
name = "cpu"
  [[pools.nodes]]
  name = "cpu-{i}"
  count = 2
  slots = 32

[tenants.vision]
gpus = 16
weight = 2

[tenants."*"]
gpus = 8
slots = 64

[scheduler]
backfill = false
preemptor_priorities = ["high", "normal"]
locality_label = "rack"
"""


def test_pools_nodes_and_labels():
    cfg = parse_cluster_config(EXAMPLE)
    names = [n.name for n in cfg.inventory]
    assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-odd", "cpu-0", "cpu-1"]
    g0 = cfg.inventory[0]
    assert (g0.pool, g0.accelerator, g0.num_gpus, g0.slots) == ("a100", "a100", 8, 8)
    assert g0.labels == {"region": "eu-west"}
    odd = cfg.inventory[3]
    assert (odd.gpus, odd.slots, odd.healthy) == ((0, 2), 4, False)
    assert odd.labels == {"region": "eu-west", "rack": "r9"}
    cpu = cfg.inventory[4]
    assert (cpu.pool, cpu.accelerator, cpu.num_gpus, cpu.slots) == ("cpu", "cpu", 0, 32)


def test_tenants_and_switches():
    pol = parse_cluster_config(EXAMPLE).policy
    assert pol.quota("vision").gpus == 16 and pol.weight("vision") == 2.0
    assert (pol.quota("anyone").gpus, pol.quota("anyone").slots) == (8, 64)
    assert pol.backfill is False
    assert pol.preemptor_priorities == frozenset({"high", "normal"})
    assert pol.locality_label == "rack"


def test_loaded_config_drives_decide(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(EXAMPLE)
    cfg = load_cluster_config(path)
    q = [JobRequest("j", 1, 8, 8, pool="any", accelerator="a100", tenant="vision")]
    d = decide(q, cfg.inventory, [], cfg.policy, now=0)
    assert d.placements[0].pool == "a100"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[pools]]\nname = 'p'\n[[pools.nodes]]\nname = 'n'\ncount = 2\n", "no '{i}'"),
        ("[[pools]]\nname = 'any'\n", "reserved"),
        ("[[pools]]\nname = 'p'\n[[pools.nodes]]\nname = 'n'\ngpus = -1\n", "gpus"),
        ("[[pools]]\nname = 'p'\n[[pools]]\nname = 'p'\n", "defined twice"),
        ("[tenants.t]\nweight = 0\n", "tenants.t.weight"),
        ("[scheduler]\nfair_share = 'lottery'\n", "scheduler.fair_share"),
        ("[[pools]]\nname = 'p'\nnode = []\n", "pools.0.node"),
        ("[[pools\n", "not valid TOML"),
        # names a job or `air admin node clear` could not give (issue 14)
        ('[[pools]]\nname = "gpu\\n"\n', "pool name 'gpu\\\\n'"),
        ('[[pools]]\nname = "gpu pool"\n', "pools.0.name"),
        ('[[pools]]\nname = "p"\naccelerator = "a100\\n"\n', "accelerator"),
        ('[[pools]]\nname = "p"\n[[pools.nodes]]\nname = "n\\t{i}"\n', "node name"),
    ],
)
def test_bad_config_names_the_field(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_cluster_config(text, source="cluster.toml")
    assert str(err.value).startswith("cluster.toml")


def test_the_documented_example_parses():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "scheduling.md").read_text()
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    cfg = parse_cluster_config(block, source="docs/scheduling.md")
    assert len(cfg.inventory) == 16 + 1 + 8
    assert cfg.policy.quota("vision").gpus == 64 and cfg.policy.quota("etl").slots == 256
    assert cfg.policy.quota("someone").gpus == 32
