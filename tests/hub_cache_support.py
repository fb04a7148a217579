"""A model in a Hugging Face hub cache as huggingface_hub lays one out (blobs
by sha256, a snapshot folder per commit of links to them, refs naming the
commit), written here without a download: `mlxcluster pull`'s tests read it
with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import hashlib
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: Path, repo_id: str, files: dict[str, bytes], ref: str = "main") -> Path:
    """``files`` as the snapshot of ``repo_id`` at COMMIT in the hub cache at
    ``cache`` (HF_HUB_CACHE), ``ref`` naming it; returns the snapshot folder."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(COMMIT)
    return snapshot
