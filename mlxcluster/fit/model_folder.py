"""A model folder as the split check reads it: ``config.json`` and the
tensors of its ``model*.safetensors`` files (names, bytes, ranks of the
arrays), read from the files' headers alone; no weight is loaded.

A safetensors file starts with its header's length (8 bytes, little-endian)
and the header, JSON naming every tensor::

    {"model.layers.0.self_attn.q_proj.weight": {"dtype": "BF16", "shape": [4096, 4096],
                                                "data_offsets": [0, 33554432]}, ...,
     "__metadata__": {"format": "mlx"}}
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcluster.errors import InputError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
WEIGHTS_GLOB = "model*.safetensors"  # what mlx-lm's load_model reads
HEADER_LIMIT = 100 * 2**20  # safetensors' own cap on a header
HINT = "pass a folder mlx-lm loads: config.json and model*.safetensors (mlx_lm.convert writes one)"


@dataclass(frozen=True)
class Tensor:
    name: str
    nbytes: int
    ndim: int


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    config: dict[str, Any]
    tensors: tuple[Tensor, ...]
    has_index: bool  # model.safetensors.index.json: --pipeline's sharded_load reads it

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "")

    def _text(self, key: str) -> Any:
        """A config value, from ``text_config`` where a multimodal model keeps its language model's."""
        if key in self.config:
            return self.config[key]
        text = self.config.get("text_config")
        return text.get(key) if isinstance(text, dict) else None

    def _count(self, key: str) -> int | None:
        value = self._text(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def attention_heads(self) -> int | None:
        return self._count("num_attention_heads")

    @property
    def kv_heads(self) -> int | None:
        """num_key_value_heads; without it, every attention head has its own
        (mlx-lm's ModelArgs default)."""
        return self._count("num_key_value_heads") or self.attention_heads

    @property
    def layers(self) -> int | None:
        return self._count("num_hidden_layers")

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def parse_header(data: bytes, source: str) -> tuple[Tensor, ...]:
    """The tensors a safetensors header names (``data`` holds at least the header)."""
    problem = InputError(f"{source} is not a safetensors file (its header cannot be read)", HINT)
    if len(data) < 8:
        raise problem
    (length,) = struct.unpack("<Q", data[:8])
    if length > HEADER_LIMIT or len(data) < 8 + length:
        raise problem
    try:
        header = json.loads(data[8:8 + length])
    except (UnicodeDecodeError, ValueError):
        raise problem from None
    if not isinstance(header, dict):
        raise problem
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            tensors.append(Tensor(name, int(end) - int(start), len(entry["shape"])))
        except (KeyError, TypeError, ValueError):
            raise problem from None
    return tuple(tensors)


def read_header(path: Path) -> tuple[Tensor, ...]:
    try:
        with path.open("rb") as f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            return parse_header(head + f.read(min(length, HEADER_LIMIT)), str(path))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", HINT) from None


def read_model_folder(path: str | Path) -> ModelFolder:
    """The folder's config and tensors; InputError (exit 2) naming what is missing."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise InputError(f"model folder {root} does not exist", HINT)
    try:
        config = json.loads((root / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{root} has no {CONFIG}", HINT) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot read {root / CONFIG}: {exc}", HINT) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise InputError(f"{root / CONFIG} names no model_type", HINT)
    files = sorted(root.glob(WEIGHTS_GLOB))
    if not files:
        raise InputError(f"{root} has no {WEIGHTS_GLOB} (the weights)", HINT)
    tensors = tuple(t for f in files for t in read_header(f))
    return ModelFolder(root, config, tensors, (root / INDEX).is_file())
