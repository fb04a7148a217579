"""Hugging Face / mlx-lm Llama folders in (reference_train/hf_io.py), against real mlx-lm."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from reference_train.errors import DataError
from reference_train.hf_io import (
    args_from_config,
    config_from_args,
    hf_from_ours,
    load_folder,
    load_into,
    ours_from_hf,
)
from reference_train.model import Llama, ModelArgs
from reference_train.tokenizer import ByteTokenizer, byte_tokenizer_json

from .hf_support import LLAMA3_CONFIG, TIED_CONFIG, make_llama_folder, mlx_lm_logits


@pytest.fixture(scope="module")
def tokens():
    return mx.random.randint(0, 300, (2, 24), key=mx.random.key(7))


LINEAR_CONFIG = {**TIED_CONFIG, "rope_scaling": {"type": "linear", "factor": 4.0},
                 "tie_word_embeddings": False, "num_key_value_heads": 1}


@pytest.mark.parametrize("config,shard", [(LLAMA3_CONFIG, False), (TIED_CONFIG, True),
                                          (LINEAR_CONFIG, False)],
                         ids=["llama3-rope-gqa-untied", "tied-head_dim-sharded", "linear-rope-mqa"])
def test_our_logits_equal_mlx_lm_on_the_same_folder(tmp_path, tokens, config, shard):
    folder = make_llama_folder(tmp_path / "llama", config, shard=shard)
    if shard:
        assert len(list(folder.glob("model-*-of-*.safetensors"))) > 5
    args, weights, _ = load_folder(folder)
    model = Llama(args)
    load_into(model, weights, folder)
    ours = model(tokens)
    theirs = mlx_lm_logits(folder, tokens)
    assert ours.dtype == theirs.dtype == mx.float32
    diff = mx.abs(ours - theirs).max().item()
    assert diff < 1e-4, diff
    assert mx.abs(theirs).max().item() > 0.1  # not trivially zero


def test_config_maps_every_field_that_changes_the_math():
    args = args_from_config({**LLAMA3_CONFIG, "head_dim": 32, "rms_norm_eps": 1e-6})
    assert args == ModelArgs(vocab_size=320, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                             hidden_dim=96, norm_eps=1e-6, rope_theta=500000.0,
                             tie_embeddings=False, head_dim=32,
                             rope_scaling=LLAMA3_CONFIG["rope_scaling"])
    back = config_from_args(args, {"bos_token_id": 1, "quantization": {"bits": 4}})
    assert back["bos_token_id"] == 1 and "quantization" not in back
    assert args_from_config(back) == args
    # transformers 5 writes rope_theta and rope_scaling inside rope_parameters
    v5 = {k: v for k, v in LLAMA3_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA3_CONFIG["rope_scaling"]}
    assert args_from_config(v5) == args_from_config(LLAMA3_CONFIG)
    # mlx-lm omits tie_word_embeddings when tied: the weights decide
    untold = {k: v for k, v in TIED_CONFIG.items() if k != "tie_word_embeddings"}
    assert args_from_config(untold, tied=True).tie_embeddings
    assert not args_from_config(untold, tied=False).tie_embeddings


def test_every_parameter_name_maps_both_ways():
    for tie in (False, True):
        model = Llama(ModelArgs(vocab_size=10, dim=8, n_layers=2, n_heads=2, hidden_dim=16,
                                tie_embeddings=tie))
        for name, _ in tree_flatten(model.parameters()):
            assert ours_from_hf(hf_from_ours(name)) == name
    assert hf_from_ours("layers.1.feed_forward.w1.weight") == "model.layers.1.mlp.gate_proj.weight"
    assert ours_from_hf("model.layers.0.self_attn.rotary_emb.inv_freq") is None


def test_refused_folders_name_what_was_found_and_what_is_supported(tmp_path):
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    (gptq / "config.json").write_text(json.dumps(
        {**LLAMA3_CONFIG, "quantization_config": {"quant_method": "gptq", "bits": 4}}))
    with pytest.raises(DataError, match=r"the weights are quantized by another tool \(quant_method "
                                        r"gptq, bits 4\); supported: unquantized float32, "
                                        r"bfloat16 or float16 weights, or weights quantized by "
                                        r"mlx-lm \(mlx_lm.convert -q"):
        load_folder(gptq)
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text(json.dumps({**LLAMA3_CONFIG, "model_type": "gemma2"}))
    with pytest.raises(DataError, match="model_type 'gemma2' is not supported; supported: llama, "
                                        "mistral, qwen2, qwen3"):
        load_folder(gemma)
    biased = tmp_path / "biased"
    biased.mkdir()
    (biased / "config.json").write_text(json.dumps(
        {**LLAMA3_CONFIG, "attention_bias": True, "rope_scaling": {"type": "yarn", "factor": 2}}))
    with pytest.raises(DataError, match=r"attention_bias.*; rope_scaling of type 'yarn' "
                                        r"\(supported: default, linear, llama3\)"):
        load_folder(biased)
    with pytest.raises(DataError, match="no config.json there"):
        load_folder(tmp_path)


def test_wrong_shapes_name_the_weight(tmp_path):
    folder = make_llama_folder(tmp_path / "llama", LLAMA3_CONFIG)
    args, weights, _ = load_folder(folder)
    model = Llama(ModelArgs(**{**args.__dict__, "hidden_dim": 128}))
    with pytest.raises(DataError, match=r"model.layers.0.mlp.gate_proj.weight \(96, 64\) "
                                        r"\(config.json says \(128, 64\)\)"):
        load_into(model, weights, folder)


def test_byte_tokenizer_json_tokenizes_as_the_byte_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(byte_tokenizer_json()))
    text = "Once upon a time, Zoë saw a 🐸 <|endoftext|>"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == ByteTokenizer().encode(text[:-len(" <|endoftext|>")]) + [32, 256]
    assert tok.decode(ids[:-1]) == text[:-len("<|endoftext|>")]
    assert tok.get_vocab_size() == 257


def test_data_that_does_not_fit_the_model_names_both(tmp_path):
    from reference_train.hf_io import check_data_fits

    args = ModelArgs(vocab_size=256, dim=8, n_layers=1, n_heads=2, hidden_dim=16)
    meta = {"vocab_size": 300, "tokenizer": {"kind": "folder", "path": "/m/llama",
                                             "tokenizer_json_sha256": "ab" * 32}}
    with pytest.raises(DataError, match=r"the data /d has a vocabulary of 300 \(the tokenizer of "
                                        r"/m/llama \(tokenizer.json sha256 abababababab\)\), "
                                        r"larger than the model's 256"):
        check_data_fits(meta, Path("/d"), args, None)
    check_data_fits({**meta, "vocab_size": 256}, Path("/d"), args, None)
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError, match=rf"tokenized with the tokenizer of /m/llama .*, but the "
                                        rf"model {folder} uses {folder}/tokenizer.json"):
        check_data_fits({**meta, "vocab_size": 256}, Path("/d"), args, folder)


def test_checkpoints_written_before_head_dim_and_rope_scaling_still_match():
    from dataclasses import asdict

    from reference_train.model import args_match

    args = ModelArgs(vocab_size=257, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    old = {k: v for k, v in asdict(args).items() if k not in ("head_dim", "rope_scaling")}
    assert args_match(old, args)
    assert not args_match({**old, "dim": 64}, args)
    assert not args_match(old, ModelArgs(**{**asdict(args), "head_dim": 16}))


def test_prepare_tokenizer_dir_problems_exit_2(tmp_path, capsys):
    from reference_train import prepare

    (tmp_path / "empty").mkdir()
    assert prepare.main(["--out", str(tmp_path / "d"), "--tokenizer", str(tmp_path / "empty")]) == 2
    assert f"error: {tmp_path / 'empty'}: no tokenizer.json" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    assert prepare.main(["--out", str(tmp_path / "d"), "--tokenizer", str(tmp_path / "bad")]) == 2
    assert "is not a tokenizer.json tokenizers can read" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
