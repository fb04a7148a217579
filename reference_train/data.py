"""Token files on disk and the sharded, memory-mapped batches every rank reads.

Format (written once by `python -m reference_train.prepare`, see docs/training-reference.md):

    DIR/meta.json     {"format": "reference_train.tokens/1", "dtype": "uint16",
                       "vocab_size": 257, "eos_id": 256,
                       "tokenizer": {"kind": "byte"},
                       "splits": {"train": {"file": "train.bin", "tokens": 612345, "documents": 1900,
                                            "bytes": 1224690, "sha256": "9f2c..."},
                                  "val": {"file": "val.bin", "tokens": 31234, "documents": 100,
                                          "bytes": 62468, "sha256": "41ab..."}},
                       "source": "offline corpus (2000 generated stories, seed 0)"}
    DIR/train.bin     flat little-endian token ids (uint16, or uint32 when vocab > 65536)
    DIR/val.bin       same, for validation
    DIR/tokenizer/    the tokenizer's files (tokenizer.json...), when it is not the byte one

meta.json's `tokenizer` entry is what the tokenizer's `describe()` said
(tokenizer.py), and `make_tokenizer` makes the same one from it. With
`prepare --tokenizer DIR` (a local folder's tokenizer.json) it names the
folder: {"kind": "folder", "name": "my-llama", "path": "/abs/my-llama",
"vocab_size": 32000, "eos_id": 2, "tokenizer_json_sha256": "<sha256>"};
training from a model folder (--init_from) checks that hash.

`bytes` and `sha256` let every host's copy be compared with the one it was
sent from (`mlxcluster train --data DIR` checks and copies them; data
prepared before they were recorded has neither, and is hashed when sent).

Documents are concatenated with `eos_id` after each. Sequence i of a split is
the window tokens[i*L : i*L + L + 1] (inputs are the first L, targets the last L).

Rows (`prepare --jsonl`, mlx-lm's JSONL formats; reference_train/chat.py): format
"reference_train.rows/1", the same meta.json but each split also has "rows",
"trained_tokens" and "index_offset", and may include "test". One file per split
(so it is sent and checked like the token files): the ids of every row back to
back (dtype), then, at byte `index_offset` (8-byte aligned), an int64 table
(rows, 3) of [first id's position, length, offset]. Sequence i is row i alone,
cut to block_size + 1 ids (cut rows are counted: `RowSplit.cut`) and padded to
block_size; target j (ids[j], predicted from ids[:j]) is trained when
offset <= j < length. The batch carries per-position weights: 0 where nothing
is trained (prompt, padding), else (positions in the global batch) / (trained
targets in the global batch), so the mean of weight x cross-entropy over a
rank's positions, averaged over ranks and micro-batches, is the mean over the
global batch's trained targets only (what one process would compute).

Preference pairs (`prepare --jsonl` of {"prompt", "chosen", "rejected"} rows): rows data
whose meta.json says "preference": true; rows 2i and 2i + 1 are pair i's chosen and
rejected sequences, each with its prompt's length as offset (`PairSplit`). Sequence i
of the split is pair i, and a batch is (chosen inputs, targets, mask, rejected inputs,
targets, mask): the masks 0/1, unscaled (the preference losses are means over pairs).

Sharding: per epoch, the sequence indices are shuffled by (seed, epoch); optimizer
step s of the epoch uses positions [s*G, (s+1)*G) of that order (G = global
batch), and rank r of n takes the r-th contiguous slice of G/n of them. So the
ranks of one step together see exactly the global batch a single process would,
every sequence is used once per epoch, and the last `n_sequences % G` of the
order are dropped (reported by `EpochPlan.dropped`). Each rank reads only its
own rows from the memory-mapped file.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import DataError
from .files import file_sha256, replace_dir

FORMAT = "reference_train.tokens/1"
ROWS_FORMAT = "reference_train.rows/1"


class Group(Protocol):
    """What sharding needs from a distributed group (mx.distributed.Group fits)."""

    def rank(self) -> int: ...

    def size(self) -> int: ...


# ---------------------------------------------------------------- corpus readers


def read_text_files(paths: Iterable[str | Path], separator: str = "<|endoftext|>") -> Iterator[str]:
    """Documents from text files: one per file, or split on `separator` when present."""
    for path in paths:
        text = utf8_text(Path(path).read_bytes(), path)
        for doc in text.split(separator):
            if doc.strip():
                yield doc.strip()


def read_jsonl(paths: Iterable[str | Path], field: str = "text") -> Iterator[str]:
    """Documents from JSON Lines files: the `field` of each object, one object a line."""
    for path in paths:
        for lineno, line in json_lines(path):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict) or field not in record:
                raise DataError(f"{path}:{lineno}: no {field!r} field",
                                "choose the field with --text-field")
            yield str(record[field])


UTF8_HINT = "save the file as UTF-8 text (e.g. iconv -f latin1 -t utf-8 FILE > NEW)"


def utf8_text(data: bytes, path: str | Path, lineno: int | None = None) -> str:
    """``data`` (all of ``path``, or its line ``lineno``) decoded as UTF-8; a DataError
    naming the file, line and byte where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lineno if lineno is not None else data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})",
                        UTF8_HINT) from None


def json_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line of a JSON Lines file, read as UTF-8
    (a DataError naming the file and line where it is not)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = utf8_text(raw, path, lineno)
            if line.strip():
                yield lineno, line


def read_hf_dataset(name: str, split: str, field: str = "text",
                    max_docs: int | None = None) -> Iterator[str]:
    """Documents from a Hugging Face dataset (e.g. roneneldan/TinyStories), streamed."""
    try:
        # Lazy: an optional package, needed only for --hf-dataset.
        from datasets import load_dataset  # type: ignore[import-not-found]
    except ImportError as e:
        raise DataError(f"--hf-dataset {name} needs the 'datasets' package, which is not installed",
                        "pip install datasets, or use text/JSONL files or the offline corpus") from e
    try:
        ds = load_dataset(name, split=split, streaming=True)
        for i, record in enumerate(ds):
            if max_docs is not None and i >= max_docs:
                break
            yield str(record[field])
    except (OSError, ConnectionError, ValueError) as e:
        raise DataError(f"could not read dataset {name!r} split {split!r}: {e}",
                        "check the network and the name, or use local files") from e


# ---------------------------------------------------------------- writing


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def write_token_files(documents: Iterable[str], tokenizer, out_dir: str | Path,
                      val_every: int = 20, source: str = "") -> dict:
    """Tokenize `documents` into out_dir/{train,val}.bin + meta.json; return the metadata.

    Every `val_every`-th document goes to validation (deterministic, no shuffle
    needed). The directory appears atomically: it is written under a temporary
    name beside `out_dir` and renamed at the end.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; token files are meant to be shared
    try:
        counts = {"train": [0, 0], "val": [0, 0]}
        with open(tmp / "train.bin", "wb") as ftrain, open(tmp / "val.bin", "wb") as fval:
            for i, doc in enumerate(documents):
                split = "val" if val_every > 0 and i % val_every == val_every - 1 else "train"
                ids = tokenizer.encode(doc) + [tokenizer.eos_id]
                np.asarray(ids, dtype=dtype).tofile(fval if split == "val" else ftrain)
                counts[split][0] += len(ids)
                counts[split][1] += 1
        if counts["train"][0] == 0:
            raise DataError("the corpus produced no training tokens", "check the input files")
        meta = {
            "format": FORMAT,
            "dtype": dtype.name,
            "vocab_size": tokenizer.vocab_size,
            "eos_id": tokenizer.eos_id,
            "tokenizer": tokenizer.describe(),
            "splits": {s: {"file": f"{s}.bin", "tokens": c[0], "documents": c[1],
                           "bytes": (tmp / f"{s}.bin").stat().st_size,
                           "sha256": file_sha256(tmp / f"{s}.bin")}
                       for s, c in counts.items()},
            "source": source,
        }
        if hasattr(tokenizer, "save_files"):
            tokenizer.save_files(tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def write_row_files(splits: dict[str, list[tuple[list[int], int]]], tokenizer,
                    out_dir: str | Path, source: str = "", extra: dict | None = None) -> dict:
    """Rows (ids, offset) of each split into out_dir/{split}.bin + meta.json (ROWS_FORMAT);
    the directory appears atomically, as with write_token_files."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    if not splits.get("train"):
        raise DataError("the data has no training rows", "check the input files")
    splits = {"train": splits["train"], "val": splits.get("val", []), **splits}  # val, maybe empty
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    os.chmod(tmp, 0o755)
    try:
        info = {}
        for name, rows in splits.items():
            lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            offsets = np.array([off for _, off in rows], dtype=np.int64)
            table = np.stack([starts, lengths, offsets], axis=1) if rows else np.zeros((0, 3), np.int64)
            tokens = np.asarray([i for ids, _ in rows for i in ids], dtype=dtype)
            path = tmp / f"{name}.bin"
            with open(path, "wb") as f:
                tokens.tofile(f)
                index_offset = -(-tokens.nbytes // 8) * 8
                f.write(b"\0" * (index_offset - tokens.nbytes))
                table.astype("<i8").tofile(f)
            trained = np.maximum(0, lengths - np.maximum(offsets, 1))
            info[name] = {"file": path.name, "tokens": int(lengths.sum()), "rows": len(rows),
                          "documents": len(rows), "trained_tokens": int(trained.sum()),
                          "untrained_rows": int((trained == 0).sum()),
                          "max_length": int(lengths.max()) if rows else 0,
                          "index_offset": index_offset, "bytes": path.stat().st_size,
                          "sha256": file_sha256(path)}
        meta = {"format": ROWS_FORMAT, "dtype": dtype.name, "vocab_size": tokenizer.vocab_size,
                "eos_id": tokenizer.eos_id, "tokenizer": tokenizer.describe(),
                "splits": info, "source": source, **(extra or {})}
        if hasattr(tokenizer, "save_files"):
            tokenizer.save_files(tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


# ---------------------------------------------------------------- reading


class TokenSplit:
    """One split of a token directory, memory-mapped: a rank reads only the rows it asks for.

    After copying rows out, their pages are released from this process's mapping
    (MADV_DONTNEED; the OS page cache keeps them). Why: on Linux 6.x with large
    folios, touching one 258-byte sequence mapped ~0.5 MB of file pages into the
    process (measured), so resident memory grew batch after batch with the
    dataset, although it was only clean, shared cache.
    """

    def __init__(self, path: str | Path, dtype: np.dtype, block_size: int):
        self.block_size = block_size
        self.itemsize = np.dtype(dtype).itemsize
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.tokens = (np.frombuffer(self._mmap, dtype=dtype) if self._mmap is not None
                       else np.zeros(0, dtype=dtype))

    @property
    def n_sequences(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def read(self, indices: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets, int32 (len(indices), block_size), for these sequences only."""
        L = self.block_size
        rows = []
        for i in indices:
            start = int(i) * L
            rows.append(self.tokens[start: start + L + 1].astype(np.int32))
            self._release(start * self.itemsize, (L + 1) * self.itemsize)
        batch = np.stack(rows)
        return batch[:, :-1], batch[:, 1:]

    def _release(self, offset: int, length: int) -> None:
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + length, len(self._mmap))
        self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)


class RowSplit:
    """One split of rows data (ROWS_FORMAT), memory-mapped: sequence i is row i, cut to
    block_size + 1 ids, padded; `read` also gives which targets are trained."""

    masked = True

    def __init__(self, path: str | Path, dtype: np.dtype, block_size: int, info: dict):
        self.block_size = block_size
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        n_rows = info["rows"]
        if self._mmap is None:
            self.tokens, self.index = np.zeros(0, dtype=dtype), np.zeros((0, 3), dtype=np.int64)
        else:
            self.tokens = np.frombuffer(self._mmap, dtype=dtype, count=info["tokens"])
            self.index = np.frombuffer(self._mmap, dtype="<i8", count=3 * n_rows,
                                       offset=info["index_offset"]).reshape(n_rows, 3)
        lengths = self.index[:, 1]
        self.lengths = np.minimum(lengths, block_size + 1)
        self.cut = int((lengths > block_size + 1).sum())
        # trained targets of each row (j in [max(offset, 1), length) after the cut)
        self.trained = np.maximum(0, self.lengths - np.maximum(self.index[:, 2], 1))

    @property
    def n_sequences(self) -> int:
        return len(self.index)

    def trained_tokens(self, indices) -> int:
        return int(self.trained[np.asarray(indices, dtype=np.int64)].sum())

    def read(self, indices: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Inputs, targets (int32) and the trained mask (float32), each (len(indices), block_size)."""
        indices = [int(i) for i in indices]
        L = self.block_size
        x = np.zeros((len(indices), L), dtype=np.int32)
        y = np.zeros((len(indices), L), dtype=np.int32)
        mask = np.zeros((len(indices), L), dtype=np.float32)
        for r, i in enumerate(indices):
            start, _, offset = (int(v) for v in self.index[i])
            n = int(self.lengths[i])
            ids = self.tokens[start: start + n].astype(np.int32)
            x[r, :n - 1], y[r, :n - 1] = ids[:-1], ids[1:]
            mask[r, max(offset, 1) - 1: n - 1] = 1.0  # position p predicts ids[p + 1]
        return x, y, mask


class PairSplit:
    """A split of preference pairs (module docstring): pair i is rows 2i (chosen) and 2i + 1
    (rejected) of a RowSplit; `read` gives both, each as RowSplit.read does."""

    masked = False  # the masks stay 0/1: no weights scaled to the global batch (weighted)
    pairs = True

    def __init__(self, rows: RowSplit):
        self.rows, self.block_size, self.cut = rows, rows.block_size, rows.cut

    @property
    def n_sequences(self) -> int:
        return self.rows.n_sequences // 2

    def trained_tokens(self, indices) -> int:
        pairs = 2 * np.asarray(indices, dtype=np.int64)
        return self.rows.trained_tokens(pairs) + self.rows.trained_tokens(pairs + 1)

    def read(self, indices: Iterable[int]) -> tuple[np.ndarray, ...]:
        """(chosen inputs, targets, mask, rejected inputs, targets, mask), each
        (len(indices), block_size)."""
        pairs = [2 * int(i) for i in indices]
        return (*self.rows.read(pairs), *self.rows.read([i + 1 for i in pairs]))


def weighted(split, rows: tuple, global_indices) -> tuple:
    """A rows batch's mask scaled so that the loss is the mean over the global batch's
    trained targets (module docstring); text batches as they are."""
    if not getattr(split, "masked", False):
        return rows
    x, y, mask = rows
    n = split.trained_tokens(global_indices)
    scale = len(global_indices) * split.block_size / n if n else 0.0
    return x, y, mask * np.float32(scale)


def load_meta(data_dir: str | Path) -> dict:
    """meta.json of a token directory, checked."""
    path = Path(data_dir) / "meta.json"
    if not path.exists():
        raise DataError(f"{path} not found",
                        f"create it with: python -m reference_train.prepare --out {data_dir}")
    meta = json.loads(path.read_text())
    if meta.get("format") not in (FORMAT, ROWS_FORMAT):
        raise DataError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r} "
                        f"or {ROWS_FORMAT!r}")
    return meta


def open_split(data_dir: str | Path, split: str, block_size: int) -> TokenSplit | RowSplit:
    """Memory-map one split of a token (or rows) directory."""
    meta = load_meta(data_dir)
    info = meta["splits"][split]
    if meta["format"] == ROWS_FORMAT:
        rows = RowSplit(Path(data_dir) / info["file"], np.dtype(meta["dtype"]), block_size, info)
        return PairSplit(rows) if meta.get("preference") else rows
    return TokenSplit(Path(data_dir) / info["file"], np.dtype(meta["dtype"]), block_size)


# ---------------------------------------------------------------- sharding


@dataclass(frozen=True)
class EpochPlan:
    """How many optimizer steps an epoch holds, and how many sequences it drops."""

    n_sequences: int
    global_batch: int

    @property
    def steps_per_epoch(self) -> int:
        return self.n_sequences // self.global_batch

    @property
    def dropped(self) -> int:
        return self.n_sequences - self.steps_per_epoch * self.global_batch


def split_batch(global_batch: int, world: int, grad_accum: int = 1) -> int:
    """Sequences per rank per micro-step; ValueError showing the arithmetic when it does not divide."""
    if global_batch <= 0 or world <= 0 or grad_accum <= 0:
        raise ValueError(f"global_batch {global_batch}, ranks {world} and grad_accum "
                         f"{grad_accum} must all be positive")
    per_rank, rest = divmod(global_batch, world * grad_accum)
    if rest:
        raise ValueError(
            f"global_batch {global_batch} does not split evenly: ranks {world} x grad_accum "
            f"{grad_accum} = {world * grad_accum}, and {global_batch} % {world * grad_accum} "
            f"= {rest}; choose a global_batch that is a multiple of {world * grad_accum}")
    return per_rank


def epoch_order(n_sequences: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled sequence indices of one epoch; the same on every rank for (seed, epoch)."""
    dtype = np.uint32 if n_sequences < 2**32 else np.uint64  # 4 bytes a sequence
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(n_sequences).astype(dtype)


def rank_indices(order: np.ndarray, step_in_epoch: int, global_batch: int,
                 rank: int, size: int) -> np.ndarray:
    """Sequence indices rank `rank` of `size` uses at one step of the epoch."""
    per_rank = global_batch // size
    start = step_in_epoch * global_batch + rank * per_rank
    return order[start: start + per_rank]


class ShardedBatches:
    """Training batches for one rank: step -> (inputs, targets) of global_batch / size rows.

    The position in the data is a pure function of the global step, so a resumed
    run (even with another number of ranks) continues exactly where it stopped.
    """

    def __init__(self, split: TokenSplit, global_batch: int, group: Group, seed: int):
        self.split = split
        self.global_batch = global_batch
        self.rank, self.size = group.rank(), group.size()
        self.per_rank = split_batch(global_batch, self.size)
        self.seed = seed
        self.plan = EpochPlan(split.n_sequences, global_batch)
        if self.plan.steps_per_epoch == 0:
            raise DataError(f"the training split has {split.n_sequences} sequences of "
                            f"{split.block_size} tokens, fewer than one global batch "
                            f"({global_batch})", "use more data, or a smaller block_size or global_batch")
        self._epoch = -1
        self._order: np.ndarray | None = None

    def position(self, step: int) -> dict:
        """Where global step `step` (0-based) reads: epoch and step within it."""
        epoch, in_epoch = divmod(step, self.plan.steps_per_epoch)
        return {"epoch": epoch, "step_in_epoch": in_epoch, "seed": self.seed}

    def indices(self, step: int) -> np.ndarray:
        pos = self.position(step)
        if pos["epoch"] != self._epoch:
            self._order = epoch_order(self.plan.n_sequences, self.seed, pos["epoch"])
            self._epoch = pos["epoch"]
        return rank_indices(self._order, pos["step_in_epoch"], self.global_batch,
                            self.rank, self.size)

    def batch(self, step: int) -> tuple[np.ndarray, ...]:
        """(inputs, targets), and for rows data the weights of the trained targets."""
        rows = self.split.read(self.indices(step))
        if not getattr(self.split, "masked", False):
            return rows
        return weighted(self.split, rows, self.global_indices(step))

    def global_indices(self, step: int) -> np.ndarray:
        """Every rank's sequences of global step `step`."""
        self.indices(step)  # the epoch's order
        in_epoch = self.position(step)["step_in_epoch"]
        return self._order[in_epoch * self.global_batch: (in_epoch + 1) * self.global_batch]

    def trained_tokens(self, step: int) -> int:
        """Targets trained in global step `step` (all of them for text data)."""
        if not hasattr(self.split, "trained_tokens"):
            return self.global_batch * self.split.block_size
        return self.split.trained_tokens(self.global_indices(step))


def validation_batches(split: TokenSplit | RowSplit, global_batch: int, group: Group,
                       max_batches: int) -> Iterator[tuple[np.ndarray, ...]]:
    """The first `max_batches` global batches of validation, in order, this rank's slice."""
    rank, size = group.rank(), group.size()
    per_rank = global_batch // size
    n = min(max_batches, split.n_sequences // global_batch)
    for b in range(n):
        start = b * global_batch + rank * per_rank
        rows = split.read(range(start, start + per_rank))
        yield weighted(split, rows, range(b * global_batch, (b + 1) * global_batch))
