"""A pipeline run's parts (--pipeline N): the groups, this rank's stage, its step, and
the part the Trainer holds (`Pipeline`, parallelism.py's contract).

    world of N x R ranks:  rank r is stage r % N of pipeline copy (replica) r // N
    pipe = pipeline_groups(group, N, backend)     the pipeline and replica groups
    plans = run_plans(cfg, meta, N)               stages.plan_stages, no weight loaded
    stage, compute = build_stage(cfg, plans[pipe.stage], meta, data_dir)

One pipeline (R = 1) needs only send and receive, which every backend has. R
copies of the pipeline need the world split into the pipelines and, across
them, the ranks holding the same stage (whose gradients are averaged):
Group.split, which MPI has and ring and JACCL (mlx 0.32) do not; there a world
of any other size than N is refused before anything loads (stages.check_world).
The stage is built as one process builds its model (stage_load.py: the same
seed and draws, LoRA's and DoRA's adapters alike), and only its blocks are read
from --init_from's folder.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from . import lora
from .checkpoint import load_arrays
from .collectives import all_sum, gather_json, gather_tensors, refuse_together
from .config import TrainConfig, model_args
from .disk_room import said_when_full
from .errors import DataError
from .export import export_adapters, export_index, export_shard
from .fine_tune import trains_adapters
from .mirror import describe_mirrors, mirror_checkpoint, mirrored_stages
from .objectives import make_objective
from .pipeline import TIED, PipelineStep, SingleReplica, Stage, owned_parameters
from .pipeline_outputs import STAGE_DIR, check_stage_state, other_layout, stage_dir, stage_state
from .precision import compute_copy, dtype_of
from .resplit import (
    Resplit,
    assemble,
    choose_checkpoint,
    describe_resplit,
    describe_sources,
    exchange_pieces,
    missing_names,
    scan_pieces,
)
from .resume import HostLayout, Loaded, agree_on_checkpoint, load_folder, say_notes
from .stage_load import held_bytes, load_stage, model_bytes, new_stage, shaped_stage
from .stages import (
    StagePlan,
    absent_files,
    bubble_fraction,
    check_micro_batches,
    check_world,
    default_micro_batches,
    folder_bytes,
    held_at_once,
    parse_split,
    plan_stages,
    schedule,
)


@dataclass
class PipelineGroups:
    """This rank's place: its stage and pipeline copy, and the groups it talks in."""

    stages: int
    stage: int  # this rank's stage index (0-based)
    replica: int  # which copy of the pipeline
    replicas_count: int
    pipeline: object  # mx.distributed.Group: stage i is rank i
    replicas: object  # the ranks holding this stage in every copy (SingleReplica: one copy)


def pipeline_groups(group, n_stages: int, backend: str) -> PipelineGroups:
    """The pipeline this rank belongs to and its stage's copies (collective when the
    world holds several pipelines: Group.split)."""
    size, rank = group.size(), group.rank()
    check_world(n_stages, size, backend)
    stage, replica = rank % n_stages, rank // n_stages
    if size == n_stages:
        return PipelineGroups(n_stages, stage, 0, 1, group, SingleReplica())
    pipeline = group.split(replica, stage)
    replicas = group.split(stage, replica)
    return PipelineGroups(n_stages, stage, replica, size // n_stages, pipeline, replicas)


def run_plans(cfg: TrainConfig, meta: dict) -> list[StagePlan]:
    """The stages of this run's model (--init_from's folder, or the config's shape),
    planned from the bytes of its parts: nothing drawn or loaded (call it before
    seeding: the skeleton's shapes only). A DataError for a split that cannot be."""
    split = parse_split(cfg.pipeline_split) if cfg.pipeline_split else None
    if cfg.init_from:
        absent = absent_files(cfg.init_from)
        if absent and split is None:  # a host's copy of its stage's files: no bytes to balance
            raise DataError(f"{cfg.init_from} lacks {', '.join(absent)} (its index lists "
                            "them): the stages are balanced by every file's bytes",
                            "give --pipeline_split (mlxcluster train gives the split it "
                            "planned from the whole folder), or copy the folder whole")
        # with a split given, a file absent counts 0 bytes: only this stage's own bytes
        # are said (announce), and load_stage refuses a file of its own that is absent
        return plan_stages(folder_bytes(cfg.init_from, partial=split is not None),
                           cfg.pipeline, split)
    return plan_stages(model_bytes(model_args(cfg, meta["vocab_size"])), cfg.pipeline, split)


def micro_batches_of(cfg: TrainConfig, replicas: int) -> int:
    """--micro_batches, or its default, checked against a pipeline's rows: the global
    batch's share of one copy of the pipeline."""
    rows = cfg.global_batch // replicas
    micro = cfg.micro_batches or default_micro_batches(cfg.pipeline, rows)
    check_micro_batches(micro, rows)
    return micro


def adapting(cfg: TrainConfig):
    """What --fine_tune adds to a skeleton: LoRA's or DoRA's adapters, or nothing."""
    return (lambda model: lora.apply_config(model, cfg)) if trains_adapters(cfg.fine_tune) else None


def build_stage(cfg: TrainConfig, plan: StagePlan, meta: dict, data_dir: Path
                ) -> tuple[Stage, Stage]:
    """(this rank's stage: float32 master weights, its compute copy: itself, or a
    bfloat16 twin), built as one process builds its model."""
    adapt = adapting(cfg)
    mx.random.seed(cfg.seed)  # every stage draws what one process draws
    if cfg.init_from:
        stage = load_stage(cfg.init_from, plan, cfg.fine_tune, adapt, meta, data_dir)
    else:
        stage = new_stage(model_args(cfg, meta["vocab_size"]), plan)
    lora.check_base_dtype(cfg, stage)
    compute = compute_copy(stage, lambda: shaped_stage(stage.args, plan, adapt=adapt),
                           dtype_of(cfg.dtype))
    for s in (stage, compute):
        s.grad_checkpoint = cfg.grad_checkpoint
    return stage, compute


def frozen_copy(stage: Stage) -> Stage:
    """DPO's reference model on this rank with full fine-tuning: a frozen copy of `stage`
    (its blocks only, in its dtype: the compute copy's), not the whole model. Its arrays are
    the stage's as they are now; the optimizer replaces the stage's, never changes these.
    The skeleton's random draws are never evaluated, and mlx's random state is left as it
    was (LoRA's dropout draws from it: a run's draws stay one process's)."""
    hi, lo = mx.random.state[0].tolist()
    copy = shaped_stage(stage.args, stage.plan)
    mx.random.seed((hi << 32) | lo)  # the key as it was (mx.random.key(seed) is its two words)
    copy.update(stage.parameters())
    copy.freeze()
    copy.eval()
    mx.eval(copy.parameters())
    return copy


def own_tensors(stage: Stage, trainable_only: bool) -> dict[str, mx.array]:
    """The stage's parameters (or trainable ones) that are its own: the last stage's
    copy of a tied embedding is the first stage's."""
    params = stage.trainable_parameters() if trainable_only else stage.parameters()
    held = dict(tree_flatten(params))
    if not stage.plan.first:
        held.pop(TIED, None)
    return held


def stage_writers(layout: HostLayout, pipe: PipelineGroups) -> HostLayout:
    """Who writes this stage's checkpoints, as a layout of the ranks holding the stage
    (one per copy of the pipeline, in `pipe.replicas`' order): of those that see the
    same --out (the world's `layout`, storage.py), the lowest; alone, itself."""
    holders = [r for r in range(len(layout.hosts)) if r % pipe.stages == pipe.stage]
    storage = [next(i for i, q in enumerate(holders) if layout.writer(q) == layout.writer(r))
               for r in holders]
    return HostLayout([layout.hosts[r] for r in holders], pipe.replica, storage)


# ---------------------------------------------------------------- the run's part


class Pipeline:
    """A --pipeline N run (parallelism.Parallelism): this rank is one stage of one copy
    of the pipeline; it holds, checkpoints, resumes and exports its stage only."""

    no_sample = ("no sample with --pipeline (each rank holds its stage only): sample "
                 "OUT/model or OUT/adapters with mlx_lm.generate")

    def __init__(self, cfg: TrainConfig, group, backend: str, meta: dict, log):
        """Its refusals come before anything loads: a split the model's blocks cannot
        take, then a world that is no pipeline."""
        self.cfg, self.group, self.meta, self.log = cfg, group, meta, log
        self.objective = make_objective(cfg, meta)  # refuses data of the other kind
        self.plans = run_plans(cfg, meta)
        self.pipe = pipe = pipeline_groups(group, cfg.pipeline, backend)
        self.plan = self.plans[pipe.stage]
        self.data_group = pipe.replicas  # each stage reads its copy's rows
        self.micro_batches = micro_batches_of(cfg, pipe.replicas_count)
        self.lora = trains_adapters(cfg.fine_tune)
        self.layout: HostLayout | None = None
        self.mirrored: list[bool] = []

    def place(self, layout: HostLayout) -> HostLayout:
        """This stage's checkpoint writers (one per copy, stage_writers); each stage's
        checkpoints also on the next stage's host where that is another disk (mirror.py):
        a lost host's piece survives for a resume over the others."""
        self.layout, pipe = layout, self.pipe
        self.mirrored = mirrored_stages(layout, pipe.stages, pipe.replicas_count)
        self.writers = stage_writers(layout, pipe)
        return self.writers

    def checkpoints(self, root: Path) -> Path:
        return root / stage_dir(self.plan)

    def build(self, data_dir: Path) -> tuple[Stage, Stage]:
        """Only this stage's blocks, built as one process builds the model."""
        return build_stage(self.cfg, self.plan, self.meta, data_dir)

    def init_optimizer(self, optimizer, model: Stage):
        """`optimizer` for the stage's own parameters (the last stage's tied copy is the
        first stage's)."""
        optimizer.init(owned_parameters(model))
        return optimizer

    def make_step(self, model: Stage, compute: Stage) -> PipelineStep:
        """The stage's step; DPO's reference with full fine-tuning a frozen copy of this
        stage's blocks as they start (before any resume: the starting point, as one
        process's), made here (with adapters: the stage with its adapters off)."""
        cfg, pipe = self.cfg, self.pipe
        reference = None
        if self.objective.needs_reference and not self.lora:
            reference = frozen_copy(compute)
        return PipelineStep(model, pipe.pipeline, self.micro_batches, cfg.grad_clip,
                            None if compute is model else compute, dtype_of(cfg.dtype),
                            cfg.pipeline_schedule, replicas=pipe.replicas,
                            comm_dtype=dtype_of(cfg.comm_dtype), compile=cfg.compile,
                            random_state=self.lora and cfg.lora_dropout > 0,
                            objective=self.objective, reference=reference)

    def counts(self, model: Stage) -> tuple[int, int]:
        """(the model's parameters, its trainable ones): every stage's, summed (a
        collective of the pipeline), a tied matrix counted once."""
        mine = [sum(v.size for v in own_tensors(model, t).values()) for t in (False, True)]
        summed = all_sum(mx.array(mine, dtype=mx.int64), self.pipe.pipeline)
        return tuple(int(v) for v in summed.tolist())

    # ------------------------------------------------------------ checkpoints

    def saved_optimizer(self, optimizer):
        return optimizer

    def state(self) -> dict:
        """Its place, and every stage's host (resplit.py names them), for state.json."""
        return {"pipeline": {**stage_state(self.plan),
                             "hosts": self.layout.hosts[:self.pipe.stages]}}

    def mirror(self, saved: Path) -> None:
        """Checkpoint `saved` on the next stage's host too (mirror.py), where mirrored."""
        if not any(self.mirrored):
            return
        problem = mirror_checkpoint(self.pipe.pipeline, saved, self.pipe.stage,
                                    self.mirrored, self.cfg.keep_checkpoints)
        if problem:
            print(f"warning: {self.layout.hosts[self.group.rank()]}: {problem}",
                  file=sys.stderr, flush=True)

    def find(self, root: Path, only: int | None, layout_of) -> Path | tuple | None:
        """This stage's piece of the newest step every stage holds (a folder), or
        another layout's pieces to re-cut ((Resplit, root): resplit.py): collective.
        `layout_of(root)`: which ranks see `root`."""
        cfg, plan, pipe = self.cfg, self.plan, self.pipe
        if STAGE_DIR.match(root.name):  # --resume .../checkpoints/stage_1_of_2[/step_N]
            root = root.parent
        layout = layout_of(root)
        mine = scan_pieces(root, cfg.resume_before, only) if layout.writes else []
        holdings = exchange_pieces(mine, [layout.writer(r) for r in range(self.group.size())],
                                   self.group)
        blocks = [(p.blocks.start, p.blocks.stop) for p in self.plans]
        choice = choose_checkpoint(holdings, pipe.stages, blocks)  # alike on every rank
        if choice is None:  # no stage's piece anywhere: a data-parallel run's are refused
            refuse_together(other_layout(root, f"--pipeline {plan.count}"), self.group)
            return None
        for note in choice.notes:
            self.log(note)
        if not choice.same:
            return choice, root
        path, own_notes, notes = agree_on_checkpoint(pipe.replicas, self.writers,
                                                     root / stage_dir(plan), choice.step,
                                                     cfg.keep_checkpoints, before=cfg.resume_before)
        say_notes(own_notes, notes, self.log)
        return path

    def load(self, found, model: Stage, optimizer, check) -> Loaded:
        """Loaded: this stage's own piece (the same blocks: every stage says), or
        another --pipeline's pieces re-cut into it."""
        if isinstance(found, Path):
            def check_piece(saved: dict, path: Path) -> None:
                check(saved, path)
                refuse_together(check_stage_state(saved, self.plan, path), self.group)

            return load_folder(found, model, optimizer, self.lora, check_piece)
        return self.load_resplit(*found, model, optimizer, check)

    def load_resplit(self, choice: Resplit, root: Path, model: Stage, optimizer,
                     check) -> Loaded:
        """Another --pipeline's pieces of step `choice.step`, re-cut into this stage
        (resplit.py; collective)."""
        plan, rank = self.plan, self.group.rank()
        held = model.trainable_parameters() if self.lora else model.parameters()
        weights = [n for n, _ in tree_flatten(held)]
        names = [n for n, _ in tree_flatten(optimizer.state)]
        if rank == 0:
            self.log(describe_sources(choice, self.layout.hosts, plan.count))
        got = assemble(choice, root, self.group, weights, names)
        where = f"step {choice.step} of the --pipeline {choice.count} checkpoints in {root}"
        check(got.state, where)
        stage = f"rank {rank} (stage {plan.index + 1} of {plan.count})"
        refuse_together(missing_names(got, weights, names, choice, stage), self.group)
        load_arrays(model, optimizer, got.weights, got.optimizer, self.lora, where)
        print(f"rank {rank}: {describe_resplit(choice, got, plan.index, plan.count)}",
              flush=True)
        return Loaded(got.state, choice.digest, where)

    def export(self, model: Stage, args, saved: Path, data_dir: Path) -> None:
        """A pipeline's outputs (pipeline_outputs.py), by its first copy: OUT/adapters
        gathered to rank 0 and written there; OUT/model as one shard per stage, each
        written on its stage's host, and rank 0's config, tokenizer and index."""
        cfg, pipe, out = self.cfg, self.pipe, Path(self.cfg.out)
        if pipe.replica != 0:
            return
        if self.lora:
            adapters = gather_tensors(own_tensors(model, True), pipe.pipeline)
            if adapters is not None:
                note = export_adapters(adapters, cfg, args.n_layers, out, kept=True)
                self.log(f"{note}, gathered from {pipe.stages} stages")
            return
        with said_when_full(out, "the exported model's shard"):
            shard = export_shard(own_tensors(model, False), out / "model", pipe.stage,
                                 pipe.stages, cfg.export_dtype)
        shards = gather_json(shard, pipe.pipeline)
        if pipe.stage == 0:
            with said_when_full(out, "the exported model"):
                self.log(export_index(shards, args, out / "model", data_dir=data_dir,
                                      init_from=cfg.init_from, dtype=cfg.export_dtype))

    # ------------------------------------------------------------ the log

    def announce(self, model: Stage) -> None:
        """Each rank its own stage, once."""
        print(f"rank {self.group.rank()}: {self.plan.describe(model.args.n_layers)} (held: "
              f"{held_bytes(model) / 2**20:.2f} MiB)", flush=True)

    def describe(self, micro_batch: int) -> tuple[str, list[str]]:
        """(how the global batch is split, the log's lines of this parallelism: the
        mirrors, the bubble)."""
        pipe, micro, cfg = self.pipe, self.micro_batches, self.cfg
        split = (f"{pipe.replicas_count} x a pipeline of {pipe.stages} stages, each "
                 f"{micro} micro-batches of {micro_batch // micro}")
        held = held_at_once(schedule(cfg.pipeline_schedule, 0, pipe.stages, micro))
        rows = "pairs (chosen and rejected rows together)" if self.objective.metrics else "rows"
        lines = [f"pipeline of {pipe.stages} stages, {micro} micro-batches of "
                 f"{micro_batch // micro} {rows}, {cfg.pipeline_schedule}: bubble "
                 f"{bubble_fraction(pipe.stages, micro):.0%}, at most {held} "
                 "micro-batches' activations held"]
        if self.objective.needs_reference:
            model = "each stage with its adapters off" if self.lora else \
                "a frozen copy of each stage's blocks"
            lines.append(f"DPO's reference model ({model}): a forward-only pass through the "
                         "stages each step, before the policy's")
        return split, lines

    def mirrors(self) -> list[str]:
        return describe_mirrors(self.layout, self.mirrored)

    def sample(self, model: Stage, ids: list[int], tokens: int, key: mx.array) -> None:
        """None: this rank holds its stage only (no_sample)."""

    def reduction(self) -> str:
        """How the gradients are averaged, for the log."""
        copies = self.pipe.replicas_count
        return ("activations and their gradients sent between stages"
                + (f", gradients all-reduced in {self.cfg.comm_dtype} over the {copies} copies"
                   if copies > 1 else ""))
