"""Checkpoints: one directory per step, written atomically, read back exactly.

    OUT/checkpoints/step_000010/model.safetensors      parameters ("layers.0.attention.wq.weight", ...)
    OUT/checkpoints/step_000010/optimizer.safetensors  AdamW state ("step", "learning_rate", "...weight.m")
    OUT/checkpoints/step_000010/state.json             {"format": 2, "step": 10,
                                                        "data": {"epoch": 0, "step_in_epoch": 10, "seed": 0},
                                                        "rng_key": [0, 1], "config": {...},
                                                        "model_args": {...}, "world_size": 2,
                                                        "records": [{"step": 9, "loss": ...}, ...],
                                                        "hashes": {"model.safetensors": "<sha256>",
                                                                   "optimizer.safetensors": "<sha256>"}}
    OUT/checkpoints/latest                             "step_000010"

The directory is written under a temporary name and renamed when complete, and
`latest` is replaced by rename too, so a run killed at any moment leaves either
the previous checkpoint or the new one, never a half-written one.

Every host keeps its own copy (Macs have their own disks): one rank per host
writes (train.py), one for all the hosts that share a disk (storage.py), and
the `hashes` let a resume tell a whole copy from a damaged one and the hosts
agree on what they loaded (resume.py). Checkpoints written before the hashes
(format 1) are hashed when read.

A LoRA or DoRA run (`--fine_tune lora` or `dora`, lora.py) trains its adapters
alone: its model.safetensors holds those ("layers.1.attention.wq.lora_a", ...,
and DoRA's magnitudes "layers.1.attention.wq.m"), not the
frozen base it reads from --init_from again, and optimizer.safetensors their
AdamW state; state.json's config says which (fine_tune).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .files import file_sha256


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(root: str | Path, step: int, model, optimizer, state: dict,
                    keep: int = 2, trainable_only: bool = False) -> Path:
    """Write checkpoint `step` under `root` atomically, point `latest` at it, prune old ones.
    `trainable_only`: the model's trainable parameters alone (LoRA's adapters)."""
    params = model.trainable_parameters() if trainable_only else model.parameters()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(params)))
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
        hashes = {name: file_sha256(tmp / name) for name in ARRAY_FILES}
        (tmp / "state.json").write_text(
            json.dumps({"format": 2, "step": step, **state, "hashes": hashes}, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return install_checkpoint(root, tmp, step, keep)


# The files of a checkpoint whose content the hashes in state.json vouch for.
ARRAY_FILES = ("model.safetensors", "optimizer.safetensors")
CHECKPOINT_FILES = (*ARRAY_FILES, "state.json")


def install_checkpoint(root: Path, tmp: Path, step: int, keep: int) -> Path:
    """Rename the complete directory `tmp` to checkpoint `step`, point `latest` at it, prune.

    A whole checkpoint of the same step holding the same arrays already there
    is kept and `tmp` discarded: two writers of one --out (hosts sharing a
    disk that did not find out, storage.py) each rename the same state into
    place, and the second rename used to fail with "Directory not empty".
    Another one there (an older run's, or a damaged copy) is replaced."""
    final = root / checkpoint_name(step)
    try:
        for _ in range(INSTALL_TRIES):
            if same_checkpoint(final, tmp):
                shutil.rmtree(tmp, ignore_errors=True)
                break
            if final.exists():  # re-running over an old (or damaged) checkpoint of the same step
                aside = root / f".{final.name}.old.{os.getpid()}.{os.urandom(4).hex()}"
                try:
                    os.rename(final, aside)
                except FileNotFoundError:  # another writer moved it aside first
                    pass
                else:
                    shutil.rmtree(aside, ignore_errors=True)
            try:
                os.rename(tmp, final)
                break
            except OSError as e:  # another writer's copy arrived in between
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        else:
            raise OSError(errno.EEXIST, f"{final} kept changing while {tmp} was renamed into "
                                        f"place ({INSTALL_TRIES} tries)")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(root / "latest", final.name + "\n")
    prune_checkpoints(root, keep)
    return final


INSTALL_TRIES = 5  # renames tried while other writers put their own copies in place


def same_checkpoint(final: Path, tmp: Path) -> bool:
    """Whether `final` is a whole checkpoint holding what `tmp` holds."""
    try:
        return (final / "state.json").is_file() and checkpoint_problem(final) is None \
            and content_hash(final) == content_hash(tmp)
    except (OSError, ValueError, KeyError):  # removed or replaced while read
        return False


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoint directories under `root`, oldest first."""
    steps = []
    for p in Path(root).glob("step_*"):
        if p.is_dir() and p.name[5:].isdigit() and (p / "state.json").exists():
            steps.append(int(p.name[5:]))
    return sorted(steps)


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted (a file missing, or not what its
    hash in state.json says), or None when it is whole."""
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as e:
        return f"state.json unreadable ({e})"
    for name in ARRAY_FILES:
        if not (path / name).is_file():
            return f"{name} missing"
    for name, want in (state.get("hashes") or {}).items():
        if file_sha256(path / name) != want:
            return f"{name} does not match its hash in state.json"
    return None


def content_hash(path: Path) -> str:
    """One sha256 for what a checkpoint holds (its arrays), the same on every host
    holding the same state; format-1 checkpoints are hashed from their files."""
    state = json.loads((path / "state.json").read_text())
    hashes = state.get("hashes") or {name: file_sha256(path / name) for name in ARRAY_FILES}
    joined = "".join(f"{name}={hashes[name]};" for name in ARRAY_FILES)
    return hashlib.sha256(joined.encode()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` by writing a temporary file and renaming it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written file left beside `path`
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (0 keeps all)."""
    if keep <= 0:
        return
    for step in checkpoint_steps(root)[:-keep]:
        shutil.rmtree(root / checkpoint_name(step), ignore_errors=True)


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


def load_checkpoint(path: Path, model, optimizer, trainable_only: bool = False) -> dict:
    """Load parameters and optimizer state in place; return state.json.
    `trainable_only`: the file holds exactly the trainable parameters (LoRA's adapters)."""
    state = json.loads((path / "state.json").read_text())
    load_arrays(model, optimizer, mx.load(str(path / "model.safetensors")),
                mx.load(str(path / "optimizer.safetensors")), trainable_only,
                f"{path}/model.safetensors")
    return state


def load_arrays(model, optimizer, weights: dict, optimizer_state: dict, trainable_only: bool,
                where: str) -> None:
    """Load a checkpoint's arrays (from its files, or re-cut from another pipeline's
    pieces: resplit.py) in place; `where` names them in a refusal."""
    if trainable_only:
        want = {k for k, _ in tree_flatten(model.trainable_parameters())}
        if set(weights) != want:
            missing, extra = sorted(want - set(weights)), sorted(set(weights) - want)
            raise ValueError(f"{where} does not hold this run's trainable "
                             f"parameters: missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_weights(list(weights.items()), strict=not trainable_only)
    optimizer.state = tree_unflatten(list(optimizer_state.items()))
    mx.eval(model.parameters(), optimizer.state)
