"""Hugging Face / mlx-lm model folders: read one to start from, write one mlx-lm opens.

The dense families people fine-tune, all one model (reference_train/model.py):
Llama and Mistral (`model_type` "llama", "mistral"), Qwen2 ("qwen2": biases on
q/k/v) and Qwen3 ("qwen3": RMSNorm on each head of q and k). Unquantized, or
quantized by mlx-lm (`mlx_lm.convert -q`: `quantization` in config.json, packed
weights with `.scales` and `.biases`), which load as nn.QuantizedLinear /
nn.QuantizedEmbedding layers: a frozen base for LoRA, never fully fine-tuned.

A folder (what `huggingface-cli download` or `mlx_lm.convert` leaves, and what
`export_folder` writes):

    DIR/config.json                    {"model_type": "llama", "hidden_size": 2048,
                                        "num_hidden_layers": 16, "num_attention_heads": 32,
                                        "num_key_value_heads": 8, "head_dim": 64,
                                        "intermediate_size": 8192, "rms_norm_eps": 1e-05,
                                        "rope_theta": 500000.0, "rope_scaling": {"rope_type":
                                        "llama3", "factor": 32.0, ...},
                                        "tie_word_embeddings": true, "vocab_size": 128256, ...}
    DIR/model.safetensors              the weights, Hugging Face names; or shards
    DIR/model-00001-of-00002.safetensors   listed in model.safetensors.index.json
    DIR/model.safetensors.index.json   {"metadata": {...}, "weight_map": {name: file}}
    DIR/tokenizer.json                 (+ tokenizer_config.json, special_tokens_map.json)

Names, theirs <-> ours (reference_train/model.py keeps its own):

    model.embed_tokens.weight                      tok_embeddings.weight
    model.layers.N.self_attn.{q,k,v,o}_proj.weight layers.N.attention.{wq,wk,wv,wo}.weight
    model.layers.N.mlp.{gate,down,up}_proj.weight  layers.N.feed_forward.{w1,w2,w3}.weight
    model.layers.N.input_layernorm.weight          layers.N.attention_norm.weight
    model.layers.N.post_attention_layernorm.weight layers.N.ffn_norm.weight
    model.layers.N.self_attn.{q,k,v}_proj.bias     layers.N.attention.{wq,wk,wv}.bias (Qwen2)
    model.layers.N.self_attn.{q,k}_norm.weight     layers.N.attention.{q,k}_norm.weight (Qwen3)
    model.norm.weight                              norm.weight
    lm_head.weight                                 output.weight (absent when tied)
    X.scales, X.biases (quantized folders)         the same module's .scales, .biases

Both use RoPE on halves (not interleaved), so q and k need no permutation.
`--init_from DIR` is one call, `model_from_folder`: the folder read and checked,
the data checked against its tokenizer and vocabulary, the weights loaded. The
folder's tokenizer itself (read, copied into an exported model) is tokenizer.py's.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .choices import EXPORT_DTYPES
from .errors import DataError
from .files import file_sha256, replace_dir
from .model import Llama
from .shape import ModelArgs
from .stages import INDEX, index_map
from .tokenizer import copy_tokenizer, same_tokenizer

# model_type: the model's switches for that family (ModelArgs fields), and mlx-lm's
# default rope_theta when config.json has none.
FAMILIES = {
    "llama": {"qkv_bias": False, "qk_norm": False, "rope_theta": 10000.0},
    "mistral": {"qkv_bias": False, "qk_norm": False, "rope_theta": 10000.0},
    "qwen2": {"qkv_bias": True, "qk_norm": False, "rope_theta": 1000000.0},
    "qwen3": {"qkv_bias": False, "qk_norm": True, "rope_theta": 1000000.0},
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
# mx.quantize's modes, as mlx-lm writes them in config.json's "quantization".
QUANT_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
SUPPORTED_ROPE = ("default", "linear", "llama3")

# (their pattern, our pattern), per layer with {n}.
_LAYER_NAMES = [
    ("self_attn.q_proj", "attention.wq"), ("self_attn.k_proj", "attention.wk"),
    ("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
    ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"),
    ("mlp.up_proj", "feed_forward.w3"), ("input_layernorm", "attention_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_norm", "attention.q_norm"), ("self_attn.k_norm", "attention.k_norm"),
]
_TOP_NAMES = [("model.embed_tokens", "tok_embeddings"), ("model.norm", "norm"),
              ("lm_head", "output")]
# Weights Hugging Face checkpoints may carry that hold no parameter (precomputed RoPE).
_IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")


# ---------------------------------------------------------------- names


def ours_from_hf(name: str) -> str | None:
    """Our parameter name for a Hugging Face one, or None when it is not one of our model's."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias|scales|biases)", name)
    if m:
        for theirs, ours in _LAYER_NAMES:
            if m.group(2) == theirs:
                return f"layers.{m.group(1)}.{ours}.{m.group(3)}"
        return None
    for theirs, ours in _TOP_NAMES:
        if name.startswith(theirs + "."):
            return ours + name[len(theirs):]
    return None


def hf_from_ours(name: str) -> str:
    """The Hugging Face / mlx-lm name of one of our parameters (or modules)."""
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias|scales|biases)", name)
    if m:
        for theirs, ours in _LAYER_NAMES:
            if m.group(2) == ours:
                return f"model.layers.{m.group(1)}.{theirs}.{m.group(3)}"
    for theirs, ours in _TOP_NAMES:
        if name.startswith(ours + "."):
            return theirs + name[len(ours):]
    raise ValueError(f"no Hugging Face name for parameter {name!r}")


# ---------------------------------------------------------------- config


def read_config(folder: str | Path) -> dict:
    """config.json of a model folder, checked: a DataError names what was found and what
    is supported (another model type, a quantization we do not read, features our
    model lacks)."""
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise DataError(f"--init_from {folder}: not a directory",
                        "give a local Hugging Face / mlx-lm model folder (config.json, "
                        "model.safetensors, tokenizer.json)")
    if not path.is_file():
        raise DataError(f"--init_from {folder}: no config.json there",
                        "give a local Hugging Face / mlx-lm model folder (config.json, "
                        "model.safetensors, tokenizer.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(config, dict):
        raise DataError(f"{path}: expected a JSON object")
    family = config.get("model_type")
    if family not in SUPPORTED_MODEL_TYPES:
        raise DataError(f"{path}: model_type {family!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)} (dense models)",
                        "start from a Llama, Mistral, Qwen2 or Qwen3 checkpoint")
    quant_problem = quantization_problem(config)
    if quant_problem:
        raise DataError(f"{path}: {quant_problem}",
                        f"start from the original checkpoint, or convert it with mlx-lm: "
                        f"mlx_lm.convert --hf-path ORIGINAL --mlx-path {folder}-mlx -q")
    problems = []
    if family in ("llama", "mistral") and (config.get("attention_bias") or config.get("mlp_bias")):
        problems.append(f"attention_bias/mlp_bias true (supported for {family}: no biases; "
                        "q/k/v biases are Qwen2's)")
    if family == "qwen3" and config.get("attention_bias"):
        problems.append("attention_bias true (supported for qwen3: no biases, as mlx-lm's qwen3)")
    heads = config.get("num_attention_heads")
    if (family == "qwen2" and config.get("head_dim") and isinstance(heads, int) and heads
            and config["head_dim"] != config.get("hidden_size", 0) // heads):
        problems.append(f"head_dim {config['head_dim']} (supported for qwen2: hidden_size / "
                        "num_attention_heads, which mlx-lm's qwen2 uses)")
    if config.get("use_sliding_window"):
        problems.append("use_sliding_window true (supported: full attention in every layer)")
    if config.get("rope_traditional"):
        problems.append("rope_traditional true (supported: false, Hugging Face's layout)")
    scaling = rope_scaling_of(config)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind not in SUPPORTED_ROPE:
        problems.append(f"rope_scaling of type {kind!r} (supported: {', '.join(SUPPORTED_ROPE)})")
    if any(t != "full_attention" for t in config.get("layer_types") or []):
        problems.append("sliding-window layers (supported: full attention in every layer)")
    required = ["hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "vocab_size"] + (["head_dim"] if family == "qwen3" else [])
    missing = [k for k in required if k not in config]
    if missing:
        problems.append(f"no {', '.join(missing)}")
    if problems:
        raise DataError(f"{path}: {'; '.join(problems)}",
                        f"start from a plain {family} checkpoint")
    return config


def describe_quantization(quant) -> str:
    if isinstance(quant, dict):
        parts = [f"{k} {quant[k]}" for k in ("quant_method", "mode", "bits", "group_size")
                 if k in quant]
        layers = sum(1 for v in quant.values() if isinstance(v, (dict, bool)))
        if layers:
            parts.append(f"{layers} per-layer settings")
        return ", ".join(parts) or "quantization set"
    return str(quant)


def quantization_of(config: dict) -> dict | None:
    """config.json's mlx-lm quantization ({"group_size", "bits", "mode"?, and per-layer
    settings under Hugging Face module names}), or None when the weights are not quantized."""
    return config.get("quantization") or None


def quantization_problem(config: dict) -> str | None:
    """What we cannot read in a folder's quantization (None: unquantized, or mlx-lm's own)."""
    supported = ("supported: unquantized float32, bfloat16 or float16 weights, or weights "
                 "quantized by mlx-lm (mlx_lm.convert -q: modes " + ", ".join(QUANT_MODES) + ")")
    quant = config.get("quantization")
    legacy = config.get("quantization_config")
    if not quant:
        if legacy:
            return (f"the weights are quantized by another tool "
                    f"({describe_quantization(legacy)}); {supported}")
        return None
    if not isinstance(quant, dict) or not {"bits", "group_size"} <= set(quant):
        return f"quantization {quant!r} has no bits and group_size; {supported}"
    modes = {quant.get("mode", "affine")} | {v.get("mode", "affine") for v in quant.values()
                                            if isinstance(v, dict)}
    if modes - set(QUANT_MODES):
        return f"the weights are quantized in mode {sorted(modes - set(QUANT_MODES))}; {supported}"
    if config.get("quantize_activations"):
        return f"quantize_activations true (activations quantized too); {supported}"
    return None


def rope_scaling_of(config: dict) -> dict | None:
    """rope_scaling as mlx-lm reads it; transformers 5 writes it in rope_parameters."""
    scaling = config.get("rope_scaling")
    if scaling is None and isinstance(config.get("rope_parameters"), dict):
        params = {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
        scaling = params if (params.get("rope_type") or "default") != "default" else None
    if scaling and (scaling.get("rope_type") or scaling.get("type")) == "default":
        return None
    return scaling


def args_from_config(config: dict, tied: bool | None = None) -> ModelArgs:
    """ModelArgs from a (checked) Hugging Face config of one of FAMILIES.

    `tied`: whether the checkpoint has no lm_head (used when the config does not say;
    Hugging Face's default is untied, mlx-lm's tied, so the weights decide).
    """
    family = config.get("model_type", "llama")
    switches = FAMILIES[family]
    theta = config.get("rope_theta")
    if theta is None:
        theta = (config.get("rope_parameters") or {}).get("rope_theta", switches["rope_theta"])
    tie = config.get("tie_word_embeddings")
    if tie is None:
        tie = bool(tied)
    kv = config.get("num_key_value_heads")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") if family != "qwen2" else None  # qwen2: always the default
    if head_dim == config["hidden_size"] // heads:
        head_dim = None  # the default: keep model_args as a from-scratch model writes them
    try:
        return ModelArgs(vocab_size=config["vocab_size"], dim=config["hidden_size"],
                         n_layers=config["num_hidden_layers"], n_heads=heads,
                         n_kv_heads=None if kv in (None, heads) else kv,
                         hidden_dim=config["intermediate_size"],
                         norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
                         tie_embeddings=bool(tie), head_dim=head_dim,
                         rope_scaling=rope_scaling_of(config), qkv_bias=switches["qkv_bias"],
                         qk_norm=switches["qk_norm"], model_type=family)
    except (TypeError, ValueError) as e:
        raise DataError(f"config.json does not describe a model we can build: {e}") from None


def config_from_args(args: ModelArgs, base: dict | None = None,
                     quantization: dict | None = None) -> dict:
    """A Hugging Face / mlx-lm config.json for `args`, of its family (args.model_type);
    `base` (the config a run started from) keeps its other keys (token ids,
    max_position_embeddings...); `quantization` (mlx-lm's, when the weights written
    are quantized) is written as mlx-lm writes it."""
    family = args.model_type
    if family not in FAMILIES or FAMILIES[family]["qkv_bias"] != args.qkv_bias \
            or FAMILIES[family]["qk_norm"] != args.qk_norm:
        raise DataError(f"model_type {family!r} with qkv_bias {args.qkv_bias}, qk_norm "
                        f"{args.qk_norm} is none of the families mlx-lm opens "
                        f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    config = {k: v for k, v in (base or {}).items()
              if k not in ("quantization", "quantization_config", "rope_parameters",
                           "_name_or_path", "dtype", "attention_bias", "mlp_bias",
                           "rope_traditional")}
    if family in ("llama", "mistral"):
        config.update({"rope_traditional": False, "attention_bias": False, "mlp_bias": False})
    if family == "qwen3":
        config["attention_bias"] = False
    # mlx-lm's qwen3 requires it; with the RoPE we support it changes nothing.
    config.setdefault("max_position_embeddings", 32768)
    if quantization:
        config["quantization"] = config["quantization_config"] = quantization
    config.update({
        "model_type": family, "architectures": [ARCHITECTURES[family]],
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "head_dim": args.head_dim or args.dim // args.n_heads,
        "intermediate_size": args.hidden_dim, "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta, "rope_scaling": args.rope_scaling,
        "tie_word_embeddings": args.tie_embeddings, "vocab_size": args.vocab_size,
    })
    return dict(sorted(config.items()))


# ---------------------------------------------------------------- weights in (--init_from)


def weight_files(folder: Path, wanted: Callable[[str], bool] | None = None) -> list[Path]:
    """The safetensors files of a folder: those its index lists, else model*.safetensors.
    `wanted` (a predicate on the tensors' names, a pipeline stage's: stages.stage_tensor):
    only the index's files holding a tensor it wants; the others may be absent (a pipeline
    host's copy holds its stage's files only), one it needs may not."""
    index = folder / INDEX
    weight_map = index_map(folder)
    if weight_map is not None:
        names: dict[str, list[str]] = {f: [] for f in weight_map.values()}
        for name, f in weight_map.items():
            names[f].append(name)
        if wanted is not None:
            names = {f: held for f, held in names.items() if any(map(wanted, held))}
        files = [folder / f for f in sorted(names)]
        absent = [f.name for f in files if not f.is_file()]
        if absent and wanted is not None:
            held = [n for f in absent for n in names[f] if wanted(n)]
            raise DataError(f"{index} puts tensors this stage holds ({', '.join(held[:3])}"
                            + (f" and {len(held) - 3} more" if len(held) > 3 else "")
                            + f") in {', '.join(absent)}, not in {folder}",
                            "copy the folder whole to this host, or let `mlxcluster train` send "
                            "each host its stage's files")
        if absent:
            raise DataError(f"{index} lists {', '.join(absent)}, not in {folder}",
                            "download every shard of the checkpoint")
        return files
    files = sorted(Path(p) for p in glob.glob(str(folder / "model*.safetensors")))
    if not files:
        raise DataError(f"{folder}: no model.safetensors (nor model.safetensors.index.json)",
                        "give a folder with safetensors weights (a .bin/.pth checkpoint: "
                        "convert it with mlx_lm.convert first)")
    return files


def indexed_names(folder: Path) -> set[str] | None:
    """Every weight's name in the folder's index, ours (None without an index)."""
    weight_map = index_map(folder)
    if weight_map is None:
        return None
    return {ours for name in weight_map if (ours := ours_from_hf(name)) is not None}


def load_folder(folder: str | Path, wanted: Callable[[str], bool] | None = None
                ) -> tuple[ModelArgs, dict[str, mx.array], dict]:
    """(model args, weights under our names, config.json) of a model folder. The weights
    are float32; in a quantized folder, the quantized layers' packed weights stay as
    they are (uint32) beside their float32 `.scales` and `.biases`. `wanted`
    (weight_files): only the files holding a tensor it wants are opened, the weights
    then those files' (whether the head is tied then read from the index's names)."""
    folder = Path(folder)
    config = read_config(folder)
    weights: dict[str, mx.array] = {}
    for f in weight_files(folder, wanted):
        try:
            loaded = mx.load(str(f))
        except (OSError, RuntimeError, ValueError) as e:
            raise DataError(f"{f} cannot be read as safetensors: {e}") from None
        for name, w in loaded.items():
            if (held := as_held(f, name, w, config)) is not None:
                weights[held[0]] = held[1]
    every = (indexed_names(folder) if wanted is not None else None) or set(weights)
    args = args_from_config(config, tied="output.weight" not in every)
    if args.tie_embeddings:
        weights.pop("output.weight", None)  # as mlx-lm does with a tied lm_head
    return args, weights, config


def as_held(f: Path, name: str, w: mx.array, config: dict) -> tuple[str, mx.array] | None:
    """Tensor `name` of file `f` as the trainer holds it: (our name, the array), or None
    for one that holds no parameter (precomputed RoPE); a DataError for quantized
    weights in a folder whose config.json does not say so, or a name not of our model.
    Lazy: what mx.load returned, cast, is read from disk only when evaluated."""
    if _IGNORED.match(name):
        return None
    packed = not mx.issubdtype(w.dtype, mx.floating)
    if (name.endswith((".scales", ".biases")) or packed) and quantization_of(config) is None:
        raise DataError(f"{f}: {name} is {w.dtype} (quantized weights) but config.json "
                        "has no quantization; supported: unquantized float32, "
                        "bfloat16 or float16 weights, or mlx-lm's quantized folders",
                        "use the original (unquantized) checkpoint")
    ours = ours_from_hf(name)
    if ours is None:
        raise DataError(f"{f}: weight {name!r} is not part of a "
                        f"{config['model_type']} model as we build it",
                        f"start from a plain {config['model_type']} checkpoint")
    # the master weights train in float32; packed quantized weights stay packed
    return ours, (w if packed else w.astype(mx.float32))


def load_into(model, weights: dict[str, mx.array], source: str | Path) -> None:
    """Set `model`'s parameters from `weights` (our names); a DataError names what
    is missing, extra or of another shape."""
    want = dict(tree_flatten(model.parameters()))
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    shapes = [f"{hf_from_ours(k)} {tuple(weights[k].shape)} (config.json says "
              f"{tuple(want[k].shape)})" for k in sorted(set(want) & set(weights))
              if weights[k].shape != want[k].shape]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(hf_from_ours(k) for k in missing[:5])}"
                        + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if extra:
        problems.append(f"unexpected {', '.join(hf_from_ours(k) for k in extra[:5])}")
    if shapes:
        problems.append("shapes differ: " + "; ".join(shapes[:5]))
    if problems:
        raise DataError(f"{source}: the weights do not fit its config.json: "
                        + "; ".join(problems))
    model.load_weights(list(weights.items()), strict=True)


def quantize_like(model: nn.Module, config: dict, weights: dict[str, mx.array],
                  names: set[str] | None = None) -> None:
    """Turn `model`'s Linear / Embedding layers into quantized ones where the folder's
    are, as mlx_lm.utils.load_model does: a per-layer setting of config.json's
    `quantization` (False, or {"bits", "group_size", "mode"}) decides for its layer;
    otherwise a layer whose `.scales` the folder holds is quantized, with the bits,
    group size and mode its packed weight and scales imply. `names`: every weight's
    name in the folder (indexed_names), when `weights` holds one pipeline stage's
    only: another stage's layer with `.scales` is quantized as config.json says (its
    arrays are not here to say more; it is never evaluated, but quantizing it keeps
    mlx's random draws one process's: each quantized layer draws a weight first)."""
    quant = quantization_of(config) or {}
    names = set(weights) if names is None else names | set(weights)

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized"):  # norms, RoPE
            return False
        theirs = hf_from_ours(path + ".weight")[:-len(".weight")]
        if theirs in quant:
            return quant[theirs]
        if f"{path}.scales" not in names:
            return False
        if f"{path}.scales" not in weights:  # another stage's layer
            return {"group_size": quant.get("group_size"), "bits": quant.get("bits"),
                    "mode": quant.get("mode", "affine")}
        return _packed_as(path, module, weights)

    nn.quantize(model, group_size=quant.get("group_size"), bits=quant.get("bits"),
                mode=quant.get("mode", "affine"), class_predicate=predicate)


def _packed_as(path: str, module: nn.Module, weights: dict[str, mx.array]) -> dict:
    """The bits, group size and mode a saved layer was packed with (mlx-lm's
    infer_quant_config): only affine keeps its scales in a float dtype."""
    in_dims = module.weight.shape[-1]
    scales = weights[f"{path}.scales"]
    group_size = in_dims // scales.shape[-1]
    bits = weights[f"{path}.weight"].shape[-1] * 32 // in_dims
    if mx.issubdtype(scales.dtype, mx.floating):
        return {"group_size": group_size, "bits": bits, "mode": "affine"}
    modes = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}
    if (bits, group_size) not in modes:
        raise DataError(f"{hf_from_ours(path + '.weight')}: {bits} bits in groups of "
                        f"{group_size} with integer scales is no mode we know "
                        f"({', '.join(QUANT_MODES)})")
    return {"group_size": group_size, "bits": bits, "mode": modes[bits, group_size]}


def model_from_weights(args: ModelArgs, weights: dict[str, mx.array], config: dict,
                       source: str | Path) -> Llama:
    """Our model with `args`, quantized as the folder (`config`) is, holding `weights`."""
    model = Llama(args)
    if quantization_of(config) is not None:
        quantize_like(model, config, weights)
    load_into(model, weights, source)
    return model


def model_from_folder(folder: str | Path, meta: dict, data_dir: Path,
                      fine_tune: str = "full") -> Llama:
    """--init_from: our model with a folder's shape and weights, once the data (`meta`
    of `data_dir`) is known to fit it: tokenized with the folder's tokenizer, within
    its vocabulary. The caller seeds mlx's random state first: the model is built as
    a fresh one is (same draws on every rank), then overwritten.

    Unquantized: float32 weights, every one trainable. Quantized (mlx-lm's
    `quantization` in config.json): nn.QuantizedLinear / nn.QuantizedEmbedding layers
    where the folder has them: their packed weights, scales and biases frozen (as mlx
    makes them; a Linear's own bias, Qwen2's q/k/v, and the norms stay float32 and
    trainable: freeze the model before adding adapters). Only the fine-tunes that
    train adapters ("lora", "dora") accept that, "full" is a DataError."""
    check_fine_tune(folder, read_config(folder), fine_tune)
    args, weights, config = load_folder(folder)
    check_data_fits(meta, data_dir, args, Path(folder))
    return model_from_weights(args, weights, config, folder)


def check_fine_tune(folder: str | Path, config: dict, fine_tune: str) -> None:
    """A DataError when `fine_tune` cannot train the folder's weights: full fine-tuning
    of quantized ones."""
    quant = quantization_of(config)
    if quant is not None and fine_tune == "full":
        raise DataError(f"--init_from {folder}: the weights are quantized "
                        f"({describe_quantization(quant)}); full fine-tuning trains every "
                        "weight in float32 and quantized weights cannot be trained; "
                        "supported for a quantized folder: LoRA or DoRA, its base kept "
                        "quantized and frozen",
                        f"--fine_tune lora (or dora), or fully fine-tune the original checkpoint (or "
                        f"this one dequantized: mlx_lm.convert --hf-path {folder} "
                        f"--mlx-path {folder}-dequantized -d)")


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of `model` is a quantized one."""
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
               for _, m in model.named_modules())


def check_data_fits(meta: dict, data_dir: Path, args: ModelArgs, init_from: Path | None) -> None:
    """A DataError naming both when the data was tokenized with another tokenizer than
    the model's folder, or holds ids beyond the model's vocabulary."""
    tok = meta.get("tokenizer") or {}
    if tok.get("kind") == "folder":
        data_desc = (f"the tokenizer of {tok.get('path')} (tokenizer.json sha256 "
                     f"{tok.get('tokenizer_json_sha256', '?')[:12]})")
    else:
        data_desc = f"the {tok.get('kind', '?')} tokenizer {tok.get('name', '')}".rstrip()
    if init_from is not None:
        path = init_from / "tokenizer.json"
        if not path.is_file():
            raise DataError(f"--init_from {init_from}: no tokenizer.json, so the data's "
                            "tokenizer cannot be checked",
                            "put the model's tokenizer.json in the folder")
        want = file_sha256(path)
        if tok.get("kind") != "folder" or (tok.get("tokenizer_json_sha256") != want
                                           and not same_tokenizer(data_dir / "tokenizer", path)):
            raise DataError(
                f"the data {data_dir} was tokenized with {data_desc}, but the model "
                f"{init_from} uses {path} (sha256 {want[:12]})",
                f"tokenize with the model's tokenizer: python -m reference_train.prepare "
                f"--tokenizer {init_from} --out DIR ...")
    if meta["vocab_size"] > args.vocab_size:
        raise DataError(
            f"the data {data_dir} has a vocabulary of {meta['vocab_size']} ({data_desc}), "
            f"larger than the model's {args.vocab_size}"
            + (f" ({init_from}/config.json vocab_size)" if init_from else ""),
            "tokenize the data with the model's tokenizer")


# ---------------------------------------------------------------- weights out


def export_folder(weights: dict[str, mx.array], args: ModelArgs, out: str | Path,
                  tokenizer_dir: str | Path | None, dtype: str = "float32",
                  base_config: dict | None = None, tokenizer_json: dict | None = None,
                  quantization: dict | None = None) -> Path:
    """Write an mlx-lm model folder at `out` atomically (a temporary folder beside it,
    renamed): config.json (of args.model_type's family), model.safetensors and
    model.safetensors.index.json (as mlx_lm.utils.save_model writes them), and the
    tokenizer files from `tokenizer_dir` (or `tokenizer_json`, a tokenizer.json as a
    dict, with a tokenizer_config.json). Quantized weights (packed, with .scales and
    .biases: a quantized model's parameters) need the `quantization` they were
    loaded with (quantization_of(config)); packed weights keep their dtype."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        cast = exported_weights(weights, dtype, quantization, out)
        mx.save_safetensors(str(tmp / "model.safetensors"), cast, metadata={"format": "mlx"})
        write_index(tmp, {k: "model.safetensors" for k in cast},
                    sum(v.nbytes for v in cast.values()), sum(v.size for v in cast.values()))
        write_frame(tmp, args, dtype, base_config, quantization, tokenizer_dir, tokenizer_json)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def exported_weights(weights: dict[str, mx.array], dtype: str, quantization: dict | None,
                     out: str | Path) -> dict[str, mx.array]:
    """`weights` (our names) under mlx-lm's names, cast to `dtype` (packed quantized
    weights as they are, which need their `quantization`)."""
    if dtype not in EXPORT_DTYPES:
        raise DataError(f"export dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
    packed = [k for k, v in weights.items() if not mx.issubdtype(v.dtype, mx.floating)]
    if packed and not quantization:
        raise DataError(f"{out}: {hf_from_ours(packed[0])} is quantized ({weights[packed[0]].dtype}) "
                        "but no quantization was given for config.json")
    return {hf_from_ours(k): v if k in packed else v.astype(getattr(mx, dtype))
            for k, v in weights.items()}


def write_index(folder: Path, weight_map: dict[str, str], total_size: int,
                total_parameters: int) -> None:
    """model.safetensors.index.json: which file holds each tensor (mlx-lm's names)."""
    index = {"metadata": {"total_size": total_size, "total_parameters": total_parameters},
             "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=4))


def write_frame(folder: Path, args: ModelArgs, dtype: str, base_config: dict | None,
                quantization: dict | None, tokenizer_dir: str | Path | None,
                tokenizer_json: dict | None) -> None:
    """A model folder's files around its weights: config.json and the tokenizer's."""
    config = config_from_args(args, {**(base_config or {}), "torch_dtype": dtype}, quantization)
    (folder / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    if tokenizer_dir is not None:
        copy_tokenizer(Path(tokenizer_dir), folder)
    elif tokenizer_json is not None:
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
        eos = next(t["content"] for t in tokenizer_json["added_tokens"])
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos}, indent=2))


def tokenizer_source(data_dir: Path | None, init_from: str | None) -> Path | None:
    """Where an exported model's tokenizer files come from: the copy kept with the data
    (prepare --tokenizer DIR), else the folder the run started from; None = byte data."""
    if data_dir is not None and (data_dir / "tokenizer" / "tokenizer.json").is_file():
        return data_dir / "tokenizer"
    if init_from and (Path(init_from) / "tokenizer.json").is_file():
        return Path(init_from)
    return None
