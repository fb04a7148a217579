"""What `--fine_tune` may ask for, in mlx-lm's terms, named without mlx (config.py
checks these before anything loads MLX; lora.py builds the layers).

    --fine_tune full   every weight trains
    --fine_tune lora   LoRA adapters on a frozen --init_from model (QLoRA on a quantized one)
    --fine_tune dora   DoRA: LoRA's adapters and a magnitude vector `m` per adapted layer

The `--lora_*` fields set both adapter kinds (mlx-lm's `lora_parameters` serve
its LoRA and DoRA alike); `adapter_config` is OUT/adapters/adapter_config.json
as mlx-lm's own training writes it.
"""

from __future__ import annotations

FINE_TUNES = ("full", "lora", "dora")
ADAPTERS = ("lora", "dora")  # the fine-tunes that train adapters on a frozen base
# OUT/adapters as mlx-lm reads it (lora.write_adapters writes both): one without the other
# is no adapters folder (mlx_lm.fuse and load(adapter_path=) fail).
ADAPTER_FILES = ("adapters.safetensors", "adapter_config.json")
NAMES = {"lora": "LoRA", "dora": "DoRA"}  # as the log says them
# mlx-lm's names of a Llama block's linear layers (all of them: mlx-lm's default keys).
KEYS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.down_proj", "mlp.up_proj")
# The settings a checkpoint of adapters was trained with: resuming needs the same.
ADAPTER_FIELDS = tuple(f"lora_{k}" for k in ("rank", "scale", "dropout", "layers", "keys"))


def trains_adapters(fine_tune: str) -> bool:
    return fine_tune in ADAPTERS


def parse_keys(text: str) -> list[str]:
    """--lora_keys as a list of mlx-lm key names ("" = all of KEYS); ValueError for others."""
    keys = [k.strip() for k in str(text).split(",") if k.strip()]
    unknown = [k for k in keys if k not in KEYS]
    if unknown:
        raise ValueError(f"lora_keys {', '.join(unknown)}: not a Llama block's linear layer; "
                         f"choose among {', '.join(KEYS)} (comma-separated; empty = all)")
    if len(set(keys)) != len(keys):
        raise ValueError(f"lora_keys {text}: a key is named twice")
    return keys or list(KEYS)


def config_problems(cfg) -> list[str]:
    """What is wrong with a config's fine-tuning fields (config.check_config)."""
    problems = []
    if cfg.fine_tune not in FINE_TUNES:
        problems.append(f"fine_tune {cfg.fine_tune}: must be one of {', '.join(FINE_TUNES)}")
    if cfg.lora_layers == 0:
        problems.append("lora_layers 0: give the number of last blocks to adapt, or -1 for all")
    try:
        parse_keys(cfg.lora_keys)
    except ValueError as e:
        problems.append(str(e))
    if trains_adapters(cfg.fine_tune) and not cfg.init_from:
        problems.append(f"fine_tune {cfg.fine_tune} adapts a trained model: give --init_from DIR "
                        "(a Hugging Face / mlx-lm Llama folder)")
    return problems


def adapter_config(cfg, n_layers: int) -> dict:
    """adapter_config.json as mlx-lm's LoRA / DoRA training writes it (the fields its
    load_adapters and fuse read, and what the run started from)."""
    return {"fine_tune_type": cfg.fine_tune, "model": cfg.init_from,
            "num_layers": n_layers if cfg.lora_layers < 0 else cfg.lora_layers,
            "lora_parameters": {"rank": cfg.lora_rank, "scale": cfg.lora_scale,
                                "dropout": cfg.lora_dropout, "keys": parse_keys(cfg.lora_keys)}}
