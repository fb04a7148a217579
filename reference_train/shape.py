"""The model's shape, `ModelArgs`, apart from the model: no mlx here, so that
config.py checks a run's shape (`mlxcluster train` parses the trainer's
arguments) without loading MLX. model.py builds the Llama of these args.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ModelArgs:
    """Shape of the model. `n_kv_heads` below `n_heads` turns on grouped-query attention.

    `head_dim` (None = dim / n_heads) and `rope_scaling` (None, or Hugging Face's
    {"rope_type": "linear" | "llama3", "factor": ...}) are what Llama checkpoints
    may set; `qkv_bias`, `qk_norm` and `model_type` the other families (Qwen2,
    Qwen3, Mistral); reference_train/hf_io.py maps a Hugging Face config to these fields.
    """

    vocab_size: int = 257
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    hidden_dim: int = 512
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    head_dim: int | None = None
    rope_scaling: dict | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    model_type: str = "llama"

    def __post_init__(self) -> None:
        kv = self.n_kv_heads or self.n_heads
        if self.head_dim is None and self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % kv:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {kv}")


def args_match(saved: dict, args: ModelArgs) -> bool:
    """Whether model_args saved in a checkpoint describe `args` (older checkpoints lack
    the fields added since, which then have their defaults)."""
    return {**asdict(ModelArgs()), **saved} == asdict(args)
