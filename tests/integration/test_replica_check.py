"""Replicas that agree, on 4 real gloo ranks: a model whose ranks drew different weights
is refused on every rank after `air.parallelize` / `air.pipeline` where the layout keeps
copies (HSDP's dp_replicate, the norms tensor parallelism keeps whole, a pipeline's HSDP
stages), with the cause and the fix; seeded alike it passes, and plain FSDP (every rank a
different shard, no copies) is not a false alarm.

One torchrun goes through the cases (each sets `AIR_PARALLELISM` as the runner does and
drops the meshes of the one before); each rank writes its outcome to a file.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from airtest import torchrun_ranks

from air_sdk.schema import Parallelism

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

WORLD = 4

# name -> (layout, every rank seeds alike?)
CASES = {
    "hsdp-seeded": (Parallelism(dp_replicate=2, dp_shard=2), True),
    "hsdp-unseeded": (Parallelism(dp_replicate=2, dp_shard=2), False),
    "tp-seeded": (Parallelism(tp=2), True),
    "tp-unseeded": (Parallelism(tp=2), False),
    "pp-hsdp-unseeded": (Parallelism(pp=2, dp_replicate=2), False),
    "fsdp-unseeded": (Parallelism(dp_shard=4), False),
}

SCRIPT = """
import json, os, sys
import torch
import air_sdk.runtime as air
from air_sdk.errors import ConfigError
from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn
from air_sdk.runtime.parallel.meshes import _forget_meshes

ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
torch.manual_seed(100 + ctx.rank)  # what an unseeded rank draws: its own numbers
for name, (layout_json, seeded) in json.loads(sys.argv[1]).items():
    _forget_meshes()
    os.environ["AIR_PARALLELISM"] = layout_json
    config = LlamaConfig(n_layers=2, n_kv_heads=2, seed=0 if seeded else 100 + ctx.rank)
    model = build_llama(config)
    if not seeded:  # the Llama's norms start at ones: give them rank-drawn values too
        with torch.no_grad():
            for key, param in model.named_parameters():
                if "norm" in key:
                    param.add_(torch.randn(param.shape) * 0.1)
    try:
        if air.layout().pp_size > 1:
            air.pipeline(model, microbatches=2, loss_fn=loss_fn)
        else:
            air.parallelize(model)
        outcome = "passed"
    except ConfigError as exc:
        outcome = str(exc)
    with open(os.path.join(sys.argv[2], f"{name}-{ctx.rank}.json"), "w") as f:
        json.dump(outcome, f)
air.shutdown()
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("replicas")
    script = root / "check.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cases = json.dumps(
        {n: (p.resolve(WORLD).model_dump_json(), seeded) for n, (p, seeded) in CASES.items()}
    )
    torchrun_ranks(WORLD, script, cases, str(root), timeout_s=480)
    return {
        name: [json.loads((root / f"{name}-{rank}.json").read_text()) for rank in range(WORLD)]
        for name in CASES
    }


@pytest.mark.parametrize("name", ["hsdp-seeded", "tp-seeded", "fsdp-unseeded"])
def test_replicas_that_agree_pass(outcomes, name):
    assert outcomes[name] == ["passed"] * WORLD


@pytest.mark.parametrize(
    ("name", "dim", "param"),
    [
        ("hsdp-unseeded", r"dp_replicate \(global ranks \[[0-3], [0-3]\]\)", r"'[\w.]+'"),
        ("tp-unseeded", r"tp \(global ranks \[[0-3], [0-3]\]\)", r"'[\w.]*norm[\w.]*'"),
        ("pp-hsdp-unseeded", r"dp_replicate \(global ranks \[[0-3], [0-3]\]\)", r"'[\w.]+'"),
    ],
)
def test_replicas_that_differ_are_refused_on_every_rank_with_the_fix(outcomes, name, dim, param):
    import re

    got = outcomes[name]
    assert all(outcome != "passed" for outcome in got), got
    for outcome in got:  # every rank says the cause and the fix
        assert "unseeded initialization" in outcome
        assert "call torch.manual_seed(...) with the same seed before building" in outcome
        assert "or build it on the meta device" in outcome
    named = [o for o in got if o.startswith("the model's replicas differ: parameter")]
    assert named, got  # the ranks that compared a copy name it and the ranks holding it
    assert all(
        re.search(f"parameter {param} should be one copy on the ranks of {dim}", o) for o in named
    ), named
