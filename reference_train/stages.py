"""Pipeline stages: which of the model's blocks each rank holds (pipeline.py runs them).

    --pipeline N              N stages, contiguous blocks, balanced by the bytes each holds
    --pipeline_split a,b,...  the blocks per stage, in order (Macs of different memory)

The first stage also holds the embedding, the last the final norm and the head;
with tied embeddings the last holds a copy of the embedding matrix for its head
(pipeline.py keeps the copy equal to the first stage's). A stage's bytes are
what it holds in memory: float weights as float32 master weights (whatever the
folder stores), quantized ones packed as they are. A model folder's bytes come
from the safetensors headers alone (`folder_bytes`): nothing is loaded, and
nothing here imports mlx, so `mlxcluster train` can plan the stages (and check
them against each host's memory) before launching anything.

Example: a 4-block model of 10 MB blocks, a 20 MB embedding and a 20 MB head
(untied) over 2 stages balances as blocks 0-1 (40 MB: embedding and 2 blocks)
and 2-3 (40 MB: 2 blocks and the head); `--pipeline_split 1,3` asks for 30 and
50 MB instead.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError

# Bytes per element of safetensors dtypes; floats are held as float32 (the master weights).
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2,
             "U32": 4, "I32": 4, "U64": 8, "I64": 8}
_FLOATS = ("F16", "BF16", "F32", "F64")
_BLOCK = re.compile(r"model\.layers\.(\d+)\.")
_EMBEDDING = "model.embed_tokens."
_HEAD = ("model.norm.", "lm_head.")
INDEX = "model.safetensors.index.json"
# Backends whose groups split (Group.split), so that a world of N x R ranks could
# hold R pipelines of N stages (docs/training-pipeline.md, "Pipelines x replicas").
SPLITTABLE_BACKENDS = ("mpi", "nccl")


@dataclass(frozen=True)
class ModelBytes:
    """What the parts of a model hold in memory, in bytes."""

    embedding: int
    blocks: tuple[int, ...]
    head: int  # the final norm, and the output matrix when not tied
    tied: bool  # the head is the embedding matrix: the last stage holds a copy


@dataclass(frozen=True)
class StagePlan:
    """One stage: its place, its blocks, what else it holds and how many bytes."""

    index: int
    count: int
    blocks: range
    embedding: bool  # the embedding matrix (the first stage; the last too when tied)
    head: bool  # the final norm and the head (the last stage)
    bytes: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def describe(self, n_blocks: int) -> str:
        """'stage 2 of 2: blocks 2-3 of 4, the final norm and head, 1.5 MiB'."""
        held = [f"blocks {self.blocks.start}-{self.blocks.stop - 1}" if len(self.blocks) > 1
                else f"block {self.blocks.start}"]
        held[0] += f" of {n_blocks}"
        if self.first:
            held.insert(0, "the embedding")
        elif self.embedding:
            held.append("a copy of the tied embedding")
        if self.head:
            held.append("the final norm and head")
        return f"stage {self.index + 1} of {self.count}: {', '.join(held)}, " \
               f"{self.bytes / 2**20:.1f} MiB of weights"


def check_micro_batches(micro_batches: int, global_batch: int) -> None:
    """A DataError unless `micro_batches` (--micro_batches) splits the global batch."""
    if micro_batches < 1:
        raise DataError(f"--micro_batches {micro_batches}: give at least 1",
                        "give the number of stages or more: the bubble shrinks as it grows")
    if global_batch % micro_batches:
        raise DataError(f"--micro_batches {micro_batches} does not divide global_batch "
                        f"{global_batch}", "give a divisor of global_batch")


def default_micro_batches(n_stages: int, global_batch: int) -> int:
    """--micro_batches when not given: the fewest, at least one per stage, that divide
    the global batch (every row its own micro-batch when none does)."""
    return next((m for m in range(n_stages, global_batch + 1) if global_batch % m == 0),
                global_batch)


SCHEDULES = ("1f1b", "gpipe")


def check_schedule(kind: str) -> None:
    if kind not in SCHEDULES:
        raise DataError(f"--pipeline_schedule {kind}: must be one of {', '.join(SCHEDULES)}")


def schedule(kind: str, stage: int, n_stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage `stage`'s passes in order: ("F", m) the forward of micro-batch m, ("B", m)
    its backward. GPipe: every forward, then every backward. 1F1B (one forward, one
    backward): N - 1 - stage forwards to fill the pipeline, then a forward and a
    backward in turn, then the backwards left; the same bubble as GPipe, but at most
    N - stage micro-batches' activations held at once instead of M."""
    check_schedule(kind)
    forwards = [("F", m) for m in range(micro_batches)]
    backwards = [("B", m) for m in range(micro_batches)]
    if kind == "gpipe":
        return forwards + backwards
    warmup = min(n_stages - 1 - stage, micro_batches)
    order = forwards[:warmup]
    for m in range(micro_batches - warmup):
        order += [forwards[warmup + m], backwards[m]]
    return order + backwards[micro_batches - warmup:]


def held_at_once(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose activations a stage holds at once in `order`."""
    held = most = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


def bubble_fraction(n_stages: int, micro_batches: int) -> float:
    """The share of a step each stage idles, GPipe or 1F1B: (N - 1) / (M + N - 1)."""
    return (n_stages - 1) / (micro_batches + n_stages - 1)


# ---------------------------------------------------------------- the split


def parse_split(text: str) -> list[int]:
    """--pipeline_split "2,3,3" -> [2, 3, 3]; a DataError for anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise DataError(f"--pipeline_split {text}: expected whole numbers of blocks per stage, "
                        "each at least 1, separated by commas", "for example --pipeline_split 2,3,3")
    return [int(p) for p in parts]


def plan_stages(sizes: ModelBytes, n_stages: int, split: list[int] | None = None) -> list[StagePlan]:
    """The N stages: `split` (blocks per stage) when given, else contiguous blocks whose
    largest stage (embedding and head included) is as small as it can be. A DataError
    for more stages than blocks, or a split that does not name N stages or add up."""
    n_blocks = len(sizes.blocks)
    if n_stages < 1:
        raise DataError(f"--pipeline {n_stages}: give at least 1 stage")
    if n_stages > n_blocks:
        raise DataError(f"--pipeline {n_stages}: the model has {n_blocks} blocks, and each "
                        f"stage holds at least one", f"use --pipeline {n_blocks} or fewer")
    if split is not None:
        if len(split) != n_stages:
            raise DataError(f"--pipeline_split {','.join(map(str, split))} names {len(split)} "
                            f"stages, but --pipeline is {n_stages}",
                            "give one number of blocks per stage")
        if sum(split) != n_blocks:
            raise DataError(f"--pipeline_split {','.join(map(str, split))} adds up to "
                            f"{sum(split)} blocks, but the model has {n_blocks}",
                            f"give numbers that add up to {n_blocks}")
    else:
        split = balanced_split(sizes, n_stages)
    plans, start = [], 0
    for index, count in enumerate(split):
        blocks = range(start, start + count)
        start += count
        plans.append(StagePlan(index, n_stages, blocks,
                               embedding=index == 0 or (sizes.tied and index == n_stages - 1),
                               head=index == n_stages - 1,
                               bytes=stage_bytes(sizes, blocks, index, n_stages)))
    return plans


def stage_bytes(sizes: ModelBytes, blocks: range, index: int, n_stages: int) -> int:
    """The bytes stage `index` holds with `blocks`."""
    held = sum(sizes.blocks[i] for i in blocks)
    if index == 0:
        held += sizes.embedding
    if index == n_stages - 1:
        held += sizes.head + (sizes.embedding if sizes.tied and n_stages > 1 else 0)
    return held


def balanced_split(sizes: ModelBytes, n_stages: int) -> list[int]:
    """Blocks per stage minimising the largest stage's bytes (a linear partition,
    dynamic programming over where each stage ends; ties go to the earlier end)."""
    n = len(sizes.blocks)
    prefix = [0]
    for b in sizes.blocks:
        prefix.append(prefix[-1] + b)

    def cost(stage: int, start: int, end: int) -> int:
        return stage_bytes(sizes, range(start, end), stage, n_stages)

    # best[s][j]: the smallest largest stage when stages 0..s hold blocks 0..j-1
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages)]
    cut = [[0] * (n + 1) for _ in range(n_stages)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, 0, j)
    for s in range(1, n_stages):
        for j in range(s + 1, n + 1):
            for i in range(s, j):
                worst = max(best[s - 1][i], cost(s, i, j))
                if worst < best[s][j]:
                    best[s][j], cut[s][j] = worst, i
    counts, end = [], n
    for s in range(n_stages - 1, 0, -1):
        start = cut[s][end]
        counts.append(end - start)
        end = start
    counts.append(end)
    return counts[::-1]


def check_world(n_stages: int, world_size: int, backend: str) -> None:
    """A DataError unless the world is one pipeline (one rank per stage), or R copies
    of it (N x R ranks) on a backend whose groups split (MPI)."""
    if world_size == n_stages:
        return
    if world_size % n_stages or world_size < n_stages:
        raise DataError(f"--pipeline {n_stages} needs {n_stages} ranks, one per stage (or a "
                        f"multiple of {n_stages} on MPI: copies of the pipeline); this run "
                        f"has {world_size}", f"launch {n_stages} ranks")
    if backend not in SPLITTABLE_BACKENDS:
        copies = world_size // n_stages
        raise DataError(f"{world_size} ranks with --pipeline {n_stages} would be {copies} "
                        f"copies of the pipeline, but the {backend} backend cannot split a "
                        "group (Group.split), so the world size must equal the number of "
                        "stages", f"launch {n_stages} ranks, one per stage; or run the "
                        f"{copies} copies over MPI (--backend mpi), whose groups split")


# ---------------------------------------------------------------- a folder's bytes


def safetensors_header(path: Path) -> dict:
    """A safetensors file's header (name -> dtype, shape, offsets), read without its data."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as e:
        raise DataError(f"{path} cannot be read as safetensors: {e}") from None
    header.pop("__metadata__", None)
    return header


def index_map(folder: str | Path) -> dict[str, str] | None:
    """model.safetensors.index.json's weight map (tensor name -> file name), or None
    for a folder without an index (its model*.safetensors then hold every tensor)."""
    index = Path(folder) / INDEX
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return {str(name): str(f) for name, f in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{index} cannot be read: {e}") from None


def tensor_files(folder: str | Path, partial: bool = False) -> dict[str, Path]:
    """Every tensor's name -> the file holding it: from model.safetensors.index.json,
    else from the headers of model*.safetensors. A file the index lists but the folder
    lacks is a DataError, unless `partial` (a pipeline host's copy holds only the files
    of its stage's tensors: mlxcluster train sends it no more)."""
    folder = Path(folder)
    weight_map = index_map(folder)
    if weight_map is not None:
        absent = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
        if absent and not partial:
            raise DataError(f"{folder / INDEX} lists {', '.join(absent)}, not in {folder}",
                            "download every shard of the checkpoint")
        return {name: folder / f for name, f in weight_map.items()}
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise DataError(f"{folder}: no model.safetensors (nor model.safetensors.index.json)",
                        "give a folder with safetensors weights")
    return {name: f for f in files for name in safetensors_header(f)}


def held_bytes(spec: dict) -> int:
    """The bytes one tensor (a header entry) takes as the trainer holds it."""
    count = 1
    for d in spec["shape"]:
        count *= d
    dtype = spec["dtype"]
    return count * (4 if dtype in _FLOATS else _ITEMSIZE.get(dtype, 4))


def folder_bytes(folder: str | Path, partial: bool = False) -> ModelBytes:
    """The bytes of a model folder's embedding, each block and head, from the headers.
    `partial`: the folder may lack files its index lists (a pipeline host's copy,
    tensor_files); their tensors then count 0 bytes, so plan such a folder's stages
    with the split given (--pipeline_split: mlxcluster train passes the one it
    planned from the whole folder), never balanced from these bytes."""
    folder = Path(folder)
    files = tensor_files(folder, partial)
    specs: dict[str, dict] = {}
    for f in sorted(set(files.values())):
        if f.is_file() or not partial:
            specs.update(safetensors_header(f))
    embedding, head, blocks = 0, 0, {}
    for name in files:
        size = held_bytes(specs[name]) if name in specs else 0
        if m := _BLOCK.match(name):
            blocks[int(m.group(1))] = blocks.get(int(m.group(1)), 0) + size
        elif name.startswith(_EMBEDDING):
            embedding += size
        elif name.startswith(_HEAD):
            head += size
    try:
        tie = json.loads((folder / "config.json").read_text()).get("tie_word_embeddings")
    except (OSError, ValueError):
        tie = None
    tied = bool(tie) if tie is not None else "lm_head.weight" not in files
    if tied:  # a tied folder's lm_head, when present, is dropped on loading (hf_io.load_folder)
        head -= sum(held_bytes(specs[n]) for n in files if n.startswith("lm_head.") and n in specs)
    return ModelBytes(embedding, tuple(blocks.get(i, 0) for i in range(len(blocks))), head, tied)


def absent_files(folder: str | Path) -> list[str]:
    """The files the folder's index lists that the folder lacks (none without an index)."""
    weight_map = index_map(folder) or {}
    return sorted({f for f in weight_map.values() if not (Path(folder) / f).is_file()})


# ---------------------------------------------------------------- a stage's files


def stage_tensor(name: str, plan: StagePlan) -> bool:
    """Whether the stage of `plan` reads tensor `name` (a Hugging Face name) from the
    folder: a block's tensors its blocks' own, the embedding the first stage's (and
    the last's, tied), the final norm and head the last's; a tensor of no part (none
    in a folder we load) every stage's, so that each rank reads it and says so."""
    if m := _BLOCK.match(name):
        return int(m.group(1)) in plan.blocks
    if name.startswith(_EMBEDDING):
        return plan.embedding
    if name.startswith(_HEAD):
        return plan.head
    return True


def stage_files(weight_map: dict[str, str], plan: StagePlan) -> frozenset[str]:
    """The files of an index's `weight_map` (tensor -> file) holding a tensor the
    stage of `plan` reads: all a host running that stage needs of the weights."""
    return frozenset(f for name, f in weight_map.items() if stage_tensor(name, plan))
