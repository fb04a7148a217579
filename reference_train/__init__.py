"""A reference sharded data-parallel Llama trainer for MLX (see docs/training.md).

Depends on mlx, numpy, pyyaml and safetensors only, so it can be copied out of
this project as it is.
"""
