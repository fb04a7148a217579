"""`mlxcluster train -- --pipeline N`: the stages placed on the hosts.

The trainer's pipeline flags come after `--`, as all its flags:

    --pipeline N              N stages, one rank each (1: no pipeline)
    --pipeline_split a,b,...  the blocks per stage (moves blocks off a small Mac)
    --micro_batches M         micro-batches per step (default: the fewest, at least N)
    --pipeline_schedule S     1f1b or gpipe

Rank r runs stage r on the job's r-th host (the inventory's order, as -i
lists the hosts). Before anything starts on a host, ``check_pipeline``
(exit 2) checks what this machine alone can: the world size against N (on
ring and JACCL it must equal N: their groups do not split), the split
against the model's blocks (read from --init_from's safetensors headers
here), the micro-batches against the global batch. Then, once the job's
python is found on every host and before anything is sent,
``check_stages`` asks every host for its memory facts (the probe `serve`
uses) and judges each stage against its host (stage_fit.py): a stage that
does not fit is exit 2, naming the stage, the host, the bytes and the ways
out.

With ``--elastic``, a dropped host makes the pipeline one stage shorter:
``resplit`` plans the blocks over the hosts left (balanced by bytes when
that fits them, else a split that fits each), or stops naming why.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.facts.facts import HostFacts
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job
from mlxcluster.launch.stage_fit import (
    fitting_split,
    held_while_training,
    judge_stages,
    needs,
    refusal_text,
    what_it_holds_of,
)
from mlxcluster.serve.split import budget, gib
from reference_train.config import TrainConfig
from reference_train.errors import DataError
from reference_train.stages import (
    ModelBytes,
    StagePlan,
    check_micro_batches,
    check_schedule,
    check_world,
    default_micro_batches,
    folder_bytes,
    parse_split,
    plan_stages,
)


@dataclass(frozen=True)
class Pipeline:
    """The trainer's pipeline flags, as the ranks will read them."""

    stages: int = 1  # 1: no pipeline
    split: tuple[int, ...] | None = None
    micro_batches: int = 0  # 0: the trainer's default (stages.default_micro_batches)
    schedule: str = "1f1b"

    @property
    def on(self) -> bool:
        return self.stages > 1

    def micro_batches_for(self, global_batch: int) -> int:
        return self.micro_batches or default_micro_batches(self.stages, global_batch)


def input_error(err: DataError) -> InputError:
    """The trainer's DataError as mlxcluster's exit 2, its hint kept."""
    return InputError(err.args[0], err.hint or None)


# --- until config.py has the fields (branch pp-trainer): read from the argv as the ranks do
PIPELINE_FIELDS = ("pipeline", "pipeline_split", "micro_batches", "pipeline_schedule")
CONFIG_HAS_PIPELINE = "pipeline" in TrainConfig.__dataclass_fields__


def pipeline_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pipeline", default="1")
    parser.add_argument("--pipeline_split", default="")
    parser.add_argument("--micro_batches", default="0")
    parser.add_argument("--pipeline_schedule", default="1f1b")
    return parser


def without_pipeline_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` without the pipeline flags (for a config.py that does not know them)."""
    return list(argv) if CONFIG_HAS_PIPELINE else pipeline_parser().parse_known_args(list(argv))[1]


def whole_number(flag: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"trainer arguments rejected: --{flag} {text}: not a whole number",
                         f"give --{flag} a whole number, e.g. --{flag} 2") from None
    if value < least:
        raise InputError(f"trainer arguments rejected: --{flag} {value}: must be at least {least}",
                         f"give --{flag} {least} or more")
    return value


def pipeline_of(cfg: TrainConfig, argv: Sequence[str]) -> Pipeline:
    """The pipeline the ranks will run: from the config's fields, or (a
    config.py without them) from ``argv`` as the ranks read it, the last
    value of a flag winning. InputError (exit 2) for a value that is not one."""
    if CONFIG_HAS_PIPELINE:
        values = {name: getattr(cfg, name) for name in PIPELINE_FIELDS}
    else:
        values = vars(pipeline_parser().parse_known_args(list(argv))[0])
    stages = whole_number("pipeline", str(values["pipeline"]), 1)
    micro = whole_number("micro_batches", str(values["micro_batches"]), 0)
    try:
        split = tuple(parse_split(values["pipeline_split"])) if values["pipeline_split"] else None
        check_schedule(values["pipeline_schedule"])
    except DataError as err:
        raise input_error(err) from None
    return Pipeline(stages, split, micro, values["pipeline_schedule"])


# --- before anything starts: what this machine alone can check


def model_sizes(cfg: TrainConfig) -> ModelBytes | None:
    """The bytes of --init_from's embedding, blocks and head, from its headers
    here (None for a model built from scratch: no folder to read)."""
    if not cfg.init_from:
        return None
    try:
        return folder_bytes(cfg.init_from)
    except DataError as err:
        raise input_error(err) from None


def plan_for(cfg: TrainConfig, pipeline: Pipeline, n_stages: int | None = None) -> list[StagePlan]:
    """The stages the ranks will plan (stages.plan_stages, as they do), over
    --init_from's bytes, or a from-scratch model's --n_layers blocks (their
    bytes then not known here: 0)."""
    sizes = model_sizes(cfg) or ModelBytes(0, (0,) * cfg.n_layers, 0, cfg.tie_embeddings)
    split = list(pipeline.split) if pipeline.split is not None else None
    try:
        return plan_stages(sizes, n_stages or pipeline.stages, split)
    except DataError as err:
        raise input_error(err) from None


def check_pipeline(cfg: TrainConfig, pipeline: Pipeline, ranks: int, backend: str) -> None:
    """InputError (exit 2) when ``ranks`` on ``backend`` cannot run ``pipeline``:
    the world size against the stages, the split against the model's blocks,
    the micro-batches against the global batch. Before any ssh: all of it is known here."""
    plan_for(cfg, pipeline)  # first: more stages than blocks is no matter of ranks
    try:
        check_world(pipeline.stages, ranks, backend)
    except DataError as err:
        raise InputError(f"{err.args[0]} ({ranks} rank(s) on {backend})", err.hint) from None
    try:
        check_micro_batches(pipeline.micro_batches_for(cfg.global_batch), cfg.global_batch)
    except DataError as err:
        raise input_error(err) from None


# --- on the hosts, before anything is sent: each stage against its host's memory


def check_stages(job: Job, cfg: TrainConfig, pipeline: Pipeline, facts: dict[str, HostFacts | None],
                 on_event: OnEvent) -> None:
    """Each stage of ``pipeline`` judged against the memory ``facts`` of its
    host (rank r = stage r on ``job.hosts[r]``): InputError (exit 2) naming
    every stage that does not fit and the ways out, else each stage said as a
    Note. A model from scratch is not judged (its bytes are not known here)."""
    sizes = model_sizes(cfg)
    if sizes is None:
        on_event(Note(f"pipeline: {pipeline.stages} stages of a model built from scratch; "
                      "their memory is not judged here (no --init_from folder to read)"))
        return
    plans = plan_for(cfg, pipeline)
    verdict = judge_stages(sizes, plans, [h.name for h in job.hosts], facts, cfg.fine_tune)
    if not verdict.ok:
        raise InputError(*refusal_text(verdict, len(sizes.blocks)))
    for line in verdict.lines(len(sizes.blocks)):
        on_event(Note(f"pipeline: {line}"))
    for note in verdict.notes:
        on_event(Note(f"pipeline: {note}"))


# --- --elastic: a host dropped, the blocks split again over the rest


def resplit(cfg: TrainConfig, pipeline: Pipeline, job: Job,
            facts: dict[str, HostFacts | None]) -> tuple[Pipeline, str]:
    """The pipeline over ``job``'s hosts (one stage each, after a host was
    dropped), and what changed in words: the blocks balanced by bytes when
    every stage then fits its host, else the split that fits each host. An
    MlxclusterError naming each host's room and the bytes to hold when the
    blocks fit no split over the hosts left."""
    hosts = [h.name for h in job.hosts]
    n = len(hosts)
    sizes = model_sizes(cfg)
    balanced = Pipeline(n, None, pipeline.micro_batches, pipeline.schedule)
    if sizes is None:  # from scratch: nothing to judge against
        plans = plan_for(cfg, balanced)
        return _split_of(balanced, plans), _said(plans, hosts)
    if n > len(sizes.blocks):
        raise MlxclusterError(f"--elastic: {n} hosts left for {len(sizes.blocks)} blocks",
                              "the run keeps at most one host per block")
    plans = plan_stages(sizes, n)
    if judge_stages(sizes, plans, hosts, facts, cfg.fine_tune).ok:
        return _split_of(balanced, plans), _said(plans, hosts)
    rooms = [budget(facts.get(h)).low for h in hosts]
    split = fitting_split(sizes, rooms, cfg.fine_tune) if all(rooms) else None
    if split is None:
        total = sum(held_while_training(p.bytes, cfg.fine_tune) for p in plans)
        have = ", ".join(f"{h} {gib(r) if r else '? (' + budget(facts.get(h)).source + ')'}"
                         for h, r in zip(hosts, rooms, strict=True))
        raise MlxclusterError(
            f"--elastic: the model's {len(sizes.blocks)} blocks fit no split over the {n} "
            f"host(s) left ({gib(needs(total))} to hold with the margin; they have: {have})",
            "bring the host back and rerun with '-- --resume auto'")
    fitted = dataclasses.replace(balanced, split=tuple(split))
    plans = plan_for(cfg, fitted)
    return fitted, _said(plans, hosts)


def _split_of(pipeline: Pipeline, plans: list[StagePlan]) -> Pipeline:
    return dataclasses.replace(pipeline, split=tuple(len(p.blocks) for p in plans))


def _said(plans: list[StagePlan], hosts: list[str]) -> str:
    """'--pipeline 2 --pipeline_split 3,1: stage 1 on a: the embedding, blocks 0-2 of 4; ...'."""
    n_blocks = plans[-1].blocks.stop
    return (f"--pipeline {len(plans)} --pipeline_split {','.join(str(len(p.blocks)) for p in plans)}"
            ": " + "; ".join(f"stage {p.index + 1} on {h}: {what_it_holds_of(p, n_blocks)}"
                             for p, h in zip(plans, hosts, strict=True)))


def pipeline_flags(pipeline: Pipeline) -> dict[str, str]:
    """``pipeline`` as the trainer's flags (TrainerArgs.with_flags)."""
    flags = {"pipeline": str(pipeline.stages)}
    if pipeline.split is not None:
        flags["pipeline_split"] = ",".join(map(str, pipeline.split))
    return flags

