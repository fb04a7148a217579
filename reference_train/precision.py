"""Mixed precision the way large trainers do it (llm.c, torchtitan): the
master weights and the AdamW state stay float32; the forward and backward
passes run on a bfloat16 copy of the weights, refreshed from the master
before every micro-batch; the gradients come back to float32 before they
are averaged (or, with ``comm_dtype`` bfloat16, are averaged in bfloat16:
half the bytes on the wire) and before the optimizer sees them.

    --dtype float32      (default) one float32 model: today's exact parity
    --dtype bfloat16     float32 master + a bfloat16 compute copy
    --comm_dtype bfloat16  the gradient all-reduce in bfloat16

Checkpoints and the exported model hold the float32 master weights.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from .choices import DTYPES as DTYPE_NAMES

DTYPES = {name: getattr(mx, name) for name in DTYPE_NAMES}


def dtype_of(name: str) -> mx.Dtype:
    return DTYPES[name]


def compute_copy(master: nn.Module, make, dtype: mx.Dtype) -> nn.Module:
    """The module the passes run on: ``master`` itself in float32, else a
    second model (``make()``) that ``refresh`` fills with cast weights."""
    if dtype == mx.float32:
        return master
    copy = make()
    refresh(copy, master, dtype)
    return copy


def refresh(copy: nn.Module, master: nn.Module, dtype: mx.Dtype) -> None:
    """Put the master weights, cast to ``dtype``, into ``copy``."""
    copy.update(tree_map(lambda p: p.astype(dtype), master.parameters()))


def to_float32(tree):
    return tree_map(lambda g: g.astype(mx.float32), tree)
