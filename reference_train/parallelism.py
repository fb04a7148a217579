"""How a run is parallelised: the part the Trainer holds (`Parallelism`), which it never
asks which it is, and the choice of it (`make_parallelism`).

    part = make_parallelism(cfg, group, backend, meta, log)
        data_parallel.DataParallel   every rank the whole model, its share of each batch
        pipeline_setup.Pipeline      --pipeline N: every rank one stage of a pipeline copy

A part builds what differs between the two (the model, the optimizer's state, the
step function, the counts), and says where and what a rank checkpoints, how a resume
finds and loads its checkpoint, how the run is exported and what the log says of it.
The Trainer (train.py) does the rest alike for both: the data, the loop, the
checkpoints' common state, the resume's agreement, the log's other lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import mlx.nn as nn

from .config import TrainConfig
from .data_parallel import DataParallel
from .loop import StepFunction
from .pipeline_setup import Pipeline
from .resume import HostLayout, Loaded


class Parallelism(Protocol):
    """What a run's parallelism does for the Trainer. Methods marked collective are
    called by every rank at the same point."""

    data_group: object  # the ranks that share each global batch's rows
    lora: bool  # --fine_tune lora or dora: only the adapters train (and are saved)
    no_sample: str | None  # why rank 0 cannot sample the trained model, or None
    objective: object  # what the step minimises (objectives.py), its metrics summarized by the loop

    def place(self, layout: HostLayout) -> HostLayout:
        """Given which ranks see the same --out: the layout of this rank's checkpoint
        writers (HostLayout.writes: whether this rank writes)."""

    def checkpoints(self, root: Path) -> Path:
        """This rank's checkpoint folder under OUT/checkpoints (`root`)."""

    def build(self, data_dir: Path) -> tuple[nn.Module, nn.Module]:
        """(the float32 master model this rank holds, the model the passes run on:
        itself, or its bfloat16 copy)."""

    def init_optimizer(self, optimizer, model: nn.Module):
        """`optimizer` initialised for what this rank updates (or wrapped: each rank's
        share of its state); what the loop and the checkpoints are handed."""

    def make_step(self, model: nn.Module, compute: nn.Module) -> StepFunction:
        """The step function (loop.py's contract, with its validation `loss`)."""

    def counts(self, model: nn.Module) -> tuple[int, int]:
        """(the whole model's parameters, its trainable ones): collective."""

    def saved_optimizer(self, optimizer):
        """What a checkpoint saves of `optimizer` (its `state`): collective."""

    def state(self) -> dict:
        """What this rank's state.json says besides the common state."""

    def mirror(self, saved: Path) -> None:
        """After checkpoint `saved` was written: any copy kept elsewhere (collective)."""

    def find(self, root: Path, only: int | None, layout_of):
        """What to resume from `root` (step `only`, or the newest), or None: collective.
        `layout_of(root)`: which ranks see `root` (collective)."""

    def load(self, found, model: nn.Module, optimizer, check) -> Loaded:
        """`found` loaded into `model` and `optimizer`; `check(state, where)` raises
        unless the checkpoint is this run's model and fine-tuning."""

    def export(self, model: nn.Module, args, saved: Path, data_dir: Path) -> None:
        """OUT/model or OUT/adapters, after the last checkpoint (`saved`, this rank's
        folder of it) was written: collective."""

    def announce(self, model: nn.Module) -> None:
        """This rank's own line (stdout), if it has one."""

    def describe(self, micro_batch: int) -> tuple[str, list[str]]:
        """(how a global batch is split over the ranks, the log's lines of this part)."""

    def mirrors(self) -> list[str]:
        """The log's lines on the checkpoints kept elsewhere."""

    def reduction(self) -> str:
        """How the gradients are averaged, for the log."""

    def sample(self, model: nn.Module, ids: list[int], tokens: int, key) -> list[int] | None:
        """`tokens` ids the trained model draws after `ids`; None: see no_sample."""


def make_parallelism(cfg: TrainConfig, group, backend: str, meta: dict, log) -> Parallelism:
    """A Pipeline with --pipeline N > 1 (its refusals before anything loads), else
    data-parallel."""
    if cfg.pipeline > 1:
        return Pipeline(cfg, group, backend, meta, log)
    return DataParallel(cfg, group, backend, meta, log)
