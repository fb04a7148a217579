"""Sharded data-parallel Llama training with MLX: the same script on 1 process or N hosts.

One process (no launcher; a distributed group of 1):

    python -m reference_train.train --config tiny --out runs/tiny
    python -m reference_train.train --config demo --out runs/demo --steps 200 --global_batch 32

N processes on this machine, or one per host (hosts.json is an mlx.launch hostfile):

    mlx.launch -n 2 --backend ring --python "$(which python)" -- \
        -m reference_train.train --config demo --out runs/demo
    mlx.launch --hostfile hosts.json --backend ring --python /abs/path/to/python -- \
        -m reference_train.train --config demo --out runs/demo
    mpirun -np 4 --hostfile mpi_hosts.txt -x MLX_MPI_LIBNAME=libmpi.so \
        python -m reference_train.train --config demo --out runs/demo

(or `mlxcluster train -i inventory.yaml --config demo`, which checks the cluster
first.) Resume where a run stopped: add `--resume auto` (latest checkpoint in
--out) or `--resume runs/demo/checkpoints/step_000100`.

Every rank builds the same model from `seed`, reads its own slice of each global
batch from memory-mapped token files (reference_train/data.py), and the compiled
step averages gradients over ranks with `nn.average_gradients`, so the run with
N ranks computes the same losses as one process with the same global batch.
Settings: the TrainConfig fields (config.py), from a YAML file in configs/
(`--config NAME` or a path) with any field overridden on the command line
(`--field value`). On Linux, preload OpenBLAS (LD_PRELOAD) for a ~15x faster CPU
step; `mlxcluster train` does this for you.

This file is the `Trainer` (one rank's model, optimizer, data and step function,
handed to the training loop of loop.py; resume, checkpoints, export) and `main`;
what each other module holds is listed in reference_train/__init__.py.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from . import compile_cache, kernels, lora
from .callbacks import (
    Callbacks,
    Heartbeats,
    ProgressBar,
    RecentRecords,
    Report,
    TrainingCallback,
)
from .checkpoint import (
    checkpoint_name,
    content_hash,
    load_arrays,
    load_checkpoint,
    save_checkpoint,
)
from .collectives import all_sum, gather_json, gather_tensors, refuse_together
from .config import TrainConfig, build_config, model_args
from .data import ShardedBatches, load_meta, open_split, split_batch
from .data_parallel import DataParallelStep, validation
from .disk_room import RoomWatch, full_disk_error, is_disk_full, said_when_full
from .errors import DataError
from .export import export_index, export_model, export_shard
from .fine_tune import ADAPTER_FIELDS, NAMES, adapter_config, parse_keys, trains_adapters
from .hf_io import model_from_folder
from .launch_env import current_backend, has_sum_scatter, init_group
from .loop import LoopPlan, train_loop
from .metrics import emit_folder, heartbeat_wanted, plot_metrics, record_line, recording
from .mfu import flops_per_token, peak_flops
from .mirror import describe_mirrors, mirror_checkpoint, mirrored_stages
from .model import Llama, args_match, count_parameters, generate
from .pipeline import PipelineStep, owned_parameters
from .pipeline_outputs import STAGE_DIR, check_stage_state, other_layout, stage_dir, stage_state
from .pipeline_setup import (
    build_stage,
    micro_batches_of,
    own_tensors,
    pipeline_groups,
    run_plans,
    stage_writers,
)
from .precision import compute_copy, dtype_of
from .prepare import ensure_default_data
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
from .resume import agree_on_checkpoint, check_loaded, checkpoint_root, find_storage, host_layout
from .sharded_optimizer import ShardedOptimizer
from .stage_load import held_bytes
from .stages import bubble_fraction, held_at_once
from .stages import schedule as pipeline_order
from .stopping import STOPPED_EXIT, Stopped, StopRequest, last_words
from .storage import describe_storage
from .tokenizer import make_tokenizer

# ---------------------------------------------------------------- the parts


def schedule(cfg: TrainConfig):
    """The learning rate: a linear warmup, then a cosine decay to --min_lr."""
    warmup = min(cfg.warmup_steps, cfg.steps)
    cosine = optim.cosine_decay(cfg.lr, max(1, cfg.steps - warmup), cfg.min_lr)
    if warmup == 0:
        return cosine
    return optim.join_schedules([optim.linear_schedule(cfg.lr / warmup, cfg.lr, warmup),
                                 cosine], [warmup])


def make_model(cfg: TrainConfig, meta: dict, data_dir: Path) -> Llama:
    """The run's model, from --init_from's folder or drawn from --seed, with its
    adapters when --fine_tune lora or dora (the base frozen, quantized or not)."""
    mx.random.seed(cfg.seed)  # every rank draws the same initial weights
    if cfg.init_from:  # the model's shape and weights from a Llama folder (hf_io.py)
        model = model_from_folder(cfg.init_from, meta, data_dir, cfg.fine_tune)
    else:
        model = Llama(model_args(cfg, meta["vocab_size"]))
    if trains_adapters(cfg.fine_tune):
        if cfg.dtype != "float32" and lora.is_quantized(model):
            raise DataError(f"--dtype {cfg.dtype} with a quantized base ({cfg.init_from}) "
                            "is not supported", "use --dtype float32 (the adapters train "
                            "in float32 on the quantized base)")
        lora.apply_config(model, cfg)
    return model


def make_optimizer(cfg: TrainConfig, model: Llama, group, reduce_scatter: bool):
    """AdamW on the trainable parameters, or each rank's share of it (--shard_optimizer)."""
    optimizer = optim.AdamW(learning_rate=schedule(cfg), betas=[cfg.beta1, cfg.beta2],
                            weight_decay=cfg.weight_decay)
    if cfg.pipeline > 1:  # a stage's own parameters (the last stage's tied copy is the first's)
        optimizer.init(owned_parameters(model))
        return optimizer
    if cfg.shard_optimizer:  # each rank keeps its share of the state (sharded_optimizer.py)
        return ShardedOptimizer(optimizer, model, group, reduce_scatter=reduce_scatter)
    optimizer.init(model.trainable_parameters())
    return optimizer


# ---------------------------------------------------------------- the run


class Trainer:
    """One rank's parts (model, optimizer, data, step function) and what a run does
    around its training loop (loop.py): describe, resume, checkpoint, export."""

    def __init__(self, cfg: TrainConfig, group, log=print):
        self.cfg, self.group, self.log = cfg, group, log
        self.rank, self.size = group.rank(), group.size()
        kernels.use(cfg.kernels)  # before any step is traced
        self.backend = current_backend(group)
        self.data_dir = data_dir = Path(cfg.data) if cfg.data else ensure_default_data()
        self.meta = load_meta(data_dir)
        # --pipeline N: this rank is one stage of a pipeline (of one of its copies:
        # pipeline_setup.py). Its refusals come before anything loads: a split the
        # model's blocks cannot take, then a world that is no pipeline.
        self.plans = plans = run_plans(cfg, self.meta) if cfg.pipeline > 1 else []
        self.pipe = pipeline_groups(group, cfg.pipeline, self.backend) if plans else None
        # The ranks that share each global batch's rows: all (data-parallel), or the
        # copies of the pipeline (each of whose stages reads its copy's rows).
        self.data_group = group if self.pipe is None else self.pipe.replicas
        self.micro_batches = 0 if self.pipe is None else \
            micro_batches_of(cfg, self.pipe.replicas_count)
        # One checkpoint writer per --out folder: per host (Macs have their own disks),
        # or one for the hosts that see the same folder (storage.py finds out, with tokens).
        # A pipeline's stages each write their own piece (pipeline_outputs.py).
        self.out = Path(cfg.out)
        self.layout = find_storage(group, host_layout(group), self.out)
        if self.rank == 0 and (note := describe_storage(self.layout, self.out)):
            log(note)
        self.writers = self.layout if self.pipe is None else stage_writers(self.layout, self.pipe)
        # Each stage's checkpoints also on the next stage's host (mirror.py), where that
        # is another disk: a lost host's piece survives for a resume over the others.
        self.mirrored = [] if self.pipe is None else \
            mirrored_stages(self.layout, self.pipe.stages, self.pipe.replicas_count)
        self.micro_batch = split_batch(cfg.global_batch, self.data_group.size(), cfg.grad_accum)
        self.tokenizer = make_tokenizer(self.meta["tokenizer"], data_dir)
        self.train_data = ShardedBatches(open_split(data_dir, "train", cfg.block_size),
                                         cfg.global_batch, self.data_group, cfg.seed)
        self.val_split = open_split(data_dir, "val", cfg.block_size)
        self.lora = trains_adapters(cfg.fine_tune)  # LoRA or DoRA: only adapters train
        self.compute_dtype = dtype_of(cfg.dtype)
        self.checkpoints = self.out / "checkpoints"
        if self.pipe is None:
            self.model = make_model(cfg, self.meta, data_dir)
            self.args = self.model.args  # the compute copy's shape (empty_model)
            # --dtype bfloat16: the passes run on a bfloat16 copy; self.model stays the
            # float32 master.
            self.compute = compute_copy(self.model, self.empty_model, self.compute_dtype)
            for m in (self.model, self.compute):  # --grad_checkpoint: blocks recomputed (model.py)
                m.grad_checkpoint = cfg.grad_checkpoint
        else:  # only this stage's blocks, built as one process builds the model
            self.stage_plan = plans[self.pipe.stage]
            self.model, self.compute = build_stage(cfg, self.stage_plan, self.meta, data_dir)
            self.checkpoints = self.checkpoints / stage_dir(self.stage_plan)
        self.args = self.model.args
        self.reduce_scatter = cfg.shard_optimizer and has_sum_scatter(self.backend, mx.__version__)
        self.optimizer = make_optimizer(cfg, self.model, group, self.reduce_scatter)
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step_fn = self.make_step()
        # The whole model's parameters (a pipeline's: every stage's, summed).
        self.n_params, self.n_trainable = self.counts()
        # Where the time goes (mfu.py): the model's FLOPs per token and this rank's peak.
        a = self.args
        embedding = 0 if a.tie_embeddings else a.vocab_size * a.dim  # a lookup, not a matmul
        self.flops_per_token = flops_per_token(self.n_params, embedding, a.n_layers,
                                               a.n_heads, a.head_dim or a.dim // a.n_heads,
                                               cfg.block_size)
        self.peak, self.peak_source = peak_flops(self.compute_dtype)
        # All randomness after initialisation flows from this key (saved in checkpoints).
        self.key = mx.random.key(cfg.seed + 1)
        self.step = 0
        self.heartbeat = heartbeat_wanted()
        self.recent = RecentRecords()  # kept in each checkpoint, replayed on resume
        self.replay: list[dict] = []  # the resumed checkpoint's (Report sends them again)
        self.stop = StopRequest(group)  # SIGUSR2: checkpoint and stop (stopping.py)
        self.room = RoomWatch()  # room for the next checkpoint on this host (disk_room.py)

    def make_step(self):
        """The step function (loop.py's contract): data-parallel, or this rank's stage of
        the pipeline (its gradients averaged over the pipeline's copies)."""
        cfg = self.cfg
        compute = None if self.compute is self.model else self.compute
        if self.pipe is not None:
            return PipelineStep(self.model, self.pipe.pipeline,
                                self.micro_batches, cfg.grad_clip, compute, self.compute_dtype,
                                cfg.pipeline_schedule, replicas=self.pipe.replicas,
                                comm_dtype=dtype_of(cfg.comm_dtype))
        return DataParallelStep(
            self.group, global_batch=cfg.global_batch, grad_accum=cfg.grad_accum,
            grad_clip=cfg.grad_clip, compute=compute, compute_dtype=self.compute_dtype,
            comm_dtype=dtype_of(cfg.comm_dtype), compile=cfg.compile,
            random_state=self.lora and cfg.lora_dropout > 0)

    def counts(self) -> tuple[int, int]:
        """(the model's parameters, its trainable ones): a pipeline's summed over its
        stages (a collective of the pipeline), a tied matrix counted once."""
        if self.pipe is None:
            return count_parameters(self.model), lora.trainable_count(self.model)
        mine = [sum(v.size for v in own_tensors(self.model, t).values()) for t in (False, True)]
        summed = all_sum(mx.array(mine, dtype=mx.int64), self.pipe.pipeline)
        return tuple(int(v) for v in summed.tolist())

    def eval_every(self) -> int:
        """--eval_every, or 0 when the validation split holds less than one
        global batch: its loss would be over no rows (it was logged as nan)."""
        cfg, rows = self.cfg, self.val_split.n_sequences
        if cfg.eval_every and rows < cfg.global_batch:
            if self.rank == 0:
                self.log(f"validation: off: the validation split has {rows} row(s), fewer than "
                         f"one global batch ({cfg.global_batch}); give more (a longer "
                         f"valid.jsonl, or a smaller --val-every in prepare) or a smaller "
                         f"--global_batch")
            return 0
        return cfg.eval_every

    def evaluate(self):
        """The validation loss (loop.py's evaluate): through the pipeline with one."""
        cfg = self.cfg
        loss = None if self.pipe is None else self.step_fn.loss
        return validation(self.val_split, cfg.global_batch, self.data_group, cfg.eval_batches,
                          loss)

    def empty_model(self) -> Llama:
        """A model of this run's shape (with its adapters, frozen alike), for the compute copy."""
        model = Llama(self.args)
        return lora.apply_config(model, self.cfg) if self.lora else model

    def callback(self, last: int) -> TrainingCallback:
        """What this rank does with what the loop measures: heartbeats (when a
        launcher watches them); on rank 0 also the progress bar (on a terminal),
        the log lines and the metrics record."""
        callbacks: list[TrainingCallback] = [self.recent]
        if self.heartbeat:
            callbacks.append(Heartbeats(self.rank))
        if self.rank == 0:
            if self.cfg.progress and sys.stdout.isatty():
                callbacks.append(ProgressBar(last))
            callbacks.append(Report(self.log, self.out / "metrics.jsonl", self.cfg.steps,
                                    self.size, replay=self.replay))
        return Callbacks(*callbacks)

    def resume(self) -> None:
        """Load the newest checkpoint, agreed by every rank (resume.py: a host lacking
        it receives it from one that has it; ranks holding different states refuse;
        a pipeline's stages each their own piece of the newest step all of them hold,
        or another --pipeline's pieces re-split: resplit.py)."""
        cfg = self.cfg
        found = self.find_checkpoint() if self.pipe is None else self.find_stage_checkpoint()
        if found is None:
            if cfg.resume == "auto":
                self.log(f"no checkpoint in {self.out}; starting from step 0")
                return
            raise DataError(f"no checkpoint at {cfg.resume}",
                            "give a checkpoints/step_NNNNNN directory or the run's --out")
        if isinstance(found, Path):
            state, digest, where = self.load_path(found), content_hash(found), str(found)
        else:
            state, digest, where = self.load_resplit(*found)
        check_loaded(self.data_group, self.writers, state["step"], digest)
        self.step = state["step"]
        self.replay = state.get("records", [])
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        if self.lora and "global_rng_key" in state:  # LoRA's dropout draws from it
            hi, lo = state["global_rng_key"]
            mx.random.seed((hi << 32) | lo)
        self.log(f"resumed from {where} at step {self.step} (data epoch "
                 f"{state['data']['epoch']}, step {state['data']['step_in_epoch']})")

    def check_saved(self, saved: dict, where) -> None:
        """A DataError unless checkpoint `where`'s state.json is this run's model and
        fine-tuning."""
        saved_args = saved["model_args"]
        if not args_match(saved_args, self.args):
            raise DataError(f"{where} holds a different model: {saved_args}",
                            "resume with the same model settings")
        tuning = ("fine_tune", *ADAPTER_FIELDS) if self.lora else ("fine_tune",)
        theirs = {k: saved.get("config", {}).get(k, "full" if k == "fine_tune" else None)
                  for k in tuning}
        ours = {k: getattr(self.cfg, k) for k in tuning}
        if theirs != ours:
            raise DataError(f"{where} was trained with {theirs}, this run asks for {ours}",
                            "resume with the checkpoint's --fine_tune and --lora_* settings")

    def load_path(self, path: Path) -> dict:
        """Checkpoint `path` loaded (this rank's, or this stage's piece); its state.json."""
        with open(path / "state.json") as f:
            saved = json.load(f)
        self.check_saved(saved, path)
        if self.pipe is not None:  # its stage's piece: the same blocks (every stage says)
            refuse_together(check_stage_state(saved, self.stage_plan, path), self.group)
        state = load_checkpoint(path, self.model, self.optimizer, trainable_only=self.lora)
        self.room.saw(path)  # the next checkpoint's size, for the room check before it
        return state

    def load_resplit(self, choice: Resplit, root: Path) -> tuple[dict, str, str]:
        """Another --pipeline's pieces of step `choice.step`, re-cut into this stage
        (resplit.py; collective): (old stage 0's state.json, a hash of the pieces, where)."""
        plan = self.stage_plan
        held = self.model.trainable_parameters() if self.lora else self.model.parameters()
        weights = [n for n, _ in tree_flatten(held)]
        optimizer = [n for n, _ in tree_flatten(self.optimizer.state)]
        if self.rank == 0:
            self.log(describe_sources(choice, self.layout.hosts, plan.count))
        got = assemble(choice, root, self.group, weights, optimizer)
        where = f"step {choice.step} of the --pipeline {choice.count} checkpoints in {root}"
        self.check_saved(got.state, where)
        stage = f"rank {self.rank} (stage {plan.index + 1} of {plan.count})"
        refuse_together(missing_names(got, weights, optimizer, choice, stage), self.group)
        load_arrays(self.model, self.optimizer, got.weights, got.optimizer, self.lora, where)
        print(f"rank {self.rank}: {describe_resplit(choice, got, plan.index, plan.count)}",
              flush=True)
        return got.state, choice.digest, where

    def find_checkpoint(self) -> Path | None:
        """The checkpoint every rank of a data-parallel run loads (collective)."""
        cfg = self.cfg
        root, only = checkpoint_root(cfg.resume, self.out)
        # --resume PATH elsewhere than --out: which hosts share that folder is its own question
        layout = self.resume_layout(root)
        path, own_notes, notes = agree_on_checkpoint(self.group, layout, root, only,
                                                     cfg.keep_checkpoints, before=cfg.resume_before)
        self.say_notes(own_notes, notes)
        # none of its own, but a pipeline's pieces there: refused, not started over
        refuse_together(other_layout(root, "data-parallel") if path is None else None, self.group)
        return path

    def resume_layout(self, root: Path):
        """Which ranks see the same `root` (a --resume PATH elsewhere than --out: its own
        question; collective)."""
        if root == self.out / "checkpoints":
            return self.layout
        return find_storage(self.group, host_layout(self.group), root, "--resume", required=False)

    def find_stage_checkpoint(self) -> Path | tuple[Resplit, Path] | None:
        """This stage's piece of the newest step every stage holds (today's resume), or
        another layout's pieces to re-cut (resplit.py): collective."""
        cfg, plan, pipe = self.cfg, self.stage_plan, self.pipe
        root, only = checkpoint_root(cfg.resume, self.out)
        if STAGE_DIR.match(root.name):  # --resume .../checkpoints/stage_1_of_2[/step_N]
            root = root.parent
        layout = self.resume_layout(root)
        mine = scan_pieces(root, cfg.resume_before, only) if layout.writes else []
        holdings = exchange_pieces(mine, [layout.writer(r) for r in range(self.size)],
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
        self.say_notes(own_notes, notes)
        return path

    def say_notes(self, own_notes: list[str], notes: list[str]) -> None:
        for note in own_notes:  # about this host's disk: said by the rank that saw it
            print(f"note: {note}", flush=True)
        for note in notes:
            self.log(note)

    def save(self, step: int) -> None:
        """The loop's checkpoint (loop.py): step `step`'s."""
        self.step = step
        self.checkpoint()

    def checkpoint(self) -> None:
        optimizer = self.optimizer
        if isinstance(optimizer, ShardedOptimizer):  # whole on every host: gathered by every rank
            optimizer = SimpleNamespace(state=optimizer.gathered_state())
        if not self.writers.writes:  # the ranks holding the same weights: one copy per --out
            return
        root, name = self.checkpoints, f"checkpoint {checkpoint_name(self.step)}"
        if warning := self.room.before(root, name):  # a DataError when it cannot fit (disk_room.py)
            if self.rank == 0:
                self.log(f"warning: {warning}")
            else:  # every writer says it of its own disk; the launcher shows its stderr
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        state = {"data": self.train_data.position(self.step),
                 "rng_key": np.array(self.key).tolist(), "config": asdict(self.cfg),
                 "model_args": asdict(self.args), "world_size": self.size,
                 "records": self.recent.records}
        if self.pipe is not None:  # its place, and every stage's host (resplit.py names them)
            state["pipeline"] = {**stage_state(self.stage_plan),
                                 "hosts": self.layout.hosts[:self.pipe.stages]}
        if self.lora:
            state["global_rng_key"] = mx.random.state[0].tolist()
        with said_when_full(root, name):
            saved = save_checkpoint(root, self.step, self.model, optimizer,
                                    state, self.cfg.keep_checkpoints, trainable_only=self.lora)
        self.room.saw(saved)
        if any(self.mirrored):  # on the next stage's host too (mirror.py)
            problem = mirror_checkpoint(self.pipe.pipeline, saved, self.pipe.stage,
                                        self.mirrored, self.cfg.keep_checkpoints)
            if problem:
                print(f"warning: {self.layout.hosts[self.rank]}: {problem}", file=sys.stderr,
                      flush=True)

    def export(self) -> None:
        """OUT/model, the trained model as mlx-lm opens it; like checkpoints, one writer
        per --out folder (every host keeps its own copy, hosts sharing one disk one copy),
        written to a temporary folder and renamed."""
        if self.pipe is not None:
            return self.export_stages()
        if self.layout.writes:
            # From the checkpoint just written: its model.safetensors holds the float32
            # master weights (DESIGN: whatever dtype the step computes in).
            saved = self.out / "checkpoints" / checkpoint_name(self.step) / "model.safetensors"
            if self.lora:  # OUT/adapters, for mlx-lm with the --init_from model (lora.py)
                with said_when_full(self.out, "the adapters"):
                    folder = lora.write_adapters(mx.load(str(saved)),
                                                 adapter_config(self.cfg, self.args.n_layers),
                                                 self.out / "adapters")
                if self.rank == 0 and recording():  # mlxcluster keeps a copy where it runs
                    emit_folder(folder, "adapters")
                if self.rank == 0:
                    self.log(f"adapters for mlx-lm: {folder} (mlx_lm.generate --model "
                             f"{self.cfg.init_from} --adapter-path {folder})")
                return
            with said_when_full(self.out, "the exported model"):
                note = export_model(mx.load(str(saved)), self.args,
                                    self.out / "model", data_dir=self.data_dir,
                                    init_from=self.cfg.init_from, dtype=self.cfg.export_dtype,
                                    need_tokenizer=False)
            if self.rank == 0:
                self.log(note)

    def export_stages(self) -> None:
        """A pipeline's outputs (pipeline_outputs.py), by its first copy: OUT/adapters
        gathered to rank 0 and written there; OUT/model as one shard per stage, each
        written on its stage's host, and rank 0's config, tokenizer and index."""
        cfg, pipe = self.cfg, self.pipe
        if pipe.replica != 0:
            return
        if self.lora:
            adapters = gather_tensors(own_tensors(self.model, True), pipe.pipeline)
            if adapters is None:
                return
            with said_when_full(self.out, "the adapters"):
                folder = lora.write_adapters(adapters, adapter_config(cfg, self.args.n_layers),
                                             self.out / "adapters")
            if recording():  # mlxcluster keeps a copy where it runs
                emit_folder(folder, "adapters")
            self.log(f"adapters for mlx-lm: {folder} (mlx_lm.generate --model "
                     f"{cfg.init_from} --adapter-path {folder}), gathered from "
                     f"{pipe.stages} stages")
            return
        with said_when_full(self.out, "the exported model's shard"):
            shard = export_shard(own_tensors(self.model, False), self.out / "model", pipe.stage,
                                 pipe.stages, cfg.export_dtype)
        shards = gather_json(shard, pipe.pipeline)
        if pipe.stage == 0:
            with said_when_full(self.out, "the exported model"):
                self.log(export_index(shards, self.args, self.out / "model",
                                      data_dir=self.data_dir, init_from=cfg.init_from,
                                      dtype=cfg.export_dtype))

    def train_step(self, timed: bool = False) -> tuple[mx.array, mx.array]:
        """One step of the step function on this rank's slice of global batch
        `self.step` (for benchmarks: run() goes through the loop); returns (this
        rank's loss, gradient norm), evaluated; advances self.step."""
        result = self.step_fn(self.model, self.optimizer, self.train_data.batch(self.step), timed)
        self.step += 1
        return result.loss, result.grad_norm

    def reduction(self) -> str:
        """How the gradients are averaged, for the log."""
        cfg = self.cfg
        if self.pipe is not None:
            copies = self.pipe.replicas_count
            return ("activations and their gradients sent between stages"
                    + (f", gradients all-reduced in {cfg.comm_dtype} over the {copies} copies"
                       if copies > 1 else ""))
        if not cfg.shard_optimizer:
            return f"gradients all-reduced in {cfg.comm_dtype}"
        if self.reduce_scatter:
            return (f"gradients reduce-scattered in {cfg.comm_dtype} ({self.backend}), "
                    "optimizer state sharded")
        return (f"gradients all-reduced in {cfg.comm_dtype}, optimizer state sharded (each rank "
                f"keeps its share: {self.backend} has no sum_scatter)")

    def describe(self, cold: int) -> None:
        """The run's first log lines (rank 0): ranks and batch, data, adapters, precision."""
        cfg = self.cfg
        plan = self.train_data.plan
        if self.pipe is None:
            split = f"{self.size} ranks x {cfg.grad_accum} accum x {self.micro_batch}"
        else:
            pipe, micro = self.pipe, self.micro_batches
            split = (f"{pipe.replicas_count} x a pipeline of {pipe.stages} stages, each "
                     f"{micro} micro-batches of {self.micro_batch // micro}")
        self.log(f"ranks {self.size} | global batch {cfg.global_batch} = {split} | model "
                 f"{self.n_params / 1e6:.2f}M params"
                 f"{f' from {cfg.init_from}' if cfg.init_from else ''} | train "
                 f"{plan.n_sequences} sequences of {cfg.block_size}: {plan.steps_per_epoch} "
                 f"steps/epoch, {plan.dropped} dropped per epoch")
        if getattr(self.train_data.split, "masked", False):  # rows data (data.py)
            self.log(f"rows: one a sequence, padded to {cfg.block_size}; only trained "
                     f"targets count (loss, tokens/s); {self.train_data.split.cut} train "
                     f"and {self.val_split.cut} val rows longer than {cfg.block_size + 1} "
                     "tokens cut")
        if self.pipe is not None:
            held = held_at_once(pipeline_order(cfg.pipeline_schedule, 0, self.pipe.stages,
                                               self.micro_batches))
            self.log(f"pipeline of {self.pipe.stages} stages, {self.micro_batches} "
                     f"micro-batches of {self.micro_batch // self.micro_batches} rows, "
                     f"{cfg.pipeline_schedule}: bubble "
                     f"{bubble_fraction(self.pipe.stages, self.micro_batches):.0%}, at most "
                     f"{held} micro-batches' activations held")
        if self.lora:
            trained = self.n_trainable
            blocks = "all" if cfg.lora_layers < 0 else f"the last {cfg.lora_layers}"
            self.log(f"{NAMES[cfg.fine_tune]}: rank {cfg.lora_rank}, scale {cfg.lora_scale}, "
                     f"dropout {cfg.lora_dropout} on {blocks} blocks' "
                     f"{', '.join(parse_keys(cfg.lora_keys))}: {trained:,} trainable "
                     f"parameters ({100 * trained / self.n_params:.2f}%), the "
                     f"base frozen{' and quantized' if lora.is_quantized(self.model) else ''}")
        self.log(f"compute {cfg.dtype} on float32 master weights, {self.reduction()}"
                 f" | {self.flops_per_token / 1e6:.2f} MFLOPs per token; mfu against "
                 f"{self.peak_source}")
        if note := compile_cache.cold_note(cold, self.size):
            self.log(note)

    def run(self) -> dict:
        """Train from self.step to the end (or stop_after), then the last checkpoint
        and the export; return the last metrics."""
        cfg = self.cfg
        cold = int(compile_cache.compiles_cold(cfg.compile or (cfg.kernels == "auto"
                                                               and sys.platform == "linux")))
        if self.size > 1:  # every host has its own cache; rank 0 says how many are cold
            cold = int(all_sum(mx.array(cold), self.group).item())
        if self.rank == 0:
            make_out_dir(self.out)
            self.describe(cold)
        if self.rank == 0:
            for line in describe_mirrors(self.layout, self.mirrored):
                self.log(line)
        if self.pipe is not None:  # each rank its own stage, once
            print(f"rank {self.rank}: {self.stage_plan.describe(self.args.n_layers)} (held: "
                  f"{held_bytes(self.model) / 2**20:.2f} MiB)", flush=True)
        if cfg.resume:
            self.resume()
        last = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
        plan = LoopPlan(start=self.step, last=last, log_every=cfg.log_every,
                        eval_every=self.eval_every(), checkpoint_every=cfg.checkpoint_every,
                        flops_per_token=self.flops_per_token, peak_flops=self.peak,
                        dtype=cfg.dtype)
        callback = self.callback(last)
        record = train_loop(self.model, self.optimizer, self.train_data, self.step_fn, callback,
                            plan=plan, group=self.group,
                            evaluate=self.evaluate(),
                            save=self.save, stop=self.stop.agreed)
        self.step = last
        self.checkpoint()
        self.export()
        callback.on_train_end(self.step)  # sampling and plotting follow on rank 0 only
        return record

    def sample(self) -> str | None:
        """Text sampled from the trained model (rank 0); None with a pipeline, whose
        rank 0 holds its stage only."""
        if self.pipe is not None:
            return None
        ids = self.tokenizer.encode(self.cfg.sample_prompt)
        self.key, sub = mx.random.split(self.key)
        self.model.eval()
        out = generate(self.model, ids, self.cfg.sample_tokens, sub,
                       block_size=self.cfg.block_size)
        return self.cfg.sample_prompt + self.tokenizer.decode(out)


def make_out_dir(out: Path) -> None:
    """Create --out (rank 0); a DataError naming it when that is impossible."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory", "give --out a directory path")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"--out {out} cannot be created: {e.strerror}",
                        "give --out a path in a directory you can write to") from None


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = build_config(sys.argv[1:] if argv is None else argv)
        group = init_group()
        is_root = group.rank() == 0

        def log(msg: str) -> None:
            if is_root:
                print(msg, flush=True)

        trainer = Trainer(cfg, group, log)
        trainer.run()
    except Stopped as stopped:
        if is_root:  # within a bound: the controller may be cut off (stopping.py)
            # the record first: mlxcluster keeps the run stopped, not restarted
            said = [record_line({"event": "stopped", "step": stopped.step})] if recording() else []
            last_words([*said, f"{stopped}; checkpoint in {trainer.out / 'checkpoints'}"])
        return STOPPED_EXIT
    except (ValueError, DataError) as e:  # its input: exit 2, which no restart mends
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except RuntimeError as e:  # MLX or the distributed backend at run time: a restart may mend it
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except OSError as e:  # a full disk under another file the run writes (metrics.jsonl)
        if not is_disk_full(e):
            raise
        print(f"error: {full_disk_error(e, cfg.out)}", file=sys.stderr, flush=True)
        return 2
    if is_root:
        metrics = trainer.out / "metrics.jsonl"
        if metrics.exists() and not recording():  # else mlxcluster draws it where it keeps the record
            log(plot_metrics(metrics, trainer.out / "loss.png"))
        if cfg.sample_tokens > 0 and trainer.pipe is not None:
            log("no sample with --pipeline (each rank holds its stage only): sample OUT/model "
                "or OUT/adapters with mlx_lm.generate")
        elif cfg.sample_tokens > 0:
            text = trainer.sample()
            (trainer.out / "sample.txt").write_text(text + "\n")
            log(f"sample: {text!r}")
        log(f"done: step {trainer.step}, checkpoint in {trainer.out / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

