"""silu, attention and the loss: MLX's kernels, or on Linux's CPU the same
functions built from multiply-adds where that pays.

Why: MLX's CPU exp (the Linux wheel, mlx 0.32.4) runs one element at a time and
calls libm's fmaf for every step of its polynomial. Measured here (2-core EPYC,
one array of 524,288 float32): exp 8.5-14 ms, a multiply 0.15 ms; MLX's
sigmoid costs more than its exp. In a training step of the bench's Llama
(bench/step_vs_mlx_lm.py) perf counted 12% of all samples in exp, fmaf and
sigmoid. The exp below (Cephes' expf: k = round(x / ln 2), r = x - k ln 2, a
polynomial in r, 2^k written into the exponent bits of two halves) is
arithmetic that `mx.compile` fuses: 2-3x faster than MLX's exp and closer to
the true value (largest relative error over [-87, 88]: 7.8e-8 against
float64; MLX's exp: 3.3e-6).

But not into one loop: MLX fuses at most 11 operations deep and not past a
bit cast, so a compiled ``exp`` is ~12 kernels, each writing an array of the
input's size. Where its input is large and memory is held around it, that
costs more than it saves: the loss's logsumexp and the attention's softmax
are MLX's (see ``cross_entropy`` and ``attention``); silu keeps ours.

Each function here has its textbook gradient (`mx.custom_function`), so that
backpropagation multiplies by the saved output instead of differentiating
the polynomial.

Where: float32 arrays on the CPU device on Linux, with `use("auto")` (the
default). Everywhere else (an Apple GPU, where exp is one instruction;
bfloat16; macOS's CPU, whose MLX exp is vectorized by Accelerate and was never
measured against this one) and with `use("mlx")` (`--kernels mlx`), the same
names call MLX's own kernels, so that a Mac computes exactly what mlx-lm does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .choices import KERNELS as MODES

_mode = "auto"


def use(mode: str) -> None:
    """"auto": the multiply-add functions where they apply (float32 on Linux's
    CPU); "mlx": MLX's kernels everywhere. Read when a function is traced, so
    set it before the training step is compiled."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {', '.join(MODES)}, not {mode!r}")
    _mode = mode


def applies(x: mx.array) -> bool:
    """Whether ``x`` takes the multiply-add path (see the module's docstring)."""
    return (_mode == "auto" and x.dtype == mx.float32 and sys.platform == "linux"
            and mx.default_device() == mx.cpu)


# Cephes' expf (cephes/single/expf.c): ln 2 split in two so that r is exact.
_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)
# Beyond these exp is 0 or inf in float32 (ln of its largest and of half its
# smallest denormal number).
_EXP_LOW, _EXP_HIGH = -103.97, 88.7228


def exp(x: mx.array) -> mx.array:
    """e**x for float32 from multiply-adds (no custom gradient: used inside the
    functions below, whose gradients never differentiate it)."""
    xc = mx.clip(x, _EXP_LOW, _EXP_HIGH)
    k = mx.floor(xc * _LOG2E + 0.5)
    r = xc - k * _LN2_HI - k * _LN2_LO
    p = _EXP_POLY[0]
    for c in _EXP_POLY[1:]:
        p = p * r + c
    p = p * r * r + r + 1.0
    # 2**k as two powers of two with normal exponents (k runs from -150 to 128),
    # each written straight into a float's exponent bits: exact, no pow.
    k = k.astype(mx.int32)
    half = k >> 1
    y = p * mx.view((half + 127) << 23, mx.float32) * mx.view((k - half + 127) << 23, mx.float32)
    y = mx.where(x < _EXP_LOW, 0.0, y)
    return mx.where(x > _EXP_HIGH, mx.inf, y)  # NaN stays NaN: both comparisons are false


def _sigmoid(x: mx.array) -> mx.array:
    return 1.0 / (1.0 + exp(-x))


@mx.custom_function
def _silu(x: mx.array) -> mx.array:
    return x * _sigmoid(x)


@_silu.vjp
def _silu_vjp(x, cotangent, out):
    s = mx.where(x == 0, 0.5, out / x)  # sigmoid(x), from the output: no exp
    return cotangent * (s + out * (1.0 - s))  # d/dx x s(x) = s + x s (1 - s) = s + out (1 - s)


def silu(x: mx.array) -> mx.array:
    """x * sigmoid(x), SwiGLU's gate."""
    return _silu(x) if applies(x) else nn.silu(x)


@mx.custom_function
def _loss_logsumexp(x: mx.array) -> mx.array:
    return mx.logsumexp(x, axis=-1)


@_loss_logsumexp.vjp
def _loss_logsumexp_vjp(x, cotangent, lse):
    return mx.exp(x - lse[..., None]) * cotangent[..., None]  # softmax(x) * cotangent


@mx.custom_function
def _loss_logsumexp_kept(x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(logsumexp, e = exp(x - max), its sum): the exps kept for the gradient."""
    top = x.max(axis=-1, keepdims=True)
    e = mx.exp(x - top)
    total = e.sum(axis=-1, keepdims=True)
    return (top + mx.log(total)).squeeze(-1), e, total


@_loss_logsumexp_kept.vjp
def _loss_logsumexp_kept_vjp(x, cotangents, outputs):
    _, e, total = outputs
    return e * (cotangents[0][..., None] / total)  # softmax(x) * cotangent, no second exp


# Logits up to this size keep their exps from the forward for the backward, at most
# this much more memory (see `cross_entropy`); larger ones compute them again.
KEPT_EXPS_BYTES = 2**20


def cross_entropy(logits: mx.array, targets: mx.array,
                  weights: mx.array | None = None) -> mx.array:
    """Mean cross-entropy of integer ``targets`` under ``logits`` (..., vocab); with
    ``weights`` (the shape of ``targets``), the mean of weight x cross-entropy, so a
    position of weight 0 counts nowhere (data.py's trained-target weights).

    On the multiply-add path its logsumexp is MLX's, with the textbook gradient
    (softmax x cotangent, MLX's exp), not one on our exp: under mx.compile
    our exp is ~12 kernels (MLX fuses at most 11 operations deep, and not past
    its bit casts), each writing an array of the logits' size, and the loss runs
    when every activation is still held: measured, a step of
    bench/lora_step_vs_mlx_lm.py's LoRA (vocab 400) peaked ~3 MiB higher with
    it, the loss alone (value_and_grad of 8 x 128 x 400 logits) added 31 MiB
    against 3 MiB; at a real vocabulary (128k) each such array is the size of
    the logits. The loss is a small part of a step's exps (the attention's
    scores are larger), so little speed is lost.

    Logits of at most KEPT_EXPS_BYTES keep the forward's exps for the gradient
    (softmax = e / their sum): one MLX exp instead of two, for one more
    logits-sized array held from the forward to the backward. That is the
    pipeline's case, a micro-batch's logits on its last stage, where the loss's
    second exp stood on the critical path: 64 x 257 logits and their head, 0.62
    against 0.45 ms; larger logits (the LoRA bench's 1.6 MiB, any real
    vocabulary) compute them again, so no peak grows by more than 1 MiB."""
    if not applies(logits):
        if weights is None:
            return nn.losses.cross_entropy(logits, targets, reduction="mean")
        return (nn.losses.cross_entropy(logits, targets, reduction="none") * weights).mean()
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1).squeeze(-1)
    if logits.nbytes <= KEPT_EXPS_BYTES:
        per_position = _loss_logsumexp_kept(logits)[0] - picked
    else:
        per_position = _loss_logsumexp(logits) - picked
    return per_position.mean() if weights is None else (per_position * weights).mean()


# How many lengths the rope's tables and the causal mask are kept for: a few block
# sizes in training, but generate() without a cache asks for every length up to its
# window, so the oldest are dropped past this many.
_LENGTHS_KEPT = 64
# (length, dims, base, scale, freqs' bytes) -> the rotation (`rope`)
_ROTATIONS: dict[tuple, Callable[[mx.array], mx.array]] = {}
# length -> the causal mask (`attention`)
_CAUSAL: dict[int, mx.array] = {}


def _made_once(cache: dict, key, make):
    """``cache[key]``, made by ``make()`` the first time; the oldest entry dropped past
    _LENGTHS_KEPT."""
    if key not in cache:
        if len(cache) >= _LENGTHS_KEPT:
            del cache[next(iter(cache))]
        cache[key] = make()
    return cache[key]


def rope(x: mx.array, dims: int, base: float | None, scale: float = 1.0,
         freqs: np.ndarray | None = None) -> mx.array:
    """``mx.fast.rope`` as Llama uses it (not traditional, offset 0) of ``x``
    (B, H, L, D); ``freqs`` (float32, dims / 2) as mx.fast.rope's, given as numpy so that
    no traced step ever takes it as an input.

    On the multiply-add path, the same arithmetic with its cos and sin tables made
    once per length: MLX's CPU rope builds them (two aranges, an exp, cos, sin)
    into every call's graph, and its gradient builds them again. A compiled
    pipeline micro-batch replays its graph each time, at ~1.5 us a node on one
    core (docs/performance-runs.md 1f): a rope and its gradient were 21 nodes
    and ~89 us, here 14 nodes and ~47 us. The tables are MLX's own (its rope of
    (1, 0) pairs is (cos, sin)), the products and sums the same, in the same
    order, so the result is bit for bit its rope's, and so is the gradient.
    No mx.custom_function: its gradient would hold the rope's input until the
    backward (measured: +1.7 MiB at the LoRA bench's peak)."""
    if not (applies(x) and x.ndim == 4 and dims == x.shape[-1] and dims % 2 == 0):
        return mx.fast.rope(x, dims, traditional=False, base=base, scale=scale, offset=0,
                            freqs=None if freqs is None else mx.array(freqs))
    length = x.shape[2]
    key = (length, dims, base, scale, None if freqs is None else freqs.tobytes())
    return _made_once(_ROTATIONS, key, lambda: _rotation(length, dims, base, scale, freqs))(x)


def _rotation(length: int, dims: int, base, scale: float, freqs):
    half = dims // 2
    pairs = mx.concatenate([mx.ones((1, 1, length, half)), mx.zeros((1, 1, length, half))], -1)
    table = mx.fast.rope(pairs, dims, traditional=False, base=base, scale=scale, offset=0,
                         freqs=None if freqs is None else mx.array(freqs))
    cos, sin = table[..., :half], table[..., half:]
    mx.eval(cos, sin)  # constants of whatever graph is traced around them

    def rotate(x):  # differentiated as it is: its gradient keeps only the tables
        x1, x2 = x[..., :half], x[..., half:]
        return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    return rotate


def _causal(length: int) -> mx.array:
    """(length, length) bool, True where a position sees another (itself and the past):
    made once per length, a constant of the traced graph instead of five nodes."""
    def make() -> mx.array:
        seen = mx.arange(length)[:, None] >= mx.arange(length)[None]
        mx.eval(seen)
        return seen

    return _made_once(_CAUSAL, length, make)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float,
              mask: mx.array | str | None = "causal") -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` (q: B, H, L, D; k, v: B, K, L, D with
    K dividing H). On its CPU path MLX computes it unfused, and its gradient
    computes the probabilities again (MLX's slow exp a second time); here the
    same steps, scores, the causal mask, MLX's softmax, values, differentiated
    as they are: the backward pass multiplies by the saved probabilities.

    The softmax is MLX's, not one on our exp: on 8 x 2 x 2 x 128 x 128
    scores (bench/lora_step_vs_mlx_lm.py's) ours ran 5.7-6.0 ms against
    8.7-9.0, but its ~12 kernels held 20 MiB at once against 2 MiB, and with
    the gradient the two took the same time (10.9 against 10.4 ms). With
    MLX's, the LoRA bench's peak went from 153.3 to 152.0 MiB (mlx-lm 153.0)
    and the full fine-tuning step stayed faster than mlx-lm's
    (docs/performance-runs.md, LoRA and QLoRA)."""
    plain_mask = mask is None or (isinstance(mask, str) and mask == "causal")
    if not (applies(q) and plain_mask and q.shape[2] == k.shape[2]):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    B, H, L, D = q.shape
    K = k.shape[1]
    # Grouped-query attention: the H / K query heads of a group share one key/value head.
    q = (q * scale).reshape(B, K, H // K, L, D)
    scores = q @ k[:, :, None].swapaxes(-1, -2)
    if mask == "causal":
        scores = mx.where(_causal(L), scores, -mx.inf)
    return (mx.softmax(scores, axis=-1) @ v[:, :, None]).reshape(B, H, L, D)
