"""A view here of a model folder only the hosts hold (`serve` and `train`
with ``--download-on HOST``): what this machine reads of a model, and not
its tensors.

Before a launch, serve and train read the model here: its ``config.json``,
its index and each weight file's safetensors header (the split check, the
memory each rank needs, a pipeline's stages), and mlx-lm builds the model
from the folder lazily (fit/family.py) without reading a weight. A model
downloaded on a host has no copy here, so the host sends, in one ssh call
(the agent's ``heads``), the folder's files but its weights whole, and of
each ``*.safetensors`` file only its header: a few MB of a many-GB model.

Each weight file is then made its real size again, sparse: mlx-lm's
``mx.load`` refuses a file shorter than its header's offsets (even lazily),
and a sparse tail holds no byte on disk (APFS, ext4). Its bytes past the
header are zeros, never the model's: the folder carries ``VIEW_MARK``, and
``folder_manifest`` (what every model send lists) refuses a folder that
carries it, so no view is ever sent to a host as the model.

    heads: config.json, tokenizer.json, model.safetensors.index.json (whole)
           model-00001-of-00002.safetensors (its first 8 + 41,873 bytes), ...
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.transfer.fetch import fetch_heads
from mlxcluster.transfer.link import ProcessLink, TransferError
from mlxcluster.transfer.manifest import VIEW_MARK, Manifest

WEIGHTS = ".safetensors"  # what the readers here open by header alone
# A file besides the weights larger than this is no config or tokenizer (a .gguf, a
# PyTorch .bin): nothing here reads it, and it is left out of the view.
WHOLE_LIMIT = 64 * 10**6
VIEW_IDLE_S = 120.0  # the host sends nothing for this long: given up


@dataclass(frozen=True)
class ViewPlan:
    """Which files of a model folder a view holds, and how."""

    whole: tuple[str, ...]  # config, index, tokenizer...: as they are
    headers: tuple[str, ...]  # the weight files: their safetensors header, the rest sparse
    left_out: tuple[str, ...]  # large files that are no weights of a safetensors model

    @classmethod
    def of(cls, manifest: Manifest) -> ViewPlan:
        whole, headers, left_out = [], [], []
        for f in manifest.files:
            if f.name.endswith(WEIGHTS):
                headers.append(f.name)
            elif f.bytes <= WHOLE_LIMIT:
                whole.append(f.name)
            else:
                left_out.append(f.name)
        return cls(tuple(whole), tuple(headers), tuple(left_out))


@dataclass(frozen=True)
class ModelView:
    """A view of ``of`` (a folder on a host) at ``path`` here."""

    path: Path
    of: str  # the folder on the hosts
    plan: ViewPlan
    fetched: int  # the bytes that crossed (the whole files and the headers)
    model_bytes: int  # the whole folder's on the host


def make_view(link: ProcessLink, manifest: Manifest, here: str | Path,
              timeout: float = VIEW_IDLE_S) -> ModelView:
    """A view of ``manifest``'s folder on ``link``'s host (its files and
    sizes as the host listed and hashed them) made at ``here``, a new
    folder. Raises TransferError when the host cannot send it, or a weight
    file's header says other than the listing's size."""
    plan = ViewPlan.of(manifest)
    path = Path(here)
    path.mkdir(parents=True)
    # Marked first: a view cut half way is still never sent as the model.
    (path / VIEW_MARK).write_text(manifest.folder + "\n")
    got = fetch_heads(link, manifest.folder, plan.whole, plan.headers, path, timeout)
    sizes = {f.name: f.bytes for f in manifest.files}
    for name in plan.headers:
        weights = path / name
        if weights.stat().st_size > sizes[name]:
            raise TransferError(f"{link.name}: {manifest.folder}/{name} changed since it was "
                                "listed (its header is longer than the file was)")
        os.truncate(weights, sizes[name])  # sparse: mx.load checks the offsets against the size
    return ModelView(path, manifest.folder, plan, got.bytes, manifest.total_bytes)
