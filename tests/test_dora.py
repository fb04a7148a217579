"""--fine_tune dora (reference_train/lora.py) against the real mlx-lm (issue 38, item 6):
the layer and its gradients are mlx-lm's DoRALinear's, OUT/adapters (`fine_tune_type:
dora`, a magnitude `m` per adapted layer) opened by mlx_lm.utils.load with our logits,
by the real `mlx_lm generate --adapter-path` with our greedy text and fused by the real
`mlx_lm fuse`; data-parallel on 2 ranks as on 1, a resume exact, and QLoRA's quantized
base with DoRA."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from reference_train import lora
from reference_train.fine_tune import KEYS

from . import adapter_support as support
from .conftest import require
from .hf_support import mlx_lm_logits
from .train_support import MLX_LAUNCH, train_losses

DORA = ("--fine_tune", "dora")


# ---------------------------------------------------------------- the layer


def layers(linear, seed=7):
    """Ours and mlx-lm's DoRALinear around ``linear``, drawn from the same random state."""
    from mlx_lm.tuner.dora import DoRALinear as TheirDoRA

    mx.random.seed(seed)
    ours = lora.DoRALinear.from_base(linear, r=4, dropout=0.0, scale=2.5)
    mx.random.seed(seed)
    theirs = TheirDoRA.from_base(linear, r=4, dropout=0.0, scale=2.5)
    return ours, theirs


@pytest.mark.parametrize("kind", ["linear", "bias", "quantized"])
def test_the_layer_and_its_gradients_are_mlx_lms(kind):
    mx.random.seed(1)
    base = nn.Linear(64, 48, bias=kind == "bias")
    linear = nn.QuantizedLinear.from_linear(base, group_size=32, bits=4) \
        if kind == "quantized" else base
    ours, theirs = layers(linear)
    assert sorted(k for k, _ in tree_flatten(ours.parameters())) == \
        sorted(k for k, _ in tree_flatten(theirs.parameters()))
    assert ours.m.shape == (48,) and ours.m.dtype == mx.float32
    assert mx.array_equal(ours.lora_a, theirs.lora_a).item()
    assert mx.array_equal(ours.m, theirs.m).item()  # the base weight's row norms
    # trained adapters: b away from zero, m away from the norms
    b, m = mx.random.normal((4, 48)), theirs.m * (1 + 0.3 * mx.random.normal((48,)))
    ours.lora_b, theirs.lora_b, ours.m, theirs.m = b, b, m, m
    x = mx.random.normal((2, 3, 64))
    assert mx.abs(ours(x) - theirs(x)).max().item() < 1e-5
    # the output is the LoRA output, its rows rescaled to the magnitude m
    w = ours.base_weight()
    adapted = w + 2.5 * (ours.lora_a @ b).T
    lora_out = x @ w.T + 2.5 * (x @ ours.lora_a) @ b
    want = m / mx.linalg.norm(adapted, axis=1) * lora_out + (base.bias if kind == "bias" else 0)
    assert mx.allclose(ours(x), want, atol=1e-4).item()

    def loss(layer):
        return (layer(x) ** 2).mean()

    for layer in (ours, theirs):
        layer.freeze()
        layer.unfreeze(keys=["lora_a", "lora_b", "m"], recurse=False)
    ours_grads = dict(tree_flatten(nn.value_and_grad(ours, loss)(ours)[1]))
    theirs_grads = dict(tree_flatten(nn.value_and_grad(theirs, loss)(theirs)[1]))
    assert sorted(ours_grads) == ["lora_a", "lora_b", "m"] == sorted(theirs_grads)
    for k in ours_grads:
        assert mx.abs(ours_grads[k] - theirs_grads[k]).max().item() < 1e-5, k
        assert mx.abs(ours_grads[k]).max().item() > 0, k


# ---------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def runs(llama, llama_data, tmp_path_factory):
    """DoRA on every block of `llama`, 4 steps: straight on 1 rank, and stopped at 2
    then resumed."""
    root = tmp_path_factory.mktemp("dora")
    proc = support.train(llama, llama_data, root / "straight", *DORA)
    support.train(llama, llama_data, root / "split", *DORA, "--stop_after", "2")
    resumed = support.train(llama, llama_data, root / "split", *DORA, "--resume")
    return root, proc, resumed


def test_out_adapters_are_mlx_lms_dora(llama, runs, tmp_path):
    from mlx_lm.utils import load

    root, proc, _ = runs
    adapters = root / "straight" / "adapters"
    assert "DoRA: rank 4, scale 20.0, dropout 0.0 on all blocks'" in proc.stdout
    assert f"adapters for mlx-lm: {adapters}" in proc.stdout
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "dora" and config["num_layers"] == 2
    assert config["lora_parameters"] == {"rank": 4, "scale": 20.0, "dropout": 0.0,
                                         "keys": list(KEYS)}
    # the checkpoint: the adapters and magnitudes with their AdamW state, nothing of the base
    ckpt = root / "straight" / "checkpoints" / "step_000004"
    saved = mx.load(str(ckpt / "model.safetensors"))
    assert len(saved) == 2 * 7 * 3 and all(k.endswith((".lora_a", ".lora_b", ".m")) for k in saved)
    state = mx.load(str(ckpt / "optimizer.safetensors"))
    assert sorted(k for k in state if "." in k) == sorted(f"{k}.{m}" for k in saved for m in "mv")
    written = mx.load(str(adapters / "adapters.safetensors"))
    assert sorted(written) == sorted(lora.hf_adapter_name(k) for k in saved)
    m = written["model.layers.0.self_attn.q_proj.m"]
    assert m.shape == (64,) and m.dtype == mx.float32
    # the magnitudes trained: away from the base weight's row norms they start at
    base = load(str(llama))[0].layers[0].self_attn.q_proj.weight
    assert mx.abs(m - mx.linalg.norm(base, axis=1)).max().item() > 1e-4

    # mlx-lm's DoRA forward (load_adapters: DoRALinear) on our adapters: our logits
    ids = support.prompt_ids(llama)
    ours = support.our_adapted_model(llama, adapters)(ids)
    theirs, _ = load(str(llama), adapter_path=str(adapters))
    assert type(theirs.layers[0].self_attn.q_proj).__name__ == "DoRALinear"
    assert mx.abs(theirs(ids) - ours).max().item() < 1e-4
    assert mx.abs(mlx_lm_logits(llama, ids) - ours).max().item() > 1e-3  # the adapters matter
    # the real commands: generate's greedy text is ours, fuse's model computes our logits
    support.mlx_lm_generates_ours(llama, adapters, tmp_path)
    support.mlx_lm_fuses_ours(llama, adapters, tmp_path / "fused", ours, ids)
    # a whole model from a DoRA checkpoint: refused, naming mlx_lm.fuse
    from reference_train.export import main as export_main

    assert export_main([str(root / "straight"), str(tmp_path / "exported")]) == 2
    assert not (tmp_path / "exported").exists()


def test_resume_is_exact(runs):
    root, _, resumed = runs
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    straight, split = train_losses(root / "straight"), train_losses(root / "split")
    assert sorted(split) == [1, 2, 3, 4] and split == straight  # every loss, bit for bit


def test_two_ranks_train_what_one_does(llama, llama_data, runs, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    root, _, _ = runs
    support.train(llama, llama_data, tmp_path / "two", *DORA, ranks=2)
    one, two = train_losses(root / "straight"), train_losses(tmp_path / "two")
    assert sorted(two) == [1, 2, 3, 4]
    for step, loss in one.items():
        assert abs(two[step] - loss) <= 1e-5 * abs(loss), (step, one, two)
    a = mx.load(str(root / "straight" / "adapters" / "adapters.safetensors"))
    b = mx.load(str(tmp_path / "two" / "adapters" / "adapters.safetensors"))
    assert sorted(a) == sorted(b)
    assert max(mx.abs(a[k] - b[k]).max().item() for k in a) < 1e-4


def test_dora_on_a_quantized_base(llama, llama_data, tmp_path):
    """QLoRA with DoRA (mlx-lm's DoRALinear takes an nn.QuantizedLinear: its weight
    dequantized): the base stays quantized and frozen, and mlx-lm opens the
    adapters on that folder with our logits, and fuses them."""
    from mlx_lm.utils import load

    folder = support.quantized_llama(tmp_path / "q4", llama)
    out = tmp_path / "run"
    proc = support.train(folder, llama_data, out, *DORA, "--steps", "2")
    assert "DoRA: rank 4" in proc.stdout and "the base frozen and quantized" in proc.stdout
    model = support.our_adapted_model(folder, out / "adapters")
    assert isinstance(model.layers[0].attention.wq.linear, nn.QuantizedLinear)
    assert isinstance(model.layers[0].attention.wq, lora.DoRALinear)
    ids = support.prompt_ids(llama)
    ours = model(ids)
    theirs, _ = load(str(folder), adapter_path=str(out / "adapters"))
    assert mx.abs(theirs(ids) - ours).max().item() < 1e-4
    support.mlx_lm_fuses_ours(folder, out / "adapters", tmp_path / "fused", ours, ids, "--dequantize")
