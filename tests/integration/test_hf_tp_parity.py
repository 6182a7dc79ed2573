"""D2: an attention with Hugging Face projection names (q_proj/k_proj/v_proj/o_proj) that
keeps its head counts in torchtitan's `n_heads`/`n_kv_heads` and views its projections
as `(batch, -1, n_heads, head_dim)` trains, under TP(2) on 2 real gloo ranks, the losses
of one process. Before the fix only the detected scheme's attributes (`num_heads`,
`num_key_value_heads`) were divided: each rank viewed its local q of 2 heads as 4 heads
of half the sequence (measured here: the run then failed in o_proj, "a and b must have
same reduction dim"; with other shapes such a view trains a different model silently).

Tolerance: fp32; TP's row-wise all-reduce sums each projection's two halves in another
order than one matmul does, a few float32 ulps at a loss near 5; `atol=2e-5` leaves
room for other CPUs' math libraries and is far below what a wrong head split does.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from airtest import torchrun_ranks

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ATOL = 2e-5

MODEL = """
import torch
from air_sdk.examples.llama import HFAttention, LlamaConfig, _attend, _rotate, build_llama


class NHeadsAttention(HFAttention):
    def forward(self, hidden_states, rope):
        b = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(b, -1, self.n_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(b, -1, self.n_kv_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(b, -1, self.n_kv_heads, self.head_dim)
        out = _attend(_rotate(q, rope), _rotate(k, rope), v, self.n_heads, self.n_kv_heads)
        return self.o_proj(out)


def build():
    config = LlamaConfig(naming="hf", n_heads=4, n_kv_heads=2)
    model = build_llama(config)
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.__class__ = NHeadsAttention
        attention.n_heads, attention.n_kv_heads = attention.num_heads, attention.num_key_value_heads
        del attention.num_heads, attention.num_key_value_heads
    return config, model
"""

TRAIN = """
import json, sys
import torch
import air_sdk.runtime as air
from air_sdk.examples.llama import loss_fn, synthetic_batch
from nheads import build

ctx = air.init(timeout_s=120)
torch.set_num_threads(1)
config, model = build()
model = air.parallelize(model)
tokens, targets = synthetic_batch(config, batch_size=4, seq_len=16, step=0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(4):
    loss = loss_fn(model(tokens), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
if ctx.rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(losses, f)
air.shutdown()
"""


def reference(tmp_path: Path) -> list[float]:
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        from nheads import build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    from air_sdk.examples.llama import loss_fn, synthetic_batch

    config, model = build()
    tokens, targets = synthetic_batch(config, batch_size=4, seq_len=16, step=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(4):
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_an_hf_named_attention_keeping_n_heads_trains_the_one_rank_losses_under_tp2(
    tmp_path: Path,
) -> None:
    (tmp_path / "nheads.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    out = tmp_path / "losses.json"
    torchrun_ranks(2, tmp_path / "train.py", str(out), AIR_PARALLELISM=json.dumps({"tp": 2}))
    got = json.loads(out.read_text())
    want = reference(tmp_path)
    assert got == pytest.approx(want, abs=ATOL)
    assert want[-1] < want[0] - 0.1  # it trains, not just agrees
