"""LoRA, DoRA (and QLoRA) fine-tuning, in mlx-lm's terms: `--fine_tune lora` or `dora`.

    --fine_tune lora --init_from DIR   adapters on a frozen base model
    --fine_tune dora --init_from DIR   the same adapters and a trained magnitude per output
    --lora_rank 8 --lora_scale 20.0 --lora_dropout 0.0 --lora_layers 16 --lora_keys ""

The defaults are mlx-lm's (mlx_lm/lora.py CONFIG_DEFAULTS; `scale` multiplies the
low-rank update as is, it is not alpha / rank). `--lora_layers N` adapts the last N
blocks (-1: all); `--lora_keys` names the projections (comma-separated, mlx-lm's
names relative to a block: self_attn.q_proj, mlp.down_proj...; "" = every linear
layer of a block, as mlx-lm does when its config names no keys). The choices and
adapter_config.json are in fine_tune.py (no mlx).

`LoRALinear` is mlx-lm's (tuner/lora.py): y = base(x) + scale * (dropout(x) @ lora_a) @ lora_b,
`lora_a` (in, r) uniform in +-1/sqrt(in), `lora_b` (r, out) zeros, around an
nn.Linear or an nn.QuantizedLinear (QLoRA: the base stays quantized, the
adapters train in float32). `DoRALinear` is mlx-lm's (tuner/dora.py): the LoRA
output rescaled row by row to a learned magnitude, y = m / |W + scale * (a b)^T|_row
* (x W^T + scale * (dropout(x) @ a) @ b) (+ bias), the norm not differentiated,
`m` (out,) starting at the base weight's row norms (float32; dequantized first
on a quantized base: QLoRA with DoRA). Only the adapters (and `m`) are
trainable: gradients, the all-reduce, the optimizer state and the checkpoints
hold them alone.

A run writes OUT/adapters as mlx-lm's own training does:

    OUT/adapters/adapters.safetensors   "model.layers.N.self_attn.q_proj.lora_a" (in, r), "...lora_b" (r, out)
                                        and with DoRA "...m" (out,)
    OUT/adapters/adapter_config.json    {"fine_tune_type": "lora" | "dora", "num_layers": N,
                                         "lora_parameters": {"rank", "scale", "dropout", "keys"}, ...}

so that `mlx_lm.generate --model DIR --adapter-path OUT/adapters` and
`mlx_lm.fuse --model DIR --adapter-path OUT/adapters` open them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .errors import DataError
from .files import replace_dir
from .fine_tune import KEYS, NAMES, parse_keys  # noqa: F401 (KEYS: where tests look for them)
from .hf_io import hf_from_ours, is_quantized, ours_from_hf  # noqa: F401 (train.py's)

LEAVES = ("lora_a", "lora_b", "m")  # an adapter's parameters (m: DoRA's magnitude)


class LoRALinear(nn.Module):
    """mlx-lm's LoRALinear: the same parameters (`linear`, `lora_a`, `lora_b`), the same output."""

    off = False  # True: the base layer's output alone (adapters_off)

    @classmethod
    def from_base(cls, linear: nn.Module, r: int = 8, dropout: float = 0.0,
                  scale: float = 20.0) -> LoRALinear:
        output_dims, input_dims = linear.weight.shape
        if isinstance(linear, nn.QuantizedLinear):
            input_dims = input_dims * 32 // linear.bits
        layer = cls(input_dims, output_dims, r=r, dropout=dropout, scale=scale)
        layer.set_linear(linear)  # its own, drawn first as mlx-lm's is (never evaluated: lazy)
        return layer

    def __init__(self, input_dims: int, output_dims: int, r: int = 8, dropout: float = 0.0,
                 scale: float = 20.0, bias: bool = False):
        super().__init__()
        self.linear = nn.Linear(input_dims, output_dims, bias=bias)
        self.dropout = nn.Dropout(p=dropout)
        self.scale = scale
        bound = 1 / math.sqrt(input_dims)
        self.lora_a = mx.random.uniform(low=-bound, high=bound, shape=(input_dims, r))
        self.lora_b = mx.zeros(shape=(r, output_dims))

    def set_linear(self, linear: nn.Module) -> None:
        self.linear = linear

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear(x)
        if self.off:
            return y
        z = (self.dropout(x) @ self.lora_a) @ self.lora_b
        return y + (self.scale * z).astype(x.dtype)


class DoRALinear(LoRALinear):
    """mlx-lm's DoRALinear: LoRALinear's parameters and `m`, the same output (its
    forward line for line: the base weight dequantized, the adapted weight's row
    norms held constant in the backward pass)."""

    def __init__(self, input_dims: int, output_dims: int, r: int = 8, dropout: float = 0.0,
                 scale: float = 20.0, bias: bool = False):
        super().__init__(input_dims, output_dims, r=r, dropout=dropout, scale=scale, bias=bias)
        self.set_linear(self.linear)

    def set_linear(self, linear: nn.Module) -> None:
        """The base layer, and the magnitude it starts from: its weight's row norms."""
        self.linear = linear
        self.m = mx.linalg.norm(self.base_weight().astype(mx.float32), axis=1)

    def base_weight(self) -> mx.array:
        """The base weight, dequantized on a quantized base."""
        linear = self.linear
        if not isinstance(linear, nn.QuantizedLinear):
            return linear.weight
        return mx.dequantize(linear.weight, linear.scales, linear.biases,
                             group_size=linear.group_size, bits=linear.bits, mode=linear.mode)

    def __call__(self, x: mx.array) -> mx.array:
        if self.off:
            return self.linear(x)
        w = self.base_weight()
        y = x @ w.T
        z = (self.dropout(x) @ self.lora_a) @ self.lora_b
        out = y + (self.scale * z).astype(x.dtype)
        adapted = w + (self.scale * self.lora_b.T) @ self.lora_a.T
        denom = mx.stop_gradient(mx.linalg.norm(adapted, axis=1))
        out = (self.m / denom).astype(x.dtype) * out
        if "bias" in self.linear:
            out = out + self.linear.bias
        return out


# ---------------------------------------------------------------- settings


def our_key(key: str) -> str:
    """Our module path in a block for an mlx-lm key: self_attn.q_proj -> attention.wq."""
    ours = ours_from_hf(f"model.layers.0.{key}.weight")
    return ours[len("layers.0."):-len(".weight")]


# ---------------------------------------------------------------- the model


def apply_lora(model: nn.Module, num_layers: int, rank: int, scale: float, dropout: float,
               keys: list[str], dora: bool = False) -> nn.Module:
    """Freeze `model` and wrap the `keys` (mlx-lm names) of its last `num_layers`
    blocks (-1: all) in LoRALinear (DoRALinear with `dora`), whose adapters alone
    are then trainable. The adapters are drawn from mlx's global random state, in
    mlx-lm's order."""
    blocks = len(model.layers)
    if num_layers > blocks:
        raise DataError(f"lora_layers {num_layers}: the model has {blocks} blocks",
                        f"pass --lora_layers {blocks} or -1 (all blocks)")
    model.freeze()
    ours = [our_key(k) for k in keys]
    for block in model.layers[-max(num_layers, 0):]:
        layer = DoRALinear if dora else LoRALinear
        wrapped = [(name, layer.from_base(m, r=rank, dropout=dropout, scale=scale))
                   for name, m in block.named_modules() if name in ours]
        block.update_modules(tree_unflatten(wrapped))
    return model


def apply_config(model: nn.Module, cfg) -> nn.Module:
    """The adapters a run's config asks for (--fine_tune lora or dora) on `model`."""
    return apply_lora(model, cfg.lora_layers, cfg.lora_rank, cfg.lora_scale, cfg.lora_dropout,
                      parse_keys(cfg.lora_keys), dora=cfg.fine_tune == "dora")


def apply_saved(model: nn.Module, config: dict) -> nn.Module:
    """The adapters an adapter_config.json describes (read_adapters) on `model`,
    as mlx-lm's load_adapters puts them."""
    p = config["lora_parameters"]
    return apply_lora(model, config["num_layers"], p["rank"], p["scale"], p["dropout"], p["keys"],
                      dora=config.get("fine_tune_type", "lora") == "dora")


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Within it, `model`'s LoRA and DoRA layers give their base layer's output alone: the
    frozen model they adapt, without a second copy of it (preference training's reference
    model, objectives.py). Read when a function is traced, so a compiled step computes
    both the adapted and the base model's passes."""
    layers = [m for _, m in model.named_modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.off = True
    try:
        yield
    finally:
        for layer in layers:
            layer.off = False


def trainable_count(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


# ---------------------------------------------------------------- names and files


def hf_adapter_name(name: str) -> str:
    """mlx-lm's name of one of our adapters: layers.1.attention.wq.lora_a ->
    model.layers.1.self_attn.q_proj.lora_a."""
    module, leaf = name.rsplit(".", 1)
    if leaf not in LEAVES:
        raise ValueError(f"{name!r} is not a LoRA or DoRA adapter")
    return hf_from_ours(f"{module}.weight")[:-len("weight")] + leaf


def ours_adapter_name(name: str) -> str | None:
    """Our name of an mlx-lm adapter, or None when it is not one."""
    module, leaf = name.rsplit(".", 1)
    ours = ours_from_hf(f"{module}.weight") if leaf in LEAVES else None
    return None if ours is None else ours[:-len("weight")] + leaf


def write_adapters(adapters: dict[str, mx.array], config: dict, out: str | Path) -> Path:
    """OUT/adapters: adapters.safetensors (mlx-lm's names) and adapter_config.json,
    written in a temporary folder and renamed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        weights = {hf_adapter_name(k): v for k, v in adapters.items()}
        mx.save_safetensors(str(tmp / "adapters.safetensors"), weights)
        (tmp / "adapter_config.json").write_text(
            json.dumps(dict(sorted(config.items())), indent=4) + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_adapters(folder: str | Path) -> tuple[dict[str, mx.array], dict]:
    """(adapters under our names, adapter_config.json) of an adapters folder."""
    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    weights = {}
    for name, w in mx.load(str(folder / "adapters.safetensors")).items():
        ours = ours_adapter_name(name)
        if ours is None:
            raise DataError(f"{folder}/adapters.safetensors: {name!r} is not a Llama LoRA "
                            "or DoRA adapter")
        weights[ours] = w
    return weights, config


def check_base_dtype(cfg, model: nn.Module) -> None:
    """A DataError for --dtype other than float32 on a quantized base: the adapters
    train in float32 on it."""
    if cfg.dtype != "float32" and is_quantized(model):
        raise DataError(f"--dtype {cfg.dtype} with a quantized base ({cfg.init_from}) "
                        "is not supported", "use --dtype float32 (the adapters train "
                        "in float32 on the quantized base)")


def describe_adapters(cfg, model: nn.Module, trained: int, n_params: int) -> str:
    """The log's line on the adapters (`trained` of the model's `n_params` parameters)."""
    blocks = "all" if cfg.lora_layers < 0 else f"the last {cfg.lora_layers}"
    return (f"{NAMES[cfg.fine_tune]}: rank {cfg.lora_rank}, scale {cfg.lora_scale}, "
            f"dropout {cfg.lora_dropout} on {blocks} blocks' "
            f"{', '.join(parse_keys(cfg.lora_keys))}: {trained:,} trainable "
            f"parameters ({100 * trained / n_params:.2f}%), the "
            f"base frozen{' and quantized' if is_quantized(model) else ''}")
