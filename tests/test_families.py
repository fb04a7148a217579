"""The dense families besides Llama (reference_train/hf_io.py FAMILIES): Mistral, Qwen2
(q/k/v biases) and Qwen3 (q/k norms), each built with mlx-lm's own class; our logits
equal mlx-lm's, and what we export mlx-lm reloads as the same model of the same family."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from reference_train.errors import DataError
from reference_train.hf_io import (
    args_from_config,
    config_from_args,
    export_folder,
    hf_from_ours,
    load_folder,
    model_from_weights,
    ours_from_hf,
    read_config,
)
from reference_train.model import Llama, ModelArgs

from .hf_support import (
    LLAMA3_CONFIG,
    MISTRAL_CONFIG,
    QWEN2_CONFIG,
    QWEN3_CONFIG,
    make_llama_folder,
    mlx_lm_logits,
)

TOKENS = mx.random.randint(0, 300, (2, 12), key=mx.random.key(3))
FAMILY_CONFIGS = {"mistral": MISTRAL_CONFIG, "qwen2": QWEN2_CONFIG, "qwen3": QWEN3_CONFIG}


def max_diff(a: mx.array, b: mx.array) -> float:
    assert a.dtype == b.dtype == mx.float32
    assert mx.abs(b).max().item() > 0.1  # not trivially zero
    return mx.abs(a - b).max().item()


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_our_logits_equal_mlx_lm_and_our_export_reloads(tmp_path, family):
    folder = make_llama_folder(tmp_path / family, FAMILY_CONFIGS[family])
    args, weights, config = load_folder(folder)
    assert (args.model_type, args.qkv_bias, args.qk_norm) == {
        "mistral": ("mistral", False, False), "qwen2": ("qwen2", True, False),
        "qwen3": ("qwen3", False, True)}[family]
    model = model_from_weights(args, weights, config, folder)
    ours = model(TOKENS)
    assert max_diff(ours, mlx_lm_logits(folder, TOKENS)) < 1e-4
    # exported with and without the config it started from: mlx-lm opens the same family
    for base in (config, None):
        out = export_folder(dict(tree_flatten(model.parameters())), args,
                            tmp_path / f"out-{base is None}", None, base_config=base)
        written = json.loads((out / "config.json").read_text())
        assert written["model_type"] == family
        assert "quantization" not in written
        assert max_diff(ours, mlx_lm_logits(out, TOKENS)) < 1e-4


def test_family_parameters_and_names():
    qwen3 = Llama(args_from_config(QWEN3_CONFIG, tied=False))
    names = [n for n, _ in tree_flatten(qwen3.parameters())]
    assert "layers.0.attention.q_norm.weight" in names and not any(n.endswith(".bias") for n in names)
    assert qwen3.layers[0].attention.q_norm.weight.shape == (32,)  # over head_dim
    qwen2 = Llama(args_from_config(QWEN2_CONFIG))
    names = [n for n, _ in tree_flatten(qwen2.parameters())]
    assert sorted(n for n in names if n.startswith("layers.0.") and n.endswith(".bias")) == [
        "layers.0.attention.wk.bias", "layers.0.attention.wq.bias", "layers.0.attention.wv.bias"]
    assert "output.weight" not in names  # tied
    for name in names:
        assert ours_from_hf(hf_from_ours(name)) == name
    assert hf_from_ours("layers.1.attention.k_norm.weight") == "model.layers.1.self_attn.k_norm.weight"
    # qwen2 ignores head_dim as mlx-lm does (hidden / heads); config.json round-trips
    assert args_from_config(QWEN2_CONFIG).head_dim is None
    for config in (QWEN2_CONFIG, QWEN3_CONFIG, MISTRAL_CONFIG):
        args = args_from_config(config)
        assert args_from_config(config_from_args(args, config)) == args
    with pytest.raises(DataError, match="model_type 'qwen2' with qkv_bias False"):
        config_from_args(ModelArgs(dim=8, n_heads=2, model_type="qwen2"))


def test_other_families_and_settings_are_refused_naming_both(tmp_path):
    def refused(config):
        folder = tmp_path / "f"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(DataError) as e:
            read_config(folder)
        return str(e.value)

    for kind in ("qwen3_moe", "gemma2", "mixtral"):
        assert (f"model_type {kind!r} is not supported; supported: llama, mistral, qwen2, "
                f"qwen3 (dense models)") in refused({**QWEN3_CONFIG, "model_type": kind})
    assert "attention_bias true (supported for qwen3: no biases" in refused(
        {**QWEN3_CONFIG, "attention_bias": True})
    assert "no head_dim" in refused({k: v for k, v in QWEN3_CONFIG.items() if k != "head_dim"})
    assert "use_sliding_window true (supported: full attention" in refused(
        {**QWEN2_CONFIG, "use_sliding_window": True})
    assert "head_dim 32 (supported for qwen2: hidden_size / num_attention_heads" in refused(
        {**QWEN2_CONFIG, "head_dim": 32})
    assert "attention_bias/mlp_bias true (supported for mistral: no biases" in refused(
        {**MISTRAL_CONFIG, "mlp_bias": True})
    assert read_config(make_llama_folder(tmp_path / "llama", LLAMA3_CONFIG))["model_type"] == "llama"


def test_a_run_from_a_qwen3_folder_ends_with_a_qwen3_mlx_lm_opens(tmp_path):
    """The trainer through: --init_from a Qwen3 folder, one step at a negligible learning
    rate, OUT/model is a qwen3 folder whose logits are the starting folder's."""
    from reference_train import prepare
    from reference_train.tokenizer import FolderTokenizer

    from .hf_support import train_tokenizer
    from .train_support import run_trainer

    folder = make_llama_folder(tmp_path / "qwen3", QWEN3_CONFIG, tokenizer=train_tokenizer())
    data = tmp_path / "data"
    assert prepare.main(["--out", str(data), "--tokenizer", str(folder), "--stories", "60"]) == 0
    out = tmp_path / "run"
    proc = run_trainer(["--config", "tiny", "--block_size", "32", "--eval_every", "0",
                        "--sample_tokens", "0", "--steps", "1", "--lr", "1e-12", "--min_lr", "0",
                        "--warmup_steps", "0", "--init_from", str(folder), "--data", str(data),
                        "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "qwen3"
    tokens = mx.array([FolderTokenizer(folder).encode("Once upon a time")])
    assert max_diff(mlx_lm_logits(out / "model", tokens), mlx_lm_logits(folder, tokens)) < 1e-4
