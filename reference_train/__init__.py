"""A reference sharded data-parallel Llama trainer for MLX (see docs/training.md).

Depends on mlx, numpy and pyyaml only (checkpoints use mlx's own safetensors I/O), so it can be copied out of
this project as it is.
"""
