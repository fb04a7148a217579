"""Tokenizers: text <-> token ids, for `prepare`, a run's sample, and an exported model.

Three kinds, each able to say what it is (`describe`, kept in a token
directory's meta.json, see data.py) so that `make_tokenizer` finds the same one
again from that entry:

    ByteTokenizer     UTF-8 bytes as ids 0-255 and an end-of-document id 256; no download
    FolderTokenizer   the tokenizer.json of a local folder (a Llama checkpoint's), offline
    HFTokenizer       a Hugging Face tokenizer by name (e.g. "gpt2"), downloaded

The last two need the `tokenizers` (or `transformers`) package, imported only
when one of them is made, so that the byte tokenizer and training on byte data
need neither. Also here: a folder's tokenizer files copied (into token data, an
exported model) and a tokenizer.json equal to the byte tokenizer, so that
mlx-lm opens a byte-trained model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from .errors import DataError
from .files import file_sha256

# Files of a tokenizer that travel with it (copied into token data and exported models).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


def make_tokenizer(spec: dict | str, data_dir: str | Path | None = None):
    """A tokenizer from "byte", a local folder holding a tokenizer.json, a Hugging Face
    name, or a meta.json `tokenizer` entry (its copy kept in `data_dir` when there is one)."""
    if isinstance(spec, dict):
        kept = Path(data_dir) / "tokenizer" if data_dir is not None else None
        if spec.get("kind") == "folder":
            spec = str(kept if kept and (kept / "tokenizer.json").is_file() else spec["path"])
        else:
            spec = "byte" if spec.get("kind") == "byte" else spec["name"]
    if spec == "byte":
        return ByteTokenizer()
    if Path(spec).is_dir():
        return FolderTokenizer(spec)
    return HFTokenizer(spec)


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, plus an end-of-document id 256. Needs no download."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    encode_with_specials = encode  # no special tokens to add

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return {"kind": "byte"}


class HFTokenizer:
    """A Hugging Face tokenizer (e.g. "gpt2"), through `transformers` or `tokenizers`."""

    def __init__(self, name: str):
        self.name = name
        try:
            # Lazy: optional packages, needed only for a tokenizer named here.
            from transformers import AutoTokenizer  # type: ignore[import-not-found]

            tok = AutoTokenizer.from_pretrained(name)
            self._encode = lambda s: tok.encode(s)
            self._decode = lambda ids: tok.decode(list(ids))
            self._save = tok.save_pretrained
            self.vocab_size = len(tok)
            eos = tok.eos_token_id
        except ImportError:
            try:
                from tokenizers import Tokenizer  # type: ignore[import-not-found]
            except ImportError as e:
                raise DataError(
                    f"tokenizer {name!r} needs the 'transformers' or 'tokenizers' package, "
                    "and neither is installed",
                    "pip install tokenizers, or use the default byte tokenizer (--tokenizer byte)",
                ) from e
            tok = Tokenizer.from_pretrained(name)
            self._encode = lambda s: tok.encode(s).ids
            self._decode = lambda ids: tok.decode(list(ids))
            self._save = lambda folder: tok.save(str(folder / "tokenizer.json"))
            self.vocab_size = tok.get_vocab_size()
            eos = tok.token_to_id("<|endoftext|>")
        except OSError as e:  # transformers raises OSError when the hub is unreachable
            raise DataError(f"could not load tokenizer {name!r}: {e}",
                            "check the network, or use --tokenizer byte") from e
        # Without an end-of-text token, documents are separated by an extra id.
        self.eos_id = eos if eos is not None else self.vocab_size
        self.vocab_size = max(self.vocab_size, self.eos_id + 1)

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    encode_with_specials = encode

    def decode(self, ids: Iterable[int]) -> str:
        return self._decode([i for i in ids if i != self.eos_id])

    def describe(self) -> dict:
        return {"kind": "hf", "name": self.name}

    def save_files(self, folder: Path) -> None:
        """Keep the tokenizer's files with the data (an exported model needs them)."""
        folder.mkdir()
        self._save(folder)


class FolderTokenizer:
    """The tokenizer.json of a local folder, through the `tokenizers` package (offline)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise DataError(f"{self.folder}: no tokenizer.json",
                            "give a folder with a Hugging Face tokenizer.json")
        try:
            # Lazy: an optional package, needed only for a folder's tokenizer.
            from tokenizers import Tokenizer  # type: ignore[import-not-found]
        except ImportError as e:
            raise DataError(f"the tokenizer in {self.folder} needs the 'tokenizers' package, "
                            "which is not installed", "pip install tokenizers") from e
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own Exception type
            raise DataError(f"{path} is not a tokenizer.json tokenizers can read: {e}") from None
        self.sha256 = file_sha256(path)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos()

    def _find_eos(self) -> int:
        """The end-of-text id: tokenizer_config.json's eos_token, config.json's
        eos_token_id, else a token named like one."""
        cfg = self._json("tokenizer_config.json")
        eos = cfg.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and self.tok.token_to_id(eos) is not None:
            return self.tok.token_to_id(eos)
        ids = self._json("config.json").get("eos_token_id")
        if isinstance(ids, list) and ids:
            ids = ids[0]
        if isinstance(ids, int):
            return ids
        for name in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>"):
            if self.tok.token_to_id(name) is not None:
                return self.tok.token_to_id(name)
        raise DataError(f"{self.folder}: no end-of-text token found (tokenizer_config.json "
                        "eos_token, config.json eos_token_id, or a token like <|endoftext|>)",
                        "set eos_token in the folder's tokenizer_config.json")

    def _json(self, name: str) -> dict:
        try:
            value = json.loads((self.folder / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def token_text(self, i: int) -> str:
        return self.tok.id_to_token(i)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_with_specials(self, text: str) -> list[int]:
        """With the tokenizer's own additions (a BOS...), as transformers' encode adds them
        by default (mlx-lm's text rows)."""
        return self.tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids) -> str:
        return self.tok.decode([i for i in ids if i != self.eos_id])

    def save_files(self, folder: Path) -> None:
        """Keep the tokenizer's files with the data (an exported model needs them)."""
        folder.mkdir()
        copy_tokenizer(self.folder, folder)

    def describe(self) -> dict:
        return {"kind": "folder", "name": self.folder.name, "path": str(self.folder.resolve()),
                "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "tokenizer_json_sha256": self.sha256}


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of `src` into `dst`; a tokenizer.json alone gets a
    tokenizer_config.json so that transformers loads it as it is."""
    if not (src / "tokenizer.json").is_file():
        raise DataError(f"{src}: no tokenizer.json", "give a folder with a Hugging Face "
                        "tokenizer.json (--tokenizer DIR)")
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    if "tokenizer_config.json" not in copied:
        tok = FolderTokenizer(src)
        (dst / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast",
             "eos_token": tok.token_text(tok.eos_id)}, indent=2))
        copied.append("tokenizer_config.json")
    return copied


def same_tokenizer(kept: Path, path: Path) -> bool:
    """Whether the data's kept tokenizer files and `path` (a tokenizer.json) tokenize
    alike though their bytes differ (a copy written again by another program): their
    canonical forms, as the `tokenizers` package serializes them, are equal."""
    try:
        # Lazy: an optional package; without it the two are not shown alike.
        from tokenizers import Tokenizer  # type: ignore[import-not-found]

        return (Tokenizer.from_file(str(kept / "tokenizer.json")).to_str()
                == Tokenizer.from_file(str(path)).to_str())
    except Exception:  # no copy kept, not readable, or no tokenizers package: not shown alike
        return False


def byte_tokenizer_json(eos_text: str = "<|endoftext|>") -> dict:
    """A tokenizer.json that tokenizes exactly as ByteTokenizer: one id per UTF-8
    byte (0-255), `eos_text` = 256. Byte-level BPE with no merges, so any Hugging Face
    tokenizer reader (transformers, mlx-lm) opens a byte-trained model."""
    # GPT-2's printable stand-ins for bytes (tokenizers' ByteLevel alphabet).
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": eos_text, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {chars[b]: b for b in range(256)}, "merges": []},
    }
