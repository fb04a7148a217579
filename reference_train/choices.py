"""The values a setting may take, named without mlx: config.py checks a run's
settings against them before anything loads MLX (`mlxcluster train` parses the
trainer's arguments on a machine that may not have it); the modules that act on
a setting take its names from here.
"""

from __future__ import annotations

KERNELS = ("auto", "mlx")  # kernels.py: multiply-adds on Linux's CPU, or MLX's own
DTYPES = ("float32", "bfloat16")  # precision.py: --dtype and --comm_dtype
EXPORT_DTYPES = ("float32", "bfloat16", "float16")  # hf_io.py: OUT/model's weights
OBJECTIVES = ("sft", "dpo", "orpo")  # objectives.py: what a run minimises
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "dpop")  # objectives.DPO: mlx-lm-lora's loss types
