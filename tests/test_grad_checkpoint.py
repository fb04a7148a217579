"""--grad_checkpoint: each block recomputed in the backward pass (mx.checkpoint).
The same losses and gradients as without it, full and LoRA fine-tuning, compiled
as train.py compiles its step; the flag parsed and set on the Trainer's models."""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from reference_train import lora
from reference_train.config import build_config
from reference_train.model import Llama, ModelArgs, loss_fn

ARGS = ModelArgs(vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, hidden_dim=64)


def run(checkpoint: bool, fine_tune: str, compiled: bool, steps: int = 3):
    """Losses and every step's gradients of a few AdamW steps on fixed batches."""
    mx.random.seed(0)
    model = Llama(ARGS)
    if fine_tune == "lora":
        model = lora.apply_lora(model, 2, 4, 20.0, 0.0, lora.parse_keys(""))
    model.grad_checkpoint = checkpoint
    opt = optim.AdamW(learning_rate=1e-2)
    opt.init(model.trainable_parameters())
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss, grads

    if compiled:
        state = [model.state, opt.state]
        step = partial(mx.compile, inputs=state, outputs=state)(step)
    rng = np.random.default_rng(1)
    losses, grads = [], []
    for _ in range(steps):
        tokens = mx.array(rng.integers(0, ARGS.vocab_size, (2, 17)))
        loss, g = step(tokens[:, :-1], tokens[:, 1:])
        mx.eval(loss, g, model.parameters(), opt.state)
        losses.append(loss.item())
        grads.append({k: np.array(v) for k, v in tree_flatten(g)})
    return losses, grads


@pytest.mark.parametrize("fine_tune", ["full", "lora"])
@pytest.mark.parametrize("compiled", [True, False])
def test_same_losses_and_gradients(fine_tune, compiled):
    losses, grads = run(False, fine_tune, compiled)
    losses_ckpt, grads_ckpt = run(True, fine_tune, compiled)
    assert np.allclose(losses, losses_ckpt, rtol=0, atol=1e-5), (losses, losses_ckpt)
    for plain, ckpt in zip(grads, grads_ckpt, strict=True):
        assert plain.keys() == ckpt.keys()
        if fine_tune == "lora":  # the adapters alone, of the last 2 blocks
            assert all(".lora_" in k and k.startswith(("layers.1.", "layers.2.")) for k in plain)
        for k in plain:
            assert np.abs(plain[k] - ckpt[k]).max() <= 1e-5, k


def test_only_in_training_mode():
    mx.random.seed(0)
    model = Llama(ARGS)
    model.grad_checkpoint = True
    x = mx.array([[1, 2, 3, 4]])
    train_logits = model(x)
    model.eval()  # evaluation and sampling: no checkpoint (nothing to differentiate)
    assert mx.allclose(model(x), train_logits, atol=1e-6).item()


def test_config_field():
    assert build_config([]).grad_checkpoint is False
    assert build_config(["--grad_checkpoint", "true"]).grad_checkpoint is True
    with pytest.raises(ValueError, match="grad_checkpoint"):
        build_config(["--grad_checkpoint", "maybe"])
