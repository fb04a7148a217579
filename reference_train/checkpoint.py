"""Checkpoints: one directory per step, written atomically, read back exactly.

    OUT/checkpoints/step_000010/model.safetensors      parameters ("layers.0.attention.wq.weight", ...)
    OUT/checkpoints/step_000010/optimizer.safetensors  AdamW state ("step", "learning_rate", "...weight.m")
    OUT/checkpoints/step_000010/state.json             {"step": 10, "data": {"epoch": 0,
                                                        "step_in_epoch": 10, "seed": 0},
                                                        "rng_key": [0, 1], "config": {...},
                                                        "model_args": {...}, "world_size": 2}
    OUT/checkpoints/latest                             "step_000010"

The directory is written under a temporary name and renamed when complete, and
`latest` is replaced by rename too, so a run killed at any moment leaves either
the previous checkpoint or the new one, never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(root: str | Path, step: int, model, optimizer, state: dict,
                    keep: int = 2) -> Path:
    """Write checkpoint `step` under `root` atomically, point `latest` at it, prune old ones."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2) + "\n")
        if final.exists():  # re-running over an old checkpoint of the same step
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(root / "latest", final.name + "\n")
    prune_checkpoints(root, keep)
    return final


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` by writing a temporary file and renaming it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (0 keeps all)."""
    if keep <= 0:
        return
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint directory from itself, a `checkpoints/` root, or a run's --out directory."""
    path = Path(path)
    for root in (path, path / "checkpoints"):
        if (root / "state.json").exists():
            return root
        latest = root / "latest"
        if latest.exists():
            return root / latest.read_text().strip()
    return None


def load_checkpoint(path: Path, model, optimizer) -> dict:
    """Load parameters and optimizer state in place; return state.json."""
    state = json.loads((path / "state.json").read_text())
    model.load_weights(list(mx.load(str(path / "model.safetensors")).items()), strict=True)
    optimizer.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
    mx.eval(model.parameters(), optimizer.state)
    return state
