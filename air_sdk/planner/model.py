"""Model shapes: presets, parameter counts, FLOPs per token and activation bytes.

A `ModelShape` is a decoder-only transformer described by its dimensions (Llama's
block: RMSNorm, grouped-query attention, SwiGLU; or GPT-2's: LayerNorm, biases,
GELU, learned positions, tied embeddings). `ModelShape.from_params(n)` stands for
a model known only by its parameter count: its states can be estimated, its
activations and tensor-parallel traffic cannot.

Activation bytes follow Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022): every tensor autograd keeps for the backward,
per token and layer, counted for the block as PyTorch runs it (SDPA's flash
kernel keeps q, k, v, its output and the log-sum-exp, never the s x s scores).

Example:
    >>> shape = preset("llama3-8b")
    >>> round(shape.num_params / 1e9, 2)
    8.03
    >>> preset("gpt2-124m").num_layers
    12
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

__all__ = ["PRESETS", "ModelShape", "preset"]

Arch = Literal["llama", "gpt2"]
_LSE_BYTES = 4  # SDPA's log-sum-exp is fp32, one per head and token


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's dimensions (all counts, no weights).

    Example:
        >>> tiny = ModelShape("tiny", "llama", 2, 64, 4, 2, 128, 256)
        >>> tiny.num_params
        139584
    """

    name: str
    arch: Arch
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    ffn_hidden_size: int
    #: learned position embeddings (GPT-2); 0 for RoPE models
    max_positions: int = 0
    tied_embeddings: bool = False
    #: the sequence length this model is usually trained at
    default_seq_len: int = 2048
    #: a model known only by its parameter count (no shape): `from_params`
    params_only: int | None = None

    def __post_init__(self) -> None:
        if self.params_only is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}"
            )
        if self.params_only is None and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @classmethod
    def from_params(cls, num_params: int, name: str | None = None) -> ModelShape:
        """A model known by its parameter count only.

        Example:
            >>> ModelShape.from_params(7_000_000_000).known
            False
        """
        return cls(
            name or f"{num_params / 1e9:.3g}B params",
            "llama",
            1,
            1,
            1,
            1,
            1,
            1,
            params_only=num_params,
        )

    @property
    def known(self) -> bool:
        """True when the shape (not only the parameter count) is known."""
        return self.params_only is None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection: kv heads x head dim."""
        return self.num_kv_heads * self.head_dim

    # -- parameters ---------------------------------------------------------------

    @property
    def layer_params_sharded(self) -> int:
        """Parameters of one block that tensor parallel splits (the linear layers)."""
        h, f, kv = self.hidden_size, self.ffn_hidden_size, self.kv_size
        if self.arch == "gpt2":
            # c_attn (with its column-split bias), c_proj, c_fc (+bias), mlp c_proj
            return h * 3 * h + 3 * h + h * h + h * f + f + f * h
        return 2 * h * h + 2 * h * kv + 3 * h * f

    @property
    def layer_params_replicated(self) -> int:
        """Parameters of one block every tensor-parallel rank keeps whole (norms, and
        the row-split layers' biases)."""
        h = self.hidden_size
        return 6 * h if self.arch == "gpt2" else 2 * h

    @property
    def layer_params(self) -> int:
        return self.layer_params_sharded + self.layer_params_replicated

    @property
    def embedding_params(self) -> int:
        """Token embedding (vocab-split by tensor parallel)."""
        return self.vocab_size * self.hidden_size

    @property
    def position_params(self) -> int:
        return self.max_positions * self.hidden_size

    @property
    def head_params(self) -> int:
        """The output projection; 0 when tied to the token embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return (2 if self.arch == "gpt2" else 1) * self.hidden_size

    @property
    def num_params(self) -> int:
        """Every parameter, counted once."""
        if self.params_only is not None:
            return self.params_only
        return (
            self.num_layers * self.layer_params
            + self.embedding_params
            + self.position_params
            + self.head_params
            + self.final_norm_params
        )

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward): 6 per matmul parameter plus
        attention's 12 x layers x hidden x seq (PaLM's appendix B; torchtitan's count).
        Lookups (token and position embeddings) do no matmul and are left out.

        Example:
            >>> round(preset("llama3-8b").flops_per_token(8192) / 1e9, 1)
            57.9
        """
        if self.params_only is not None:
            return 6.0 * self.params_only
        matmul = self.num_params - self.position_params
        if not self.tied_embeddings:
            matmul -= self.embedding_params
        attention = 12 * self.num_layers * self.hidden_size * seq_len
        return 6.0 * matmul + attention

    # -- activations --------------------------------------------------------------

    def layer_activation_bytes(
        self, act_bytes: int = 2, *, flash_attention: bool = True, seq_len: int = 0
    ) -> float:
        """Bytes one block keeps for its backward, per token (no tensor/sequence split).

        Llama: norm inputs and outputs (4h), q and k before and after RoPE (2h +
        2 kv), v (kv), the attention output (h: SDPA lays it out so the output
        projection reads it without a copy), SwiGLU's w1, w3, silu and product
        outputs (4 ffn). GPT-2: the norms (4h), the fused qkv output (3h), the
        attention output (h) and GELU's input and output (2 ffn).

        Example:
            >>> preset("llama3-8b").layer_activation_bytes()
            178304.0
        """
        h, f, kv = self.hidden_size, self.ffn_hidden_size, self.kv_size
        elements = 8 * h + 2 * f if self.arch == "gpt2" else 7 * h + 3 * kv + 4 * f
        scores = 0.0 if flash_attention else self.num_heads * seq_len * act_bytes
        lse = _LSE_BYTES * self.num_heads if flash_attention else 0
        return float(elements * act_bytes + lse + scores)

    def checkpointed_layer_bytes(self, act_bytes: int = 2) -> float:
        """Bytes a fully checkpointed block keeps per token: its input only."""
        return float(self.hidden_size * act_bytes)

    def output_activation_bytes(self, act_bytes: int = 2) -> float:
        """Bytes per token the output keeps: the final norm's input and output and
        the fp32 log-softmax of the logits (the loss is computed in fp32)."""
        return float(2 * self.hidden_size * act_bytes + 4 * self.vocab_size)

    def with_(self, **changes: object) -> ModelShape:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int) -> ModelShape:
    return ModelShape(name, "llama", layers, hidden, heads, kv, 128_256, ffn, default_seq_len=8192)


def _gpt2(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    # nanoGPT pads GPT-2's 50257 tokens to 50304 (a multiple of 64) for faster matmuls
    return ModelShape(
        name,
        "gpt2",
        layers,
        hidden,
        heads,
        heads,
        50_304,
        4 * hidden,
        max_positions=1024,
        tied_embeddings=True,
        default_seq_len=1024,
    )


#: named models `air plan` and `JobSpec.model.preset` know
PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _llama("llama3-8b", 32, 4096, 32, 8, 14_336),
        _llama("llama3-70b", 80, 8192, 64, 8, 28_672),
        _llama("llama3-405b", 126, 16_384, 128, 8, 53_248),
        _gpt2("gpt2-124m", 12, 768, 12),
        _gpt2("gpt2-350m", 24, 1024, 16),
        _gpt2("gpt2-774m", 36, 1280, 20),
        _gpt2("gpt2-1.5b", 48, 1600, 25),
    )
}


def preset(name: str) -> ModelShape:
    """The preset called `name`; ValueError naming the known ones otherwise.

    Example:
        >>> preset("llama3-70b").num_kv_heads
        8
    """
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"no model preset {name!r}; known: {', '.join(PRESETS)}"
            " (or give the shape: layers, hidden, heads, vocab)"
        ) from None
