"""reference_train/kernels.py: on Linux's CPU, silu, the loss and attention
built from multiply-adds equal MLX's own kernels, values and
gradients, and the model and training step give the same numbers either way."""

from __future__ import annotations

import sys
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest

from reference_train import kernels
from reference_train.config import build_config
from reference_train.model import Llama, Llama3RoPE, ModelArgs, loss_fn

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the multiply-add path is Linux's")


@pytest.fixture(autouse=True)
def default_kernels():
    kernels.use("auto")
    yield
    kernels.use("auto")


@linux_only
def test_the_multiply_add_path_is_taken_for_float32_on_linux_cpu_only():
    assert kernels.applies(mx.zeros(3))
    assert not kernels.applies(mx.zeros(3, dtype=mx.bfloat16))
    kernels.use("mlx")
    assert not kernels.applies(mx.zeros(3))
    with pytest.raises(ValueError, match="kernels must be one of auto, mlx, not 'fast'"):
        kernels.use("fast")


def test_exp_is_as_close_to_the_true_value_as_float32_allows():
    x = mx.concatenate([mx.random.uniform(-87.0, 88.7, (200_000,)), mx.linspace(-5, 5, 1001)])
    true = np.exp(np.array(x, dtype=np.float64))
    ours = np.array(kernels.exp(x), dtype=np.float64)
    assert np.max(np.abs(ours - true) / true) < 2e-7  # float32's own spacing is 6e-8
    theirs = np.array(mx.exp(x), dtype=np.float64)
    assert np.max(np.abs(theirs - true) / true) > 1e-6  # MLX's CPU exp is the rougher one


def test_exp_at_the_edges_of_float32():
    x = mx.array([-mx.inf, -200.0, -104.0, -100.0, 0.0, 88.72, 88.73, 200.0, mx.inf, mx.nan])
    got = np.array(kernels.exp(x))
    assert list(got[:3]) == [0.0, 0.0, 0.0]
    assert got[3] == pytest.approx(np.exp(-100.0), rel=1e-2)  # a denormal, not flushed
    assert got[4] == 1.0
    assert np.isfinite(got[5]) and got[5] == pytest.approx(np.exp(np.float64(np.float32(88.72))), rel=2e-7)
    assert list(np.isinf(got[6:9])) == [True, True, True]
    assert np.isnan(got[9])


def gradients_of(f, x, weights):
    return mx.grad(lambda x: (f(x) * weights).sum())(x)


@linux_only
def test_silu_value_and_gradient_equal_mlxs():
    theirs, ours = nn.silu, kernels.silu
    x = mx.random.normal((4, 8, 64)) * 4
    weights = mx.random.normal(theirs(x).shape)
    for f in (ours, mx.compile(ours)):
        assert mx.allclose(f(x), theirs(x), rtol=1e-6, atol=1e-6)
        assert mx.allclose(gradients_of(f, x, weights), gradients_of(theirs, x, weights),
                           rtol=1e-5, atol=1e-6)


@linux_only
@pytest.mark.parametrize("exps_kept", [True, False], ids=["exps-kept", "exps-recomputed"])
def test_the_loss_and_its_gradient_equal_mlxs(exps_kept, monkeypatch):
    # logits of at most KEPT_EXPS_BYTES keep their exps for the backward, larger ones not
    monkeypatch.setattr(kernels, "KEPT_EXPS_BYTES", 2**40 if exps_kept else 0)
    logits, targets = mx.random.normal((4, 16, 320)) * 3, mx.random.randint(0, 320, (4, 16))
    theirs = partial(nn.losses.cross_entropy, reduction="mean")
    # a few float32 ulps apart at most (their means sum in other orders): 1.9e-6 at ~6
    # over 200 seeds, either way
    assert kernels.cross_entropy(logits, targets).item() == pytest.approx(
        theirs(logits, targets).item(), rel=1e-6)
    ours_grad = mx.grad(kernels.cross_entropy)(logits, targets)
    assert mx.allclose(ours_grad, mx.grad(theirs)(logits, targets), atol=1e-8, rtol=1e-5)


def graph_ops(*outputs: mx.array) -> list[str]:
    """The operations of the graph that computes `outputs` (MLX's dot export)."""
    import io
    import re
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return re.findall(r'label ="?([A-Za-z_]+)', dot.getvalue())


ROPES = {"plain": dict(base=10000.0), "linear": dict(base=500000.0, scale=0.25),
         "llama3": dict(base=None, freqs=np.array(Llama3RoPE(16, 500000.0, {
             "factor": 8.0, "original_max_position_embeddings": 32})._freqs))}


@linux_only
@pytest.mark.parametrize("kind", ROPES)
def test_rope_and_its_gradient_are_mlxs_bit_for_bit_with_the_tables_made_once(kind):
    settings = ROPES[kind]
    freqs = settings.get("freqs")

    def theirs(x):
        return mx.fast.rope(x, 16, traditional=False, base=settings["base"],
                            scale=settings.get("scale", 1.0), offset=0,
                            freqs=None if freqs is None else mx.array(freqs))

    def ours(x):
        return kernels.rope(x, 16, settings["base"], settings.get("scale", 1.0), freqs)

    x, cotangent = mx.random.normal((2, 4, 24, 16)) * 3, mx.random.normal((2, 4, 24, 16))
    for f in (ours, mx.compile(ours)):
        assert np.array_equal(np.array(f(x)), np.array(theirs(x)))
        grad = mx.vjp(f, [x], [cotangent])[1][0]
        assert np.array_equal(np.array(grad), np.array(mx.vjp(theirs, [x], [cotangent])[1][0]))
    # the cos and sin tables are constants: no call's graph computes them again (MLX's
    # CPU rope does, in the forward and again in its gradient)
    both = mx.compile(lambda x, c: mx.vjp(ours, [x], [c]))
    ops = graph_ops(*both(x, cotangent)[0], *both(x, cotangent)[1])
    assert not {"Cos", "Sin", "Arange"} & set(ops), ops
    assert {"Cos", "Sin"} <= set(graph_ops(*mx.compile(
        lambda x, c: mx.vjp(theirs, [x], [c]))(x, cotangent)[1]))
    # elsewhere (bfloat16 here) it is MLX's rope itself
    half = x.astype(mx.bfloat16)
    assert np.array_equal(np.array(ours(half).astype(mx.float32)),
                          np.array(theirs(half).astype(mx.float32)))


@linux_only
@pytest.mark.parametrize("kv_heads,mask", [(4, "causal"), (2, "causal"), (1, "causal"), (4, None)])
def test_attention_equals_mlxs_fused_attention(kv_heads, mask):
    q = mx.random.normal((2, 4, 32, 16))
    k, v = mx.random.normal((2, kv_heads, 32, 16)), mx.random.normal((2, kv_heads, 32, 16))
    weights = mx.random.normal(q.shape)

    def ours(q, k, v):
        return kernels.attention(q, k, v, scale=0.25, mask=mask)

    def theirs(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)

    assert mx.allclose(ours(q, k, v), theirs(q, k, v), atol=1e-5)
    for argnum in (0, 1, 2):
        grads = [mx.grad(lambda *a, f=f: (f(*a) * weights).sum(), argnums=argnum)(q, k, v)
                 for f in (ours, theirs)]
        assert mx.allclose(grads[0], grads[1], atol=1e-5), f"gradient of argument {argnum}"


def test_bfloat16_and_array_masks_take_mlxs_kernels():
    q = mx.random.normal((1, 2, 8, 16)).astype(mx.bfloat16)
    assert mx.array_equal(kernels.silu(q), nn.silu(q))
    mask = mx.random.normal((8, 8))
    qf = q.astype(mx.float32)
    assert mx.array_equal(kernels.attention(qf, qf, qf, 0.25, mask),
                          mx.fast.scaled_dot_product_attention(qf, qf, qf, scale=0.25, mask=mask))


def train_losses(mode: str, steps: int = 6) -> tuple[mx.array, list[float]]:
    """Logits of a fresh model, then the losses of a few compiled AdamW steps."""
    kernels.use(mode)
    mx.random.seed(3)
    model = Llama(ModelArgs(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                            hidden_dim=128))
    optimizer = optim.AdamW(learning_rate=3e-3)
    x, y = mx.random.randint(0, 97, (4, 32)), mx.random.randint(0, 97, (4, 32))
    logits = model(x)
    state = [model.state, optimizer.state]
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    losses = []
    for _ in range(steps):
        loss = step(x, y)
        mx.eval(loss, state)
        losses.append(loss.item())
    return logits, losses


@linux_only
def test_the_model_trains_the_same_with_either_kernels():
    ours_logits, ours = train_losses("auto")
    mlx_logits, theirs = train_losses("mlx")
    assert mx.allclose(ours_logits, mlx_logits, atol=1e-5)
    assert ours[-1] < ours[0] - 0.1  # it learns
    assert np.allclose(ours, theirs, rtol=1e-5), (ours, theirs)


def test_the_trainer_flag_is_checked():
    assert build_config(["--kernels", "mlx"]).kernels == "mlx"
    with pytest.raises(ValueError, match="kernels fast: must be one of auto, mlx"):
        build_config(["--kernels", "fast"])
