"""A Llama-shaped transformer for planner tests: RMSNorm, grouped-query attention with
RoPE (torchtitan's complex-number form), SwiGLU, untied output. Small enough for CPU."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from air_sdk.planner import ModelShape


def shape(layers: int = 2, hidden: int = 64, heads: int = 4, kv: int = 2, vocab: int = 128,
          ffn: int = 192) -> ModelShape:  # fmt: skip
    return ModelShape("tiny-llama", "llama", layers, hidden, heads, kv, vocab, ffn)


def rope(seq: int, head_dim: int) -> torch.Tensor:
    freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs[None, :, None, :]).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        # head counts under names AIR divides under tensor parallel (forward views with -1)
        self.n_heads, self.n_kv_heads, self.dim = s.num_heads, s.num_kv_heads, s.head_dim
        self.wq = nn.Linear(s.hidden_size, s.hidden_size, bias=False)
        self.wk = nn.Linear(s.hidden_size, s.kv_size, bias=False)
        self.wv = nn.Linear(s.hidden_size, s.kv_size, bias=False)
        self.wo = nn.Linear(s.hidden_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 rather than the head counts: under tensor parallel each rank holds a share
        q = apply_rope(self.wq(x).view(b, t, -1, self.dim), freqs)
        k = apply_rope(self.wk(x).view(b, t, -1, self.dim), freqs)
        v = self.wv(x).view(b, t, -1, self.dim)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(s.hidden_size, s.ffn_hidden_size, bias=False)
        self.w3 = nn.Linear(s.hidden_size, s.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(s.ffn_hidden_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(s.hidden_size)
        self.attention = Attention(s)
        self.ffn_norm = nn.RMSNorm(s.hidden_size)
        self.feed_forward = FeedForward(s)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs)
        return x + self.feed_forward(self.ffn_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, s: ModelShape, seq: int = 32) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.num_layers))
        self.norm = nn.RMSNorm(s.hidden_size)
        self.output = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        self.register_buffer("freqs", rope(seq, s.head_dim), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs[: tokens.shape[1]])
        return self.output(self.norm(h))


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
