"""Which weight files a pipeline stage loads: what a host needs of a model
folder under ``--pipeline``.

mlx-lm's ``sharded_load`` reads ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> file) and loads, on each rank, only the files
holding a tensor of the rank's layers or a tensor of no layer (the
embeddings, the final norm, the head: every stage keeps them), matching the
layer by the name as it does (``layers.N.``). A host therefore needs those
files and every file that is not a weight file of the index (config,
tokenizer, the index itself); the others are left out of its copy::

    {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00004.safetensors",
                    "model.layers.0.mlp.up_proj.weight": "model-00001-of-00004.safetensors",
                    "model.layers.9.mlp.up_proj.weight": "model-00003-of-00004.safetensors", ...}}

Pure but for reading the index; no weight is read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.fit.model_folder import INDEX, read_model_folder
from mlxcluster.fit.split import layer_of, spans_of


def weight_map(model_dir: str | Path) -> dict[str, str]:
    """The index's tensor -> file map; {} when the folder has no index (then
    every host needs every file: mlx-lm cannot load a stage alone)."""
    path = Path(model_dir) / INDEX
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8")).get("weight_map", {})
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "save the model again with mlx-lm "
                         "(mlx_lm.convert writes the index)") from None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def left_out_per_rank(index: dict[str, str], split: Sequence[int]) -> list[frozenset[str]]:
    """For each rank of ``split`` (each rank's layer count, mlx-lm's order):
    the index's files that hold none of its stage's tensors."""
    files = frozenset(index.values())
    left_out = []
    for span in spans_of(split):
        needed = {f for name, f in index.items()
                  if (layer := layer_of(name)) is None or layer in span}
        left_out.append(files - needed)
    return left_out


def files_left_out(model_dir: str | Path, split: Sequence[int]) -> list[frozenset[str]]:
    """``left_out_per_rank`` for the folder's index (none left out without one)."""
    index = weight_map(model_dir)
    return left_out_per_rank(index, split) if index else [frozenset()] * len(split)


def layer_count(model_dir: str | Path) -> int:
    """The model's layers, as its config names them (mlx-lm splits that many)."""
    model = read_model_folder(model_dir)
    return model.layers or 1
