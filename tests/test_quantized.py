"""Folders quantized by mlx-lm (mlx_lm.utils.quantize_model, what mlx_lm.convert -q runs)
load as quantized layers (reference_train/hf_io.py): logits equal mlx-lm's, the base
stays quantized and frozen, a quantized model exports back, full fine-tuning is refused."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from reference_train.errors import DataError
from reference_train.hf_io import (
    export_folder,
    is_quantized,
    load_folder,
    model_from_folder,
    model_from_weights,
    quantization_of,
)

from .hf_support import LLAMA3_CONFIG, QWEN2_CONFIG, QWEN3_CONFIG, make_llama_folder, mlx_lm_logits

TOKENS = mx.random.randint(0, 300, (2, 12), key=mx.random.key(5))


def mixed(path: str, module) -> bool | dict:
    """A per-layer recipe: embeddings at 8 bits, one MLP layer left unquantized."""
    if path.endswith("embed_tokens"):
        return {"group_size": 32, "bits": 8, "mode": "affine"}
    return not path.endswith("layers.1.mlp.up_proj")


CASES = {
    # 4 bits in groups of 32: every Linear and the embedding (untied head too)
    "llama-4bit": (LLAMA3_CONFIG, {"group_size": 32, "bits": 4}),
    # groups of 64: down_proj (96 inputs) cannot be, mlx-lm leaves it float
    "qwen3-8bit-g64": (QWEN3_CONFIG, {"group_size": 64, "bits": 8}),
    # per-layer overrides in config.json; tied embeddings used as the head; q/k/v biases
    "qwen2-mixed": (QWEN2_CONFIG, {"group_size": 32, "bits": 4, "quant_predicate": mixed}),
}


@pytest.fixture(scope="module", params=list(CASES))
def quantized(request, tmp_path_factory):
    config, options = CASES[request.param]
    folder = make_llama_folder(tmp_path_factory.mktemp("q") / request.param, config,
                               quantize=options)
    return request.param, folder


def test_our_logits_equal_mlx_lm_on_a_quantized_folder(quantized):
    case, folder = quantized
    args, weights, config = load_folder(folder)
    assert quantization_of(config)["bits"] in (4, 8)
    model = model_from_weights(args, weights, config, folder)
    assert is_quantized(model)
    layers = dict(model.named_modules())
    attention = layers["layers.0.attention.wq"]
    assert isinstance(attention, nn.QuantizedLinear) and attention.weight.dtype == mx.uint32
    assert isinstance(layers["tok_embeddings"], nn.QuantizedEmbedding)
    if case == "qwen3-8bit-g64":
        assert type(layers["layers.0.feed_forward.w2"]) is nn.Linear  # 96 inputs
        assert attention.bits == 8 and attention.group_size == 64
    if case == "qwen2-mixed":
        assert layers["tok_embeddings"].bits == 8 and attention.bits == 4
        assert type(layers["layers.1.feed_forward.w3"]) is nn.Linear
        assert type(layers["layers.0.feed_forward.w3"]) is nn.QuantizedLinear
        assert attention.bias.dtype == mx.float32  # q/k/v biases beside the quantized weight
    ours = model(TOKENS)
    theirs = mlx_lm_logits(folder, TOKENS)
    assert ours.dtype == theirs.dtype == mx.float32
    assert mx.abs(theirs).max().item() > 0.1
    assert mx.abs(ours - theirs).max().item() < 1e-4
    # the frozen base: a quantized layer's packed weight, scales and biases do not train
    trainable = [n for n, _ in tree_flatten(model.trainable_parameters())]
    assert not any(n.endswith((".scales", ".biases")) for n in trainable)
    assert not {"layers.0.attention.wq.weight", "tok_embeddings.weight"} & set(trainable)
    assert "norm.weight" in trainable


def test_a_quantized_model_exports_as_mlx_lm_reloads_it(quantized, tmp_path):
    """What a LoRA run ending on a quantized base needs: its (fused) weights written back
    quantized, with the folder's quantization."""
    _, folder = quantized
    args, weights, config = load_folder(folder)
    model = model_from_weights(args, weights, config, folder)
    params = dict(tree_flatten(model.parameters()))
    with pytest.raises(DataError, match="is quantized .* but no quantization was given"):
        export_folder(params, args, tmp_path / "bare", None)
    out = export_folder(params, args, tmp_path / "out", None, base_config=config,
                        quantization=quantization_of(config))
    written = json.loads((out / "config.json").read_text())
    assert written["quantization"] == config["quantization"]
    assert mx.load(str(out / "model.safetensors"))[
        "model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    diff = mx.abs(mlx_lm_logits(out, TOKENS) - model(TOKENS)).max().item()
    assert diff < 1e-4


def test_full_fine_tuning_a_quantized_folder_is_refused(quantized, tmp_path):
    _, folder = quantized
    with pytest.raises(DataError) as e:
        model_from_folder(folder, {}, tmp_path)  # before the data is looked at
    said = str(e.value)
    assert f"--init_from {folder}: the weights are quantized (" in said
    assert "full fine-tuning trains every weight in float32" in said
    assert "--fine_tune lora" in said and "mlx_lm.convert" in said


def test_lora_gets_the_quantized_model(quantized, tmp_path):
    _, folder = quantized
    from reference_train.tokenizer import byte_tokenizer_json

    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    meta = {"vocab_size": 257, "tokenizer": {"kind": "folder", "path": str(folder),
                                             "tokenizer_json_sha256": "x"}}
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    model = model_from_folder(folder, meta, tmp_path, fine_tune="lora")
    assert is_quantized(model)
    assert mx.abs(model(TOKENS) - mlx_lm_logits(folder, TOKENS)).max().item() < 1e-4


def test_other_quantizations_are_refused(tmp_path):
    folder = make_llama_folder(tmp_path / "q", LLAMA3_CONFIG, quantize=True)
    config = json.loads((folder / "config.json").read_text())
    for change, said in [({"quantization": {"bits": 4, "group_size": 32, "mode": "int3x"}},
                          r"quantized in mode \['int3x'\]; supported: unquantized .* modes "
                          r"affine, mxfp4, nvfp4, mxfp8"),
                         ({"quantize_activations": True}, "quantize_activations true")]:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(DataError, match=said):
            load_folder(folder)
    (folder / "config.json").write_text(json.dumps(
        {k: v for k, v in config.items() if not k.startswith("quantization")}))
    with pytest.raises(DataError, match=r"\.(weight|scales|biases) is \S+ \(quantized weights\) "
                                        r"but config.json has no quantization"):
        load_folder(folder)
