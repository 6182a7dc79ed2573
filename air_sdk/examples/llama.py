"""A tiny Llama-style language model in two naming schemes, for tests, benchmarks and notebooks.

The same architecture (RMSNorm, rotary positions, causal SDPA attention with optional
grouped-query heads, SwiGLU MLP) under either module naming:

- `naming="titan"` (torchtitan's): `tok_embeddings`, `layers.N.attention.wq/wk/wv/wo`,
  `layers.N.feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`, `norm`, `output`;
  the attention keeps its head counts in `n_heads` / `n_kv_heads`.
- `naming="hf"` (Hugging Face Llama's): `model.embed_tokens`,
  `model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj`,
  `model.layers.N.mlp.gate_proj/up_proj/down_proj`, `input_layernorm`,
  `post_attention_layernorm`, `model.norm`, `lm_head`; head counts in `num_heads` /
  `num_key_value_heads`.

Weights come from `LlamaConfig.seed`, each drawn whole from its own generator, so both
schemes start from the same numbers and give the same losses, and a model built on the
meta device (`with torch.device("meta"):`) gets the same weights from `init_weights()`
in every parallel layout. Rotary tables are one non-persistent buffer on the
module that holds the embeddings; each attention slices it to its own sequence length,
so the model stays correct when tensor parallelism shards the sequence between blocks
and when a pipeline stage holds only some blocks (a stage's input is then the hidden
state, and a dropped embedding is an `nn.Identity`).

Example:
    >>> from air_sdk.examples.llama import LlamaConfig, build_llama, synthetic_batch
    >>> config = LlamaConfig(naming="hf", n_layers=2)
    >>> model = build_llama(config)
    >>> tokens, targets = synthetic_batch(config, batch_size=2, seq_len=8, step=0)
    >>> model(tokens).shape
    torch.Size([2, 8, 256])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "HFLlamaForCausalLM",
    "LlamaConfig",
    "TitanLlama",
    "build_llama",
    "loss_fn",
    "synthetic_batch",
]

Naming = Literal["hf", "titan"]


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Sizes of the tiny Llama; the defaults make a model of about 150k parameters.

    Example:
        >>> LlamaConfig(n_heads=4, n_kv_heads=2).kv_heads
        2
    """

    naming: Naming = "titan"
    """Module names: "titan" (torchtitan's) or "hf" (Hugging Face Llama's)."""
    vocab_size: int = 256
    """Tokens in the vocabulary (a multiple of the tensor-parallel size shards evenly)."""
    dim: int = 64
    """Width of the residual stream."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Query heads; `dim` must be a multiple."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None: as many as `n_heads`."""
    hidden_dim: int = 128
    """Width of the SwiGLU MLP."""
    max_seq_len: int = 256
    """Longest sequence the rotary table covers."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Rotary base."""
    seed: int = 0
    """Seed of the initial weights."""

    def __post_init__(self) -> None:
        if self.naming not in ("hf", "titan"):
            raise ValueError(f"naming={self.naming!r}: use 'hf' or 'titan'")
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}"
            )
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim={self.dim // self.n_heads} must be even for rotary")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (written out, so DTensor needs no fused op)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_table(config: LlamaConfig) -> torch.Tensor:
    """(max_seq_len, head_dim) of [cos | sin] for every position."""
    half = config.head_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def _rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    # x: (batch, seq, heads, head_dim); rope: (>= seq, head_dim)
    seq, half = x.shape[1], x.shape[-1] // 2
    cos = rope[:seq, :half].view(1, seq, 1, half).to(x.dtype)
    sin = rope[:seq, half:].view(1, seq, 1, half).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int, n_kv_heads: int
) -> torch.Tensor:
    # q: (b, s, n_heads, hd), k/v: (b, s, n_kv_heads, hd) -> (b, s, n_heads * hd)
    if n_kv_heads != n_heads:
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=2)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2).flatten(2)


class TitanAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.n_heads,
            config.kv_heads,
            config.head_dim,
        )
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        # The head counts are attributes (divided by tp under tensor parallelism), as in
        # torchtitan, so a wrong count fails here loudly instead of mixing heads.
        b, s, _ = x.shape
        q = _rotate(self.wq(x).view(b, s, self.n_heads, self.head_dim), rope)
        k = _rotate(self.wk(x).view(b, s, self.n_kv_heads, self.head_dim), rope)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        return self.wo(_attend(q, k, v, self.n_heads, self.n_kv_heads))


class HFAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = (
            config.n_heads,
            config.kv_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, hidden_states: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(b, s, self.num_key_value_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(b, s, self.num_key_value_heads, self.head_dim)
        out = _attend(
            _rotate(q, rope), _rotate(k, rope), v, self.num_heads, self.num_key_value_heads
        )
        return self.o_proj(out)


class TitanFeedForward(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class HFMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TitanBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = TitanAttention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = TitanFeedForward(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class HFDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = HFAttention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = HFMLP(config)

    def forward(self, hidden_states: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), rope)
        return h + self.mlp(self.post_attention_layernorm(h))


class TitanLlama(nn.Module):
    """The tiny Llama with torchtitan's module names. Prefer `build_llama(config)`.

    Example:
        >>> model = TitanLlama(LlamaConfig(n_layers=1))
        >>> sorted(n for n, _ in model.named_children())
        ['layers', 'norm', 'output', 'tok_embeddings']
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TitanBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope", rope_table(config), persistent=False)
        if not self.output.weight.is_meta:
            self.init_weights()

    def init_weights(self) -> None:
        """Set every weight from `config.seed` (torchtitan's convention; `air.parallelize`
        calls it on a meta-built model after sharding)."""
        _init_weights(self, self.config, self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope)
        return self.output(self.norm(h))


class HFLlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(HFDecoderLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.register_buffer("rope", rope_table(config), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, self.rope)
        return self.norm(h)


class HFLlamaForCausalLM(nn.Module):
    """The tiny Llama with Hugging Face's module names. Prefer `build_llama(config)`.

    Example:
        >>> model = HFLlamaForCausalLM(LlamaConfig(naming="hf", n_layers=1))
        >>> sorted(n for n, _ in model.named_children())
        ['lm_head', 'model']
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = HFLlamaModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if not self.lm_head.weight.is_meta:
            self.init_weights()

    def init_weights(self) -> None:
        """Set every weight from `config.seed` (see `TitanLlama.init_weights`)."""
        _init_weights(self, self.config, self.model)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def _weight(module: nn.Module | None, *path: str) -> torch.Tensor | None:
    # through wrappers (checkpointing, compile) and the nn.Identity of a pipeline stage
    for name in path:
        module = getattr(module, name, None)
    return module if isinstance(module, torch.Tensor) else None


_TITAN_SLOTS = (
    ("attention_norm",),
    ("attention", "wq"),
    ("attention", "wk"),
    ("attention", "wv"),
    ("attention", "wo"),
    ("ffn_norm",),
    ("feed_forward", "w1"),
    ("feed_forward", "w3"),
    ("feed_forward", "w2"),
)
_HF_SLOTS = (
    ("input_layernorm",),
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("post_attention_layernorm",),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)


def _canonical_weights(model: nn.Module, n_layers: int) -> list[tuple[int, torch.Tensor]]:
    """(index, weight) in one numbering shared by both namings (so one seed, one model);
    a pipeline stage yields only the weights it holds, under the whole model's indices."""
    trunk: nn.Module
    if isinstance(model, TitanLlama):
        trunk = model
        slots, embed = _TITAN_SLOTS, "tok_embeddings"
        head = _weight(model, "output", "weight")
    else:
        trunk = model.get_submodule("model")
        slots, embed = _HF_SLOTS, "embed_tokens"
        head = _weight(model, "lm_head", "weight")
    found: list[tuple[int, torch.Tensor | None]] = [
        (0, _weight(trunk, embed, "weight")),
        (1 + 9 * n_layers, _weight(trunk, "norm", "weight")),
        (2 + 9 * n_layers, head),
    ]
    blocks = trunk.get_submodule("layers")
    for name, block in blocks.named_children():  # a stage keeps the blocks' names
        for j, slot in enumerate(slots):
            found.append((1 + 9 * int(name) + j, _weight(block, *slot, "weight")))
    return [(index, weight) for index, weight in found if weight is not None]


@torch.no_grad()
def _init_weights(model: nn.Module, config: LlamaConfig, rope_holder: nn.Module) -> None:
    """Every weight drawn whole from its own seeded generator (norm scales: ones), and the
    rotary table recomputed: the same numbers eagerly, on meta after `to_empty`, and in
    every layout (a DTensor keeps its part of the whole tensor)."""
    from air_sdk.runtime.parallel.materialize import fill_from_full

    for index, weight in _canonical_weights(model, config.n_layers):
        if weight.dim() == 1:
            full = torch.ones(weight.shape)
        else:
            gen = torch.Generator().manual_seed(config.seed * 1_000_003 + index)
            full = torch.randn(weight.shape, generator=gen) * 0.02
        fill_from_full(weight, full)
    rope = getattr(rope_holder, "rope", None)
    if isinstance(rope, torch.Tensor):
        rope.copy_(rope_table(config))


def build_llama(config: LlamaConfig) -> nn.Module:
    """The tiny Llama in `config.naming`'s module names, weights from `config.seed`.

    Example:
        >>> build_llama(LlamaConfig(naming="titan", n_layers=1)).__class__.__name__
        'TitanLlama'
    """
    return HFLlamaForCausalLM(config) if config.naming == "hf" else TitanLlama(config)


def synthetic_batch(
    config: LlamaConfig, *, batch_size: int, seq_len: int, step: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next-token targets) of shape (batch_size, seq_len) for `step`, the same
    on every call: each row follows one fixed permutation of the vocabulary
    (`t -> 5 t + 1 mod vocab_size`) from a random start, so a model learns it in tens
    of steps. Ranks take their rows of the same global batch.

    Example:
        >>> tokens, targets = synthetic_batch(LlamaConfig(), batch_size=1, seq_len=4, step=0)
        >>> bool((tokens[0, 1:] == targets[0, :-1]).all())
        True
    """
    if seq_len > config.max_seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds max_seq_len={config.max_seq_len}")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    seq = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, config.vocab_size, (batch_size,), generator=gen)
    for i in range(seq_len):
        seq[:, i + 1] = (5 * seq[:, i] + 1) % config.vocab_size
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position (in fp32).

    Example:
        >>> float(loss_fn(torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long)))
        1.3862943649291992
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
