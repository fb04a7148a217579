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
uses) and judges each stage against its host (stages.py): a stage that
does not fit is exit 2, naming the stage, the host, the bytes and the ways
out.

With ``--elastic``, a lost host's stage goes to the hosts left
(``resplit``): the pipeline runs again as ``--pipeline N-1`` over them,
balanced by bytes when that fits every host, else the split that fits
(``stages.fitting_split``), each stage judged on its host's memory facts
asked again; the trainer re-cuts the newest checkpoint every old stage holds
(each stage's piece is mirrored on its neighbour's disk:
reference_train/resplit.py). When no split of the blocks fits the hosts
left, when one host is left, or with copies of the pipeline (N x R ranks),
the run stops naming why (``no_resplit``).

What each host is sent of a sharded --init_from folder (an index naming the
file of each tensor): only the weight files its stage reads, with the
config, tokenizer and index (``stage_files_left_out``; the ranks are given
the split planned here, ``stage_split``, as they cannot balance it from the
files they hold). With ``--elastic``, a re-split sends each host left the
files of its new blocks before the relaunch (launch/trainer.py
``TrainerRun.send_stage_files``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import reference_train.stages as plans
from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.facts.facts import HostFacts
from mlxcluster.fit.stages import (
    fitting_split,
    judge_stages,
    refusal_text,
)
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.job import Job
from reference_train.config import TrainConfig
from reference_train.errors import DataError


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

    def micro_batches_for(self, rows: int) -> int:
        """The micro-batches of a copy of the pipeline holding ``rows`` of the global batch."""
        return self.micro_batches or plans.default_micro_batches(self.stages, rows)


def input_error(err: DataError) -> InputError:
    """The trainer's DataError as mlxcluster's exit 2, its hint kept."""
    return InputError(err.args[0], err.hint or None)


def pipeline_of(cfg: TrainConfig) -> Pipeline:
    """The pipeline the ranks will run, from the config's fields (config.py has
    checked their values and that a split names every stage)."""
    split = tuple(plans.parse_split(cfg.pipeline_split)) if cfg.pipeline_split else None
    return Pipeline(cfg.pipeline, split, cfg.micro_batches, cfg.pipeline_schedule)


# --- before anything starts: what this machine alone can check


def model_sizes(cfg: TrainConfig) -> plans.ModelBytes | None:
    """The bytes of --init_from's embedding, blocks and head, from its headers
    here (None for a model built from scratch: no folder to read)."""
    if not cfg.init_from:
        return None
    try:
        return plans.folder_bytes(cfg.init_from)
    except DataError as err:
        raise input_error(err) from None


def plan_for(cfg: TrainConfig, pipeline: Pipeline) -> list[plans.StagePlan]:
    """The stages the ranks will plan (stages.plan_stages, as they do), over
    --init_from's bytes, or a from-scratch model's --n_layers blocks (their
    bytes then not known here: 0)."""
    sizes = model_sizes(cfg) or plans.ModelBytes(0, (0,) * cfg.n_layers, 0, cfg.tie_embeddings)
    split = list(pipeline.split) if pipeline.split is not None else None
    try:
        return plans.plan_stages(sizes, pipeline.stages, split)
    except DataError as err:
        raise input_error(err) from None


def check_pipeline(cfg: TrainConfig, pipeline: Pipeline, ranks: int, backend: str) -> None:
    """InputError (exit 2) when ``ranks`` on ``backend`` cannot run ``pipeline``:
    the world size against the stages (N x R ranks: R copies, on MPI only), the
    split against the model's blocks, the micro-batches against each copy's rows
    of the global batch. Before any ssh: all of it is known here."""
    plan_for(cfg, pipeline)  # first: more stages than blocks is no matter of ranks
    try:
        plans.check_world(pipeline.stages, ranks, backend)
    except DataError as err:
        raise InputError(f"{err.args[0]} ({ranks} rank(s) on {backend})", err.hint) from None
    copies = ranks // pipeline.stages
    if cfg.global_batch % copies:
        raise InputError(f"global_batch {cfg.global_batch} does not split over {copies} copies "
                         f"of the pipeline ({ranks} ranks / --pipeline {pipeline.stages})",
                         f"give a global_batch that {copies} divides, e.g. "
                         f"--global_batch {cfg.global_batch - cfg.global_batch % copies or copies}")
    rows = cfg.global_batch // copies
    try:
        plans.check_micro_batches(pipeline.micro_batches_for(rows), rows)
    except DataError as err:
        raise input_error(err) from None


# --- what each host is sent of --init_from: its stages' weight files only


def split_files(cfg: TrainConfig) -> bool:
    """Whether --init_from's weights are split over files by an index (mlx-lm's
    shards), so that a pipeline host can be sent only its stage's."""
    if not cfg.init_from:
        return False
    try:
        return len(set((plans.index_map(cfg.init_from) or {}).values())) > 1
    except DataError:
        return False  # the ranks' own load says what is wrong with the index


def stage_split(cfg: TrainConfig, pipeline: Pipeline) -> tuple[int, ...] | None:
    """The blocks per stage the ranks will run (``plan_for``, from the whole
    folder here), or None when this machine cannot plan them (``check_pipeline``
    then says why, in its turn)."""
    try:
        return tuple(len(p.blocks) for p in plan_for(cfg, pipeline))
    except InputError:
        return None


def stage_files_left_out(job: Job, cfg: TrainConfig, pipeline: Pipeline,
                         folder: str) -> dict[str, frozenset[str]]:
    """Host name -> the weight files of ``folder`` (--init_from) that none of its
    ranks' stages reads (rank r runs stage r % N): left out of its copy. A
    stage reads the files holding its blocks' tensors, the first stage the
    embedding's, the last the final norm's and head's (and the embedding's when
    tied): ``reference_train.stages.stage_files``, by the folder's index, as
    each rank opens them (stage_load.load_stage)."""
    weight_map = plans.index_map(folder) or {}
    if not weight_map:
        return {}
    stages = plan_for(cfg, pipeline)
    every = frozenset(weight_map.values())
    hosts: dict[str, frozenset[str]] = {}
    for rank, host in enumerate(job.hosts):  # a host of several ranks needs each stage's files
        left = every - plans.stage_files(weight_map, stages[rank % pipeline.stages])
        hosts[host.name] = hosts[host.name] & left if host.name in hosts else left
    return hosts


# --- on the hosts, before anything is sent: each stage against its host's memory


def check_stages(job: Job, cfg: TrainConfig, pipeline: Pipeline, facts: dict[str, HostFacts | None],
                 on_event: OnEvent) -> None:
    """Each stage of ``pipeline`` judged against the memory ``facts`` of its
    host (rank r = stage r % N on ``job.hosts[r]``): InputError (exit 2) naming
    every stage that does not fit and the ways out, else each stage said as a
    Note. A model from scratch is not judged (its bytes are not known here)."""
    sizes = model_sizes(cfg)
    if sizes is None:
        on_event(Note(f"pipeline: {pipeline.stages} stages of a model built from scratch; "
                      "their memory is not judged here (no --init_from folder to read)"))
        return
    verdict = judge_stages(sizes, plan_for(cfg, pipeline), [h.name for h in job.hosts], facts, cfg.fine_tune)
    if not verdict.ok:
        raise InputError(*refusal_text(verdict, len(sizes.blocks)))
    for line in verdict.lines(len(sizes.blocks)):
        on_event(Note(f"pipeline: {line}"))
    for note in verdict.notes:
        on_event(Note(f"pipeline: {note}"))


# --- --elastic: the stages re-split over the hosts left


@dataclass(frozen=True)
class Resplit:
    """The pipeline over the hosts left, and what to say of it."""

    pipeline: Pipeline
    lines: tuple[str, ...]


def no_resplit(pipeline: Pipeline, dropped: Sequence[str], why: str) -> MlxclusterError:
    """Why a pipeline cannot go on without ``dropped``."""
    return MlxclusterError(
        f"--elastic cannot go on without {', '.join(dropped)}: with --pipeline "
        f"{pipeline.stages}, {why}",
        "bring the host back and rerun with '-- --resume auto' (each stage's checkpoints stay "
        "on its host, and a copy on its neighbour's); or start a new run with another --out "
        "over the hosts left")


def resplit(cfg: TrainConfig, pipeline: Pipeline, ranks_before: int, job: Job,
            dropped: Sequence[str], facts: dict[str, HostFacts | None],
            sizes: plans.ModelBytes | None) -> Resplit:
    """``pipeline`` (of ``ranks_before`` ranks) over ``job``, the hosts left, one
    stage per rank, the model of ``sizes`` (``model_sizes``; None: built from
    scratch, not judged): the balanced split when it fits every host's ``facts``, else the
    split that does; MlxclusterError (``no_resplit``) when none does, when one
    rank is left, or when the ranks ran copies of the pipeline. An explicit
    split is always given when the user gave one (theirs no longer names the
    stages)."""
    left = len(job.hosts)
    if ranks_before != pipeline.stages:
        raise no_resplit(pipeline, dropped, f"its {ranks_before} ranks ran "
                         f"{ranks_before // pipeline.stages} copies of the pipeline, and copies "
                         "are not re-split (one copy of the pipeline is)")
    if left < 2:
        raise no_resplit(pipeline, dropped, f"{left} rank is left, and a pipeline needs 2 "
                         "stages (one host holding the whole model is a run without --pipeline)")
    names = [h.name for h in job.hosts]

    def planned(split: tuple[int, ...] | None) -> list[plans.StagePlan]:
        # a model from scratch: its blocks are alike (their bytes are not known here)
        held = sizes or plans.ModelBytes(0, (1,) * cfg.n_layers, 0, cfg.tie_embeddings)
        return plans.plan_stages(held, left, list(split) if split else None)

    wanted = Pipeline(left, None, pipeline.micro_batches, pipeline.schedule)
    verdict = None
    if sizes is not None:
        verdict = judge_stages(sizes, planned(None), names, facts, cfg.fine_tune)
        if not verdict.ok:
            rooms = [fit.budget.low for fit in verdict.hosts]
            split = fitting_split(sizes, rooms, cfg.fine_tune) \
                if len(set(names)) == left and all(rooms) else None
            if split is None:
                message, hint = refusal_text(verdict, len(sizes.blocks))
                raise no_resplit(pipeline, dropped, f"its blocks do not re-split over the "
                                 f"{left} host(s) left: {message}\n  {hint}")
            wanted = Pipeline(left, tuple(split), pipeline.micro_batches, pipeline.schedule)
            verdict = judge_stages(sizes, planned(wanted.split), names, facts, cfg.fine_tune)
    if wanted.split is None and pipeline.split is not None:  # theirs named the old stages
        blocks = planned(None)
        wanted = Pipeline(left, tuple(len(p.blocks) for p in blocks), pipeline.micro_batches,
                          pipeline.schedule)
    try:  # the split is whole by construction, and one copy of the pipeline fits any backend
        plans.check_micro_batches(wanted.micro_batches_for(cfg.global_batch), cfg.global_batch)
    except DataError as err:
        raise no_resplit(pipeline, dropped, f"--pipeline {left} over the ranks left is "
                         f"refused: {err.args[0]}") from None
    lines = () if verdict is None else tuple(verdict.lines(len(sizes.blocks)))
    return Resplit(wanted, lines)
