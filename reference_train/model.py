"""A small Llama for data-parallel training: RMSNorm, RoPE, SwiGLU, causal attention.

The same model serves the dense families people fine-tune (reference_train/hf_io.py
maps their folders): Llama and Mistral as they are, Qwen2 with `qkv_bias` (biases
on the q, k and v projections), Qwen3 with `qk_norm` (an RMSNorm over each head of
q and k, before RoPE). `model_type` only names the family an export is written as.

The model knows nothing about parallelism (train.py averages the gradients), so
the same file serves 1 process and N hosts. Shapes use B (batch), L (sequence
length), D (model width), H (query heads), K (key/value heads). Attention,
SwiGLU's silu and the loss go through kernels.py: MLX's own kernels, except
on Linux's CPU, where MLX's exp is slow (see there).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from . import kernels
from .shape import ModelArgs, args_match  # noqa: F401 (where the trainer's modules look for them)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads or args.n_heads
        self.head_dim = args.head_dim or args.dim // args.n_heads
        self.scale = self.head_dim**-0.5
        bias = args.qkv_bias  # Qwen2
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.dim, bias=False)
        self.qk_norm = args.qk_norm  # Qwen3
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=args.norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=args.norm_eps)
        self.rope = make_rope(self.head_dim, args.rope_theta, args.rope_scaling)

    def __call__(self, x: mx.array, mask: mx.array | str | None = "causal") -> mx.array:
        B, L, _ = x.shape
        x = tokens_as_rows(x)
        q = self.wq(x).reshape(B, L, self.n_heads, -1)
        k = self.wk(x).reshape(B, L, self.n_kv_heads, -1)
        v = self.wv(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        q, k = self.rope(q), self.rope(k)
        # Both paths handle grouped-query attention (K < H) themselves.
        out = kernels.attention(q, k, v, scale=self.scale, mask=mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(B * L, -1)).reshape(B, L, -1)


def tokens_as_rows(x: mx.array) -> mx.array:
    """(B, L, dim) as (B * L, dim) for the attention's projections: MLX's matmul of a
    3-D input by a matrix flattens and unflattens it around the product and its
    gradient, four graph nodes a projection, which a compiled pipeline micro-batch
    replays at every call (docs/performance-runs.md 1f); one reshape serves the three.
    The products are the same BLAS calls. Not in the feed-forward: there it held one
    more hidden-sized array at the LoRA bench's peak (+3 MiB, measured)."""
    return x.reshape(-1, x.shape[-1])


def make_rope(head_dim: int, theta: float, scaling: dict | None) -> nn.Module:
    """Rotary embedding as Llama checkpoints set it: plain, linear-scaled, or Llama 3's."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "llama3":
        return Llama3RoPE(head_dim, theta, scaling)
    if kind == "linear":
        return RoPE(head_dim, theta, scale=1 / scaling["factor"])
    if kind != "default":
        raise ValueError(f"rope_scaling of type {kind!r} is not supported (default, linear, llama3)")
    return RoPE(head_dim, theta)


class RoPE(nn.Module):
    """nn.RoPE as Llama sets it (not traditional), through kernels.rope."""

    def __init__(self, dims: int, base: float, scale: float = 1.0):
        super().__init__()
        self.dims, self.base, self.scale = dims, base, scale

    def __call__(self, x: mx.array) -> mx.array:
        return kernels.rope(x, self.dims, self.base, self.scale)


class Llama3RoPE(nn.Module):
    """Llama 3.1's RoPE: low frequencies slowed by `factor`, a smooth ramp between the
    low- and high-frequency wavelengths (Meta's reference; mlx-lm's rope_utils.py)."""

    def __init__(self, dims: int, theta: float, scaling: dict):
        super().__init__()
        self.dims = dims
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_context = scaling.get("original_max_position_embeddings", 8192)
        freqs = theta ** (mx.arange(0, dims, 2) / dims)  # inverse frequencies' reciprocals
        wavelens = 2 * math.pi * freqs
        freqs = mx.where(wavelens > old_context / low, freqs * factor, freqs)
        medium = (wavelens > old_context / high) & (wavelens < old_context / low)
        smooth = (old_context / wavelens - low) / (high - low)
        # numpy, not an mx.array: a module's arrays are its state, which a compiled step
        # takes as inputs, and kernels.rope makes its tables from the values
        self._freqs = np.array(mx.where(medium, freqs / ((1 - smooth) / factor + smooth), freqs))

    def __call__(self, x: mx.array) -> mx.array:
        return kernels.rope(x, self.dims, None, freqs=self._freqs)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.hidden_dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(kernels.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Decoder-only transformer; `__call__` maps token ids (B, L) to logits (B, L, vocab).

    Its Linear and Embedding layers may be quantized ones (nn.QuantizedLinear,
    nn.QuantizedEmbedding: hf_io.py loads a quantized folder so, as a frozen base)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [TransformerBlock(args) for _ in range(args.n_layers)]
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        if not args.tie_embeddings:
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # --grad_checkpoint (train.py sets it): in training, each block's activations are
        # recomputed in the backward pass instead of kept (mx.checkpoint, as mlx-lm's).
        self.grad_checkpoint = False

    def __call__(self, tokens: mx.array) -> mx.array:
        h = run_blocks(self.layers, self.tok_embeddings(tokens),
                       self.grad_checkpoint and self.training)
        return head_logits(self, h)


def run_blocks(blocks, h: mx.array, recompute: bool) -> mx.array:
    """`h` through `blocks` in order, each checkpointed when `recompute`
    (a pipeline stage runs its own blocks with it: pipeline.py)."""
    for layer in blocks:
        h = checkpointed(layer, h) if recompute else layer(h)
    return h


def head_logits(model: nn.Module, h: mx.array) -> mx.array:
    """The final norm and the head of `model` (a Llama, or the last pipeline stage,
    which holds the same attributes): the embedding matrix itself when tied."""
    h = model.norm(h)
    if model.args.tie_embeddings:
        return model.tok_embeddings.as_linear(h)
    return model.output(h)


def checkpointed(layer: nn.Module, x: mx.array) -> mx.array:
    """`layer(x)` whose intermediate activations are not kept for the backward pass
    but recomputed there: only the block's input is saved (mlx-lm's
    tuner/trainer.py grad_checkpoint, per call rather than patching the class).
    The trainable parameters are the checkpoint's inputs, so their gradients flow
    (LoRA's adapters alone when the base is frozen)."""

    def inner(params, x):
        layer.update(params)
        return layer(x)

    return mx.checkpoint(inner)(layer.trainable_parameters(), x)


def loss_fn(model: Llama, inputs: mx.array, targets: mx.array,
            weights: mx.array | None = None) -> mx.array:
    """Mean next-token cross-entropy over every position of the batch; with `weights`
    (rows data: 0 where no target is trained, data.py), the mean of weight x
    cross-entropy, i.e. the mean over the global batch's trained targets only."""
    logits = model(inputs)
    if logits.dtype != mx.float32:  # bfloat16 passes: the loss itself in float32
        logits = logits.astype(mx.float32)
    return kernels.cross_entropy(logits, targets, weights)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (tied embeddings counted once)."""
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def generate(model: Llama, prompt: list[int], n_tokens: int, key: mx.array,
             temperature: float = 0.8, block_size: int = 256) -> list[int]:
    """Sample `n_tokens` after `prompt` (no KV cache: a short sample at the end of training)."""
    tokens = list(prompt)
    for _ in range(n_tokens):
        context = mx.array(tokens[-block_size:])[None]
        logits = model(context)[0, -1]
        key, sub = mx.random.split(key)
        if temperature <= 0:
            nxt = mx.argmax(logits)
        else:
            nxt = mx.random.categorical(logits / temperature, key=sub)
        tokens.append(int(nxt.item()))
    return tokens[len(prompt):]
