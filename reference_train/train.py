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
handed to the training loop of loop.py; resume, checkpoints, export) and `main`.
The Trainer holds the run's parallelism (parallelism.py: data-parallel, or
--pipeline N) and never asks which it holds; what each other module holds is
listed in reference_train/__init__.py.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np

from . import compile_cache, kernels, lora
from .callbacks import (
    Callbacks,
    Heartbeats,
    ProgressBar,
    RecentRecords,
    Report,
    TrainingCallback,
)
from .checkpoint import checkpoint_name, save_checkpoint
from .collectives import all_sum
from .config import TrainConfig, build_config
from .data import ShardedBatches, load_meta, open_split, split_batch
from .disk_room import RoomWatch, full_disk_error, is_disk_full, said_when_full
from .errors import DataError
from .launch_env import current_backend, init_group
from .loop import LoopPlan, train_loop, validation
from .metrics import heartbeat_wanted, plot_metrics, record_line, recording
from .mfu import flops_per_token, peak_flops
from .parallelism import make_parallelism
from .prepare import ensure_default_data
from .resume import check_loaded, check_trained_alike, checkpoint_root, find_storage, host_layout
from .stopping import STOPPED_EXIT, Stopped, StopRequest, last_words, part_together
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


def make_optimizer(cfg: TrainConfig, model, part):
    """AdamW, initialised by the run's parallelism `part` for what this rank updates
    (or each rank's share of it: --shard_optimizer)."""
    optimizer = optim.AdamW(learning_rate=schedule(cfg), betas=[cfg.beta1, cfg.beta2],
                            weight_decay=cfg.weight_decay)
    return part.init_optimizer(optimizer, model)


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
        # data-parallel, or this rank one stage of a pipeline (parallelism.py); a
        # pipeline's refusals come before anything loads
        self.part = make_parallelism(cfg, group, self.backend, self.meta, log)
        # The ranks that share each global batch's rows: all (data-parallel), or the
        # copies of the pipeline (each of whose stages reads its copy's rows).
        self.data_group = self.part.data_group
        # One checkpoint writer per --out folder: per host (Macs have their own disks),
        # or one for the hosts that see the same folder (storage.py finds out, with tokens);
        # the part says which of them write this rank's checkpoints.
        self.out = Path(cfg.out)
        self.layout = find_storage(group, host_layout(group), self.out)
        if self.rank == 0 and (note := describe_storage(self.layout, self.out)):
            log(note)
        self.writers = self.part.place(self.layout)
        self.micro_batch = split_batch(cfg.global_batch, self.data_group.size(), cfg.grad_accum)
        self.tokenizer = make_tokenizer(self.meta["tokenizer"], data_dir)
        self.train_data = ShardedBatches(open_split(data_dir, "train", cfg.block_size),
                                         cfg.global_batch, self.data_group, cfg.seed)
        self.val_split = open_split(data_dir, "val", cfg.block_size)
        self.lora = self.part.lora  # LoRA or DoRA: only adapters train
        self.checkpoints = self.part.checkpoints(self.out / "checkpoints")
        # --dtype bfloat16: the passes run on a bfloat16 copy (self.compute); self.model
        # stays the float32 master.
        self.model, self.compute = self.part.build(data_dir)
        self.args = self.model.args
        self.optimizer = make_optimizer(cfg, self.model, self.part)
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step_fn = self.part.make_step(self.model, self.compute)
        # The whole model's parameters (a pipeline's: every stage's, summed).
        self.n_params, self.n_trainable = self.part.counts(self.model)
        # Where the time goes (mfu.py): the model's FLOPs per token and this rank's peak.
        a = self.args
        embedding = 0 if a.tie_embeddings else a.vocab_size * a.dim  # a lookup, not a matmul
        self.flops_per_token = flops_per_token(self.n_params, embedding, a.n_layers,
                                               a.n_heads, a.head_dim or a.dim // a.n_heads,
                                               cfg.block_size)
        self.peak, self.peak_source = peak_flops(getattr(mx, cfg.dtype))
        # All randomness after initialisation flows from this key (saved in checkpoints).
        self.key = mx.random.key(cfg.seed + 1)
        self.step = 0
        self.heartbeat = heartbeat_wanted()
        self.recent = RecentRecords()  # kept in each checkpoint, replayed on resume
        self.replay: list[dict] = []  # the resumed checkpoint's (Report sends them again)
        self.stop = StopRequest(group)  # SIGUSR2: checkpoint and stop (stopping.py)
        self.room = RoomWatch()  # room for the next checkpoint on this host (disk_room.py)

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
        """The validation loss (loop.py's evaluate), through the step function's loss."""
        cfg = self.cfg
        return validation(self.val_split, cfg.global_batch, self.data_group, cfg.eval_batches,
                          self.step_fn.loss)

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
        root, only = checkpoint_root(cfg.resume, self.out)
        found = self.part.find(root, only, self.resume_layout)
        if found is None:
            if cfg.resume == "auto":
                self.log(f"no checkpoint in {self.out}; starting from step 0")
                return
            raise DataError(f"no checkpoint at {cfg.resume}",
                            "give a checkpoints/step_NNNNNN directory or the run's --out")
        loaded = self.part.load(found, self.model, self.optimizer, self.check_saved)
        if loaded.folder is not None:  # the next checkpoint's size, for the room check before it
            self.room.saw(loaded.folder)
        state = loaded.state
        check_loaded(self.data_group, self.writers, state["step"], loaded.digest)
        self.step = state["step"]
        self.replay = state.get("records", [])
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        if self.lora and "global_rng_key" in state:  # LoRA's dropout draws from it
            hi, lo = state["global_rng_key"]
            mx.random.seed((hi << 32) | lo)
        self.log(f"resumed from {loaded.where} at step {self.step} (data epoch "
                 f"{state['data']['epoch']}, step {state['data']['step_in_epoch']})")

    def check_saved(self, saved: dict, where) -> None:
        """A DataError unless checkpoint `where`'s state.json is this run's model and
        fine-tuning."""
        check_trained_alike(saved, where, self.args, self.cfg, self.lora)

    def resume_layout(self, root: Path):
        """Which ranks see the same `root` (a --resume PATH elsewhere than --out: its own
        question; collective)."""
        if root == self.out / "checkpoints":
            return self.layout
        return find_storage(self.group, host_layout(self.group), root, "--resume", required=False)

    def save(self, step: int) -> None:
        """The loop's checkpoint (loop.py): step `step`'s."""
        self.step = step
        self.checkpoint()

    def checkpoint(self) -> None:
        # e.g. a sharded optimizer's state, whole on every host: gathered by every rank
        optimizer = self.part.saved_optimizer(self.optimizer)
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
                 "records": self.recent.records, **self.part.state()}
        if self.lora:
            state["global_rng_key"] = mx.random.state[0].tolist()
        with said_when_full(root, name):
            saved = save_checkpoint(root, self.step, self.model, optimizer,
                                    state, self.cfg.keep_checkpoints, trainable_only=self.lora)
        self.room.saw(saved)
        self.part.mirror(saved)  # a pipeline's, on the next stage's host too (mirror.py)

    def export(self) -> None:
        """OUT/model or OUT/adapters, the trained model as mlx-lm opens it (the part's:
        written by one writer per --out folder, to a temporary folder renamed)."""
        self.part.export(self.model, self.args, self.checkpoints / checkpoint_name(self.step),
                         self.data_dir)

    def train_step(self, timed: bool = False) -> tuple[mx.array, mx.array]:
        """One step of the step function on this rank's slice of global batch
        `self.step` (for benchmarks: run() goes through the loop); returns (this
        rank's loss, gradient norm), evaluated; advances self.step."""
        result = self.step_fn(self.model, self.optimizer, self.train_data.batch(self.step), timed)
        self.step += 1
        return result.loss, result.grad_norm

    def describe(self, cold: int) -> None:
        """The run's first log lines (rank 0): ranks and batch, data, adapters, precision."""
        cfg = self.cfg
        plan = self.train_data.plan
        split, lines = self.part.describe(self.micro_batch)
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
        for line in lines:
            self.log(line)
        if self.lora:
            self.log(lora.describe_adapters(cfg, self.model, self.n_trainable, self.n_params))
        self.log(f"compute {cfg.dtype} on float32 master weights, {self.part.reduction()}"
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
            for line in self.part.mirrors():
                self.log(line)
        self.part.announce(self.model)  # a pipeline's ranks: each its own stage, once
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
                            save=self.save, stop=self.stop.agreed,
                            objective=self.part.objective)
        self.step = last
        self.checkpoint()
        self.export()
        callback.on_train_end(self.step)  # sampling and plotting follow on rank 0 only
        return record

    def sample(self) -> str | None:
        """Text sampled from the trained model (rank 0); None when its rank 0 holds
        part of the model only (a pipeline's stage: part.no_sample says so)."""
        ids = self.tokenizer.encode(self.cfg.sample_prompt)
        self.key, sub = mx.random.split(self.key)
        out = self.part.sample(self.model, ids, self.cfg.sample_tokens, sub)
        return None if out is None else self.cfg.sample_prompt + self.tokenizer.decode(out)


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
        part_together(group)
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
        if cfg.sample_tokens > 0 and trainer.part.no_sample:
            log(trainer.part.no_sample)
        elif cfg.sample_tokens > 0:
            text = trainer.sample()
            (trainer.out / "sample.txt").write_text(text + "\n")
            log(f"sample: {text!r}")
        log(f"done: step {trainer.step}, checkpoint in {trainer.out / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

