"""--fine_tune lora (reference_train/lora.py) against the real mlx-lm: the layer, the
names, OUT/adapters opened by mlx_lm.utils.load and fused by mlx_lm fuse, and
checkpoints that resume exactly (also with dropout, also on another rank count)."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from reference_train import lora
from reference_train.config import build_config
from reference_train.model import Llama, loss_fn

from .adapter_support import (
    COMMON,
    mlx_lm_fuses_ours,
    mlx_lm_generates_ours,
    our_adapted_model,
    prompt_ids,
    quantized_llama,
    train,
)
from .conftest import require
from .hf_support import (
    LLAMA3_CONFIG,
    QWEN2_CONFIG,
    mlx_lm_logits,
)
from .train_support import MLX_LAUNCH, run_trainer, train_losses

# ---------------------------------------------------------------- the layer and the names


def test_the_layer_is_mlx_lms_around_linear_and_quantized_linear():
    from mlx_lm.tuner.lora import LoRALinear as TheirLoRA

    mx.random.seed(1)
    base = nn.Linear(64, 48, bias=False)
    x = mx.random.normal((2, 3, 64))
    for linear in (base, nn.QuantizedLinear.from_linear(base, group_size=32, bits=4)):
        mx.random.seed(7)
        ours = lora.LoRALinear.from_base(linear, r=4, dropout=0.0, scale=2.5)
        mx.random.seed(7)
        theirs = TheirLoRA.from_base(linear, r=4, dropout=0.0, scale=2.5)
        assert ours.lora_a.shape == (64, 4) and ours.lora_b.shape == (4, 48)
        assert mx.array_equal(ours.lora_a, theirs.lora_a).item()
        b = mx.random.normal((4, 48))
        ours.lora_b, theirs.lora_b = b, b
        assert sorted(k for k, _ in tree_flatten(ours.parameters())) == \
            sorted(k for k, _ in tree_flatten(theirs.parameters()))
        assert mx.abs(ours(x) - theirs(x)).max().item() < 1e-5
        # base(x) + scale * x a b
        assert mx.allclose(ours(x), linear(x) + 2.5 * (x @ ours.lora_a) @ b, atol=1e-4).item()


@pytest.mark.parametrize(("layers", "keys", "family"),
                         [(-1, "", "llama"), (1, "self_attn.q_proj,mlp.down_proj", "llama"),
                          (-1, "", "qwen2")])
def test_adapter_names_and_shapes_are_mlx_lms(layers, keys, family):
    import importlib

    from mlx_lm.tuner.utils import linear_to_lora_layers

    from reference_train.hf_io import args_from_config

    config = {"llama": LLAMA3_CONFIG, "qwen2": QWEN2_CONFIG}[family]
    module = importlib.import_module(f"mlx_lm.models.{family}")
    theirs = module.Model(module.ModelArgs.from_dict(config))
    theirs.freeze()
    params = {"rank": 4, "scale": 20.0, "dropout": 0.0}
    linear_to_lora_layers(theirs, 2 if layers < 0 else layers,
                          {**params, **({"keys": keys.split(",")} if keys else {})})
    ours = lora.apply_lora(Llama(args_from_config(config)), layers, 4, 20.0, 0.0,
                           lora.parse_keys(keys))
    want = {k: v.shape for k, v in tree_flatten(theirs.trainable_parameters())}
    got = {lora.hf_adapter_name(k): v.shape for k, v in tree_flatten(ours.trainable_parameters())}
    assert got == want and len(got) == (14 * 2 if layers < 0 else 4)
    assert all(lora.ours_adapter_name(lora.hf_adapter_name(k)) == k
               for k, _ in tree_flatten(ours.trainable_parameters()))
    if keys:
        assert sorted(got)[0] == "model.layers.1.mlp.down_proj.lora_a"


def test_only_the_adapters_get_gradients_and_optimizer_state():
    from reference_train.hf_io import args_from_config

    mx.random.seed(0)
    model = lora.apply_lora(Llama(args_from_config(LLAMA3_CONFIG)), 1, 4, 20.0, 0.0,
                            ["self_attn.v_proj"])
    before = dict(tree_flatten(model.parameters()))
    opt = optim.AdamW(learning_rate=1e-2)
    opt.init(model.trainable_parameters())
    x = mx.array([[1, 2, 3, 4, 5]])
    for _ in range(2):
        _, grads = nn.value_and_grad(model, loss_fn)(model, x, x)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
    assert sorted(k for k, _ in tree_flatten(grads)) == \
        ["layers.1.attention.wv.lora_a", "layers.1.attention.wv.lora_b"]
    assert sorted(k for k, _ in tree_flatten(opt.state) if "." in k) == [
        "layers.1.attention.wv.lora_a.m", "layers.1.attention.wv.lora_a.v",
        "layers.1.attention.wv.lora_b.m", "layers.1.attention.wv.lora_b.v"]
    after = dict(tree_flatten(model.parameters()))
    changed = sorted(k for k in after if not mx.array_equal(after[k], before[k]).item())
    assert changed == ["layers.1.attention.wv.lora_a", "layers.1.attention.wv.lora_b"]


def test_config_fields_defaults_and_refusals(tmp_path):
    cfg = build_config(["--init_from", "somewhere", "--fine_tune", "lora"])
    assert (cfg.lora_rank, cfg.lora_scale, cfg.lora_dropout, cfg.lora_layers, cfg.lora_keys) == \
        (8, 20.0, 0.0, 16, "")  # mlx-lm's defaults (mlx_lm/lora.py CONFIG_DEFAULTS)
    from mlx_lm.lora import CONFIG_DEFAULTS

    assert CONFIG_DEFAULTS["lora_parameters"] == {"rank": 8, "dropout": 0.0, "scale": 20.0}
    assert CONFIG_DEFAULTS["num_layers"] == 16
    assert build_config([]).fine_tune == "full"
    listed = tmp_path / "lora.yaml"
    listed.write_text("fine_tune: lora\ninit_from: x\nlora_keys: [self_attn.q_proj, mlp.up_proj]\n")
    assert build_config(["--config", str(listed)]).lora_keys == "self_attn.q_proj,mlp.up_proj"
    for argv, says in [
        (["--fine_tune", "lora"], "fine_tune lora adapts a trained model: give --init_from"),
        (["--fine_tune", "qlora"], "fine_tune qlora: must be one of full, lora, dora"),
        (["--fine_tune", "dora"], "fine_tune dora adapts a trained model: give --init_from"),
        (["--lora_rank", "0"], "lora_rank 0: must be at least 1"),
        (["--lora_dropout", "1"], "lora_dropout 1.0: must be below 1"),
        (["--lora_layers", "0"], "lora_layers 0: give the number of last blocks"),
        (["--lora_layers", "-2"], "lora_layers -2: must be at least -1"),
        (["--lora_scale", "nan"], "lora_scale nan: must be a finite number"),
        (["--lora_keys", "self_attn.q_proj,wq"], "lora_keys wq: not a Llama block's linear"),
    ]:
        with pytest.raises(ValueError) as e:
            build_config(argv)
        assert says in str(e.value), (argv, str(e.value))


# ---------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def dropout_run(llama, llama_data, tmp_path_factory):
    """4 LoRA steps with dropout on 1 rank: straight, and stopped at 2 then resumed."""
    root = tmp_path_factory.mktemp("lora")
    straight = root / "straight"
    proc = train(llama, llama_data, straight, "--lora_dropout", "0.1")
    train(llama, llama_data, root / "split", "--lora_dropout", "0.1", "--stop_after", "2")
    resumed = train(llama, llama_data, root / "split", "--lora_dropout", "0.1", "--resume")
    return straight, root / "split", proc, resumed


def test_out_adapters_open_in_mlx_lm_with_our_logits(llama, dropout_run, tmp_path):
    from mlx_lm.utils import load

    straight, _, proc, _ = dropout_run
    adapters = straight / "adapters"
    assert f"adapters for mlx-lm: {adapters}" in proc.stdout
    assert "LoRA: rank 4, scale 20.0, dropout 0.1 on all blocks'" in proc.stdout
    assert not (straight / "model").exists()
    assert sorted(p.name for p in adapters.iterdir()) == ["adapter_config.json",
                                                          "adapters.safetensors"]
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == 2
    assert config["lora_parameters"] == {"rank": 4, "scale": 20.0, "dropout": 0.1,
                                         "keys": list(lora.KEYS)}
    # the checkpoint holds the adapters and their AdamW state, nothing of the frozen base
    ckpt = straight / "checkpoints" / "step_000004"
    saved = mx.load(str(ckpt / "model.safetensors"))
    assert len(saved) == 28 and all(k.endswith((".lora_a", ".lora_b")) for k in saved)
    state = mx.load(str(ckpt / "optimizer.safetensors"))
    assert sorted(k for k in state if "." in k) == sorted(f"{k}.{m}" for k in saved
                                                           for m in "mv")
    written = mx.load(str(adapters / "adapters.safetensors"))
    assert sorted(written) == sorted(lora.hf_adapter_name(k) for k in saved)
    assert "model.layers.0.self_attn.q_proj.lora_a" in written
    assert all(mx.array_equal(written[lora.hf_adapter_name(k)], v).item()
               for k, v in saved.items())
    assert mx.abs(saved["layers.0.attention.wq.lora_b"]).max().item() > 0  # it trained

    ids = prompt_ids(llama)
    ours = our_adapted_model(llama, adapters)(ids)
    model, _ = load(str(llama), adapter_path=str(adapters))
    assert mx.abs(model(ids) - ours).max().item() < 1e-4
    base = mlx_lm_logits(llama, ids)
    assert mx.abs(base - ours).max().item() > 1e-3  # the adapters change the model
    # mlx_lm generate --adapter-path and mlx_lm fuse, the real commands: our model's
    # greedy continuation, and the fused model computes our logits
    mlx_lm_generates_ours(llama, adapters, tmp_path)
    mlx_lm_fuses_ours(llama, adapters, tmp_path / "fused", ours, ids)


def test_resume_with_dropout_is_exact(dropout_run):
    straight, split, _, resumed = dropout_run
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    assert train_losses(split) == train_losses(straight)  # every loss, bit for bit
    assert sorted(train_losses(split)) == [1, 2, 3, 4]
    a = mx.load(str(straight / "adapters" / "adapters.safetensors"))
    b = mx.load(str(split / "adapters" / "adapters.safetensors"))
    assert sorted(a) == sorted(b)
    assert all(np.array_equal(np.array(a[k]), np.array(b[k])) for k in a)


def test_resume_on_two_ranks_with_a_sharded_optimizer(llama, llama_data, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    train(llama, llama_data, tmp_path / "straight")
    train(llama, llama_data, tmp_path / "mixed", "--stop_after", "2")
    proc = train(llama, llama_data, tmp_path / "mixed", "--resume", "auto", "--shard_optimizer",
                 "true", ranks=2)
    assert "at step 2" in proc.stdout and "optimizer state sharded" in proc.stdout
    straight, mixed = train_losses(tmp_path / "straight"), train_losses(tmp_path / "mixed")
    assert sorted(mixed) == [1, 2, 3, 4]
    for step, loss in straight.items():
        assert abs(mixed[step] - loss) < 1e-4, (step, straight, mixed)
    # another LoRA setting, or full fine-tuning, does not resume from these checkpoints
    out = run_trainer([*COMMON, "--init_from", str(llama), "--data", str(llama_data), "--out",
                       str(tmp_path / "mixed"), "--resume", "auto", "--lora_rank", "8",
                       "--steps", "5"])
    assert out.returncode == 2 and "resume with the checkpoint's --fine_tune and --lora_*" \
        in out.stderr, out.stderr[-2000:]
    # reference_train.export makes whole models: a LoRA checkpoint is refused, naming fuse
    from reference_train.export import main as export_main

    assert export_main([str(tmp_path / "mixed"), str(tmp_path / "exported")]) == 2
    assert not (tmp_path / "exported").exists()


def test_bfloat16_passes_train_float32_adapters(llama, llama_data, tmp_path):
    proc = train(llama, llama_data, tmp_path / "bf16", "--dtype", "bfloat16", "--steps", "2",
                 "--lora_keys", "self_attn.q_proj,self_attn.v_proj", "--lora_layers", "1",
                 "--compile", "false")  # compiled, bfloat16 kernels take 40 s to build here
    assert "compute bfloat16 on float32 master weights" in proc.stdout
    saved = mx.load(str(tmp_path / "bf16" / "adapters" / "adapters.safetensors"))
    assert sorted(saved) == [f"model.layers.1.self_attn.{p}_proj.lora_{x}"
                             for p in "qv" for x in "ab"]
    assert {v.dtype for v in saved.values()} == {mx.float32}
    config = json.loads((tmp_path / "bf16" / "adapters" / "adapter_config.json").read_text())
    assert config["num_layers"] == 1
    assert config["lora_parameters"]["keys"] == ["self_attn.q_proj", "self_attn.v_proj"]


def test_refusals(llama, llama_data, tmp_path):
    proc = run_trainer([*COMMON, "--init_from", str(llama), "--data", str(llama_data), "--out",
                        str(tmp_path / "run"), "--lora_layers", "3"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "lora_layers 3: the model has 2 blocks" in proc.stderr
    assert "--lora_layers 2 or -1" in proc.stderr



def test_qlora_trains_adapters_on_the_quantized_base(llama, llama_data, tmp_path):
    """QLoRA: a folder quantized by mlx-lm (4 bits) stays quantized and frozen; the
    adapters train in float32 and open in mlx-lm on that folder with our logits."""
    from mlx_lm.utils import load

    folder = quantized_llama(tmp_path / "q4", llama)
    out = tmp_path / "run"
    proc = train(folder, llama_data, out, "--steps", "2")
    assert "the base frozen and quantized" in proc.stdout
    saved = mx.load(str(out / "checkpoints" / "step_000002" / "model.safetensors"))
    assert len(saved) == 28 and {v.dtype for v in saved.values()} == {mx.float32}
    model = our_adapted_model(folder, out / "adapters")
    assert isinstance(model.layers[0].attention.wq.linear, nn.QuantizedLinear)
    ids = prompt_ids(llama)
    theirs, _ = load(str(folder), adapter_path=str(out / "adapters"))
    ours = model(ids)
    assert mx.abs(theirs(ids) - ours).max().item() < 1e-4
    # mlx_lm fuse --dequantize, the real command: the adapters merged into the
    # dequantized base compute our logits (without --dequantize fuse quantizes
    # the merged weights again, which changes every logit a little).
    fused = tmp_path / "fused"
    mlx_lm_fuses_ours(folder, out / "adapters", fused, ours, ids, "--dequantize")
    assert "quantization" not in json.loads((fused / "config.json").read_text())
    assert mx.abs(mlx_lm_logits(folder, ids) - ours).max().item() > 1e-6  # the adapters are in it
    # bfloat16 passes would need a bfloat16 copy of the quantized base: refused
    proc = run_trainer([*COMMON, "--init_from", str(folder), "--data", str(llama_data),
                        "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"])
    assert proc.returncode == 2 and "with a quantized base" in proc.stderr, proc.stderr[-2000:]
