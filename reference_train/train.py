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

This file is the `Trainer` (one rank's model, optimizer, data and compiled step,
and the training loop) and `main`; what each other module holds is listed in
reference_train/__init__.py.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from . import compile_cache, kernels, lora
from .checkpoint import checkpoint_name, content_hash, load_checkpoint, save_checkpoint
from .config import TrainConfig, build_config, model_args
from .data import ShardedBatches, load_meta, open_split, split_batch, validation_batches
from .disk_room import RoomWatch, full_disk_error, is_disk_full, said_when_full
from .errors import DataError
from .export import export_model
from .hf_io import model_from_folder
from .launch_env import current_backend, has_sum_scatter, init_group
from .metrics import (
    emit_folder,
    heartbeat_wanted,
    plot_metrics,
    print_heartbeat,
    print_progress,
    recording,
    save_record,
    start_record,
)
from .mfu import flops_per_token, peak_flops
from .model import Llama, args_match, count_parameters, generate, loss_fn
from .precision import average_gradients, compute_copy, dtype_of, refresh, to_float32
from .prepare import ensure_default_data
from .resume import agree_on_checkpoint, check_loaded, checkpoint_root, find_storage, host_layout
from .sharded_optimizer import ShardedOptimizer
from .stopping import STOPPED_EXIT, Stopped, StopRequest, never_block_output
from .storage import describe_storage
from .tokenizer import make_tokenizer

# ---------------------------------------------------------------- memory


def peak_memory_mb() -> tuple[float, float]:
    """(MLX allocator peak, process peak RSS) in MiB for this process."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB
    return mx.get_peak_memory() / 2**20, rss_bytes / 2**20


# ---------------------------------------------------------------- the run


class Trainer:
    """Holds the model, optimizer, data and compiled step of one rank."""

    def __init__(self, cfg: TrainConfig, group, log=print):
        self.cfg, self.group, self.log = cfg, group, log
        self.rank, self.size = group.rank(), group.size()
        kernels.use(cfg.kernels)  # before any step is traced
        self.backend = current_backend(group)
        self.reduce_scatter = False
        # One checkpoint writer per --out folder: per host (Macs have their own disks),
        # or one for the hosts that see the same folder (storage.py finds out, with tokens).
        self.layout = find_storage(group, host_layout(group), Path(cfg.out))
        if self.rank == 0 and (note := describe_storage(self.layout, Path(cfg.out))):
            log(note)
        self.micro_batch = split_batch(cfg.global_batch, self.size, cfg.grad_accum)
        self.data_dir = data_dir = Path(cfg.data) if cfg.data else ensure_default_data()
        self.meta = load_meta(data_dir)
        self.tokenizer = make_tokenizer(self.meta["tokenizer"], data_dir)
        self.train_data = ShardedBatches(open_split(data_dir, "train", cfg.block_size),
                                         cfg.global_batch, group, cfg.seed)
        self.val_split = open_split(data_dir, "val", cfg.block_size)
        mx.random.seed(cfg.seed)  # every rank draws the same initial weights
        if cfg.init_from:  # the model's shape and weights from a Llama folder (hf_io.py)
            self.model = model_from_folder(cfg.init_from, self.meta, data_dir, cfg.fine_tune)
        else:
            self.model = Llama(model_args(cfg, self.meta["vocab_size"]))
        self.args = self.model.args
        # --fine_tune lora: the base frozen (quantized or not), only the adapters train (lora.py)
        self.lora = cfg.fine_tune == "lora"
        if self.lora:
            if cfg.dtype != "float32" and lora.is_quantized(self.model):
                raise DataError(f"--dtype {cfg.dtype} with a quantized base ({cfg.init_from}) "
                                "is not supported", "use --dtype float32 (the adapters train "
                                "in float32 on the quantized base)")
            lora.apply_config(self.model, cfg)
        # --dtype bfloat16: the passes run on a bfloat16 copy; self.model stays the float32 master.
        self.compute_dtype, self.comm_dtype = dtype_of(cfg.dtype), dtype_of(cfg.comm_dtype)
        self.compute = compute_copy(self.model, self.empty_model, self.compute_dtype)
        for m in (self.model, self.compute):  # --grad_checkpoint: blocks recomputed (model.py)
            m.grad_checkpoint = cfg.grad_checkpoint
        self.optimizer = optim.AdamW(learning_rate=self.schedule(), betas=[cfg.beta1, cfg.beta2],
                                     weight_decay=cfg.weight_decay)
        if cfg.shard_optimizer:  # each rank keeps its share of the state (sharded_optimizer.py)
            self.reduce_scatter = has_sum_scatter(self.backend, mx.__version__)
            self.optimizer = ShardedOptimizer(self.optimizer, self.model, group,
                                              reduce_scatter=self.reduce_scatter)
        else:
            self.optimizer.init(self.model.trainable_parameters())
        mx.eval(self.model.parameters(), self.optimizer.state)
        # Where the time goes (mfu.py): the model's FLOPs per token and this rank's peak.
        a = self.args
        embedding = 0 if a.tie_embeddings else a.vocab_size * a.dim  # a lookup, not a matmul
        self.flops_per_token = flops_per_token(count_parameters(self.model), embedding, a.n_layers,
                                               a.n_heads, a.head_dim or a.dim // a.n_heads,
                                               cfg.block_size)
        self.peak, self.peak_source = peak_flops(self.compute_dtype)
        self.split: dict = {}  # the last timed step's phases (train_step)
        # All randomness after initialisation flows from this key (saved in checkpoints).
        self.key = mx.random.key(cfg.seed + 1)
        self.step = 0
        self.out = Path(cfg.out)
        self._steps = None
        self.heartbeat = heartbeat_wanted()
        self.stop = StopRequest(group)  # SIGUSR2: checkpoint and stop (stopping.py)
        self.room = RoomWatch()  # room for the next checkpoint on this host (disk_room.py)

    def empty_model(self) -> Llama:
        """A model of this run's shape (with its LoRA layers, frozen alike), for the compute copy."""
        model = Llama(self.args)
        return lora.apply_config(model, self.cfg) if self.lora else model

    def beat(self, what: int | str | None = None) -> None:
        """Tell a watching launcher this rank made progress (metrics.py)."""
        if self.heartbeat:
            print_heartbeat(self.rank, self.step if what is None else what)

    def schedule(self):
        cfg = self.cfg
        warmup = min(cfg.warmup_steps, cfg.steps)
        cosine = optim.cosine_decay(cfg.lr, max(1, cfg.steps - warmup), cfg.min_lr)
        if warmup == 0:
            return cosine
        return optim.join_schedules([optim.linear_schedule(cfg.lr / warmup, cfg.lr, warmup),
                                     cosine], [warmup])

    def build_steps(self):
        """Compiled gradient, all-reduce and update functions (state captured,
        see mx.compile), and the three as one: the step that is not timed and
        has one micro-batch runs as one compiled graph, which MLX schedules
        without a stop between the phases."""
        model, optimizer, group, clip = self.model, self.optimizer, self.group, self.cfg.grad_clip
        compute, dtype, comm = self.compute, self.compute_dtype, self.comm_dtype
        loss_and_grad = nn.value_and_grad(compute, loss_fn)
        state = [model.state, optimizer.state] + ([compute.state] if compute is not model else [])
        if self.lora and self.cfg.lora_dropout > 0:
            state.append(mx.random.state)  # dropout draws from mlx's global random state

        def grad_step(x, y, *weights):  # weights: rows data's trained targets (data.py)
            if compute is model:
                return loss_and_grad(model, x, y, *weights)
            refresh(compute, model, dtype)  # bfloat16 passes on the float32 master's values
            loss, grads = loss_and_grad(compute, x, y, *weights)
            return loss.astype(mx.float32), to_float32(grads)

        # Sharded (sharded_optimizer.py): each rank receives, clips and updates its share only.
        sharded = isinstance(optimizer, ShardedOptimizer)
        clip_grad_norm = optimizer.clip_grad_norm if sharded else optim.clip_grad_norm

        def reduce_step(grads):  # the gradient all-reduce, apart: its time is measured
            if sharded:
                return optimizer.average_gradients(grads, comm)
            return average_gradients(grads, group, comm)

        def update_step(grads):
            if clip > 0:
                grads, norm = clip_grad_norm(grads, clip)
            else:
                norm = mx.array(0.0)
            optimizer.update(model, grads)
            return norm

        def whole_step(x, y, *weights):  # the three in one graph, as mlx-lm compiles its step
            loss, grads = grad_step(x, y, *weights)
            return loss, update_step(reduce_step(grads))

        if self.cfg.compile:
            # value_and_grad writes the parameters back into the model, so the
            # gradient step must declare the state as an output too.
            compile_ = partial(mx.compile, inputs=state, outputs=state)
            whole_step = compile_(whole_step)
            grad_step, update_step = compile_(grad_step), compile_(update_step)
            reduce_step = mx.compile(reduce_step)
        return grad_step, reduce_step, update_step, whole_step

    def resume(self) -> None:
        """Load the newest checkpoint, agreed by every rank (resume.py: a host lacking
        it receives it from one that has it; ranks holding different states refuse)."""
        cfg = self.cfg
        root, only = checkpoint_root(cfg.resume, self.out)
        # --resume PATH elsewhere than --out: which hosts share that folder is its own question
        layout = self.layout if root == self.out / "checkpoints" else \
            find_storage(self.group, host_layout(self.group), root, "--resume", required=False)
        path, own_notes, notes = agree_on_checkpoint(self.group, layout, root, only,
                                                     cfg.keep_checkpoints, before=cfg.resume_before)
        for note in own_notes:  # about this host's disk: said by the rank that saw it
            print(f"note: {note}", flush=True)
        for note in notes:
            self.log(note)
        if path is None:
            if cfg.resume == "auto":
                self.log(f"no checkpoint in {self.out}; starting from step 0")
                return
            raise DataError(f"no checkpoint at {cfg.resume}",
                            "give a checkpoints/step_NNNNNN directory or the run's --out")
        with open(path / "state.json") as f:
            saved = json.load(f)
        saved_args = saved["model_args"]
        if not args_match(saved_args, self.args):
            raise DataError(f"{path} holds a different model: {saved_args}",
                            "resume with the same model settings")
        tuning = ("fine_tune", *(f"lora_{k}" for k in ("rank", "scale", "dropout", "layers",
                                                        "keys"))) if self.lora else ("fine_tune",)
        theirs = {k: saved.get("config", {}).get(k, "full" if k == "fine_tune" else None)
                  for k in tuning}
        ours = {k: getattr(self.cfg, k) for k in tuning}
        if theirs != ours:
            raise DataError(f"{path} was trained with {theirs}, this run asks for {ours}",
                            "resume with the checkpoint's --fine_tune and --lora_* settings")
        state = load_checkpoint(path, self.model, self.optimizer, trainable_only=self.lora)
        self.room.saw(path)  # the next checkpoint's size, for the room check before it
        check_loaded(self.group, self.layout, state["step"], content_hash(path))
        self.step = state["step"]
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        if self.lora and "global_rng_key" in state:  # LoRA's dropout draws from it
            hi, lo = state["global_rng_key"]
            mx.random.seed((hi << 32) | lo)
        self.log(f"resumed from {path} at step {self.step} (data epoch "
                 f"{state['data']['epoch']}, step {state['data']['step_in_epoch']})")

    def checkpoint(self) -> None:
        optimizer = self.optimizer
        if isinstance(optimizer, ShardedOptimizer):  # whole on every host: gathered by every rank
            optimizer = SimpleNamespace(state=optimizer.gathered_state())
        if not self.layout.writes:  # every rank holds the same weights: one copy per --out
            return
        root, name = self.out / "checkpoints", f"checkpoint {checkpoint_name(self.step)}"
        if warning := self.room.before(root, name):  # a DataError when it cannot fit (disk_room.py)
            if self.rank == 0:
                self.log(f"warning: {warning}")
            else:  # every writer says it of its own disk; the launcher shows its stderr
                print(f"warning: {warning}", file=sys.stderr, flush=True)
        state = {"data": self.train_data.position(self.step),
                 "rng_key": np.array(self.key).tolist(), "config": asdict(self.cfg),
                 "model_args": asdict(self.args), "world_size": self.size}
        if self.lora:
            state["global_rng_key"] = mx.random.state[0].tolist()
        with said_when_full(root, name):
            saved = save_checkpoint(root, self.step, self.model, optimizer,
                                    state, self.cfg.keep_checkpoints, trainable_only=self.lora)
        self.room.saw(saved)

    def export(self) -> None:
        """OUT/model, the trained model as mlx-lm opens it; like checkpoints, one writer
        per --out folder (every host keeps its own copy, hosts sharing one disk one copy),
        written to a temporary folder and renamed."""
        if self.layout.writes:
            # From the checkpoint just written: its model.safetensors holds the float32
            # master weights (DESIGN: whatever dtype the step computes in).
            saved = self.out / "checkpoints" / checkpoint_name(self.step) / "model.safetensors"
            if self.lora:  # OUT/adapters, for mlx-lm with the --init_from model (lora.py)
                with said_when_full(self.out, "the adapters"):
                    folder = lora.write_adapters(mx.load(str(saved)),
                                                 lora.adapter_config(self.cfg, self.args.n_layers),
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

    def evaluate(self) -> float:
        """Validation loss averaged over every rank's share of `eval_batches` global batches."""
        total, n = mx.array(0.0), 0
        self.model.eval()  # no dropout (LoRA's)
        for batch in validation_batches(self.val_split, self.cfg.global_batch, self.group,
                                        self.cfg.eval_batches):
            total = total + loss_fn(self.model, *(mx.array(a) for a in batch))
            n += 1
        mx.eval(total)
        self.model.train()
        if n == 0:
            return float("nan")
        return (mx.distributed.all_sum(total, group=self.group) / (n * self.size)).item()

    def gather_memory(self) -> tuple[list[float], list[float]]:
        """Every rank's (MLX peak, RSS peak) in MiB, gathered on all ranks."""
        mine = mx.array([peak_memory_mb()], dtype=mx.float32)
        every = mx.distributed.all_gather(mine, group=self.group) if self.size > 1 else mine
        every = np.array(every).reshape(-1, 2)
        return [round(float(v), 1) for v in every[:, 0]], [round(float(v), 1) for v in every[:, 1]]

    def train_step(self, timed: bool = False) -> tuple[mx.array, mx.array]:
        """One optimizer step on this rank's slice of global batch `self.step`.

        Returns (this rank's loss, gradient norm), evaluated; advances self.step.
        ``timed``: evaluate between the phases and keep their seconds in
        ``self.split`` (compute, gradient communication, optimizer); the
        values are the same, only the waits differ (logged steps only).
        """
        cfg = self.cfg
        if self._steps is None:  # built after any resume replaced the optimizer state
            self._steps = self.build_steps()
        grad_step, reduce_step, update_step, whole_step = self._steps
        start = time.perf_counter()
        x_all, y_all, *w_all = self.train_data.batch(self.step)  # w_all: rows data's weights
        if cfg.grad_accum == 1 and not timed:
            step_loss, norm = whole_step(mx.array(x_all), mx.array(y_all),
                                         *(mx.array(w) for w in w_all))
            mx.eval(self.model.parameters(), self.optimizer.state, step_loss, norm)
            self.step += 1
            return step_loss, norm
        step_loss, grads = mx.array(0.0), None
        for m in range(cfg.grad_accum):
            rows = slice(m * self.micro_batch, (m + 1) * self.micro_batch)
            loss, g = grad_step(mx.array(x_all[rows]), mx.array(y_all[rows]),
                                *(mx.array(w[rows]) for w in w_all))
            grads = g if grads is None else tree_map(mx.add, grads, g)
            step_loss = step_loss + loss
            if cfg.grad_accum > 1:
                mx.eval(grads, step_loss)  # bound memory to one micro-batch of activations
        if cfg.grad_accum > 1:
            grads = tree_map(lambda g: g / cfg.grad_accum, grads)
        if timed:
            mx.eval(grads, step_loss)
            computed = time.perf_counter()
        grads = reduce_step(grads)
        if timed:
            mx.eval(grads)
            reduced = time.perf_counter()
        norm = update_step(grads)
        step_loss = step_loss / cfg.grad_accum
        mx.eval(self.model.parameters(), self.optimizer.state, step_loss, norm)
        if timed:
            self.split = {"compute_s": round(computed - start, 6), "comm_s": round(reduced - computed, 6),
                          "optimizer_s": round(time.perf_counter() - reduced, 6)}
        self.step += 1
        return step_loss, norm

    def reduction(self) -> str:
        """How the gradients are averaged, for the log."""
        cfg = self.cfg
        if not cfg.shard_optimizer:
            return f"gradients all-reduced in {cfg.comm_dtype}"
        if self.reduce_scatter:
            return (f"gradients reduce-scattered in {cfg.comm_dtype} ({self.backend}), "
                    "optimizer state sharded")
        return (f"gradients all-reduced in {cfg.comm_dtype}, optimizer state sharded (each rank "
                f"keeps its share: {self.backend} has no sum_scatter)")

    def run(self) -> dict:
        """Train from self.step to the end (or stop_after); return the last metrics."""
        cfg = self.cfg
        cold = int(compile_cache.compiles_cold(cfg.compile or (cfg.kernels == "auto"
                                                               and sys.platform == "linux")))
        if self.size > 1:  # every host has its own cache; rank 0 says how many are cold
            cold = int(mx.distributed.all_sum(mx.array(cold), group=self.group,
                                              stream=mx.cpu).item())
        if self.rank == 0:
            make_out_dir(self.out)
            plan = self.train_data.plan
            self.log(f"ranks {self.size} | global batch {cfg.global_batch} = {self.size} ranks x "
                     f"{cfg.grad_accum} accum x {self.micro_batch} | model "
                     f"{count_parameters(self.model) / 1e6:.2f}M params"
                     f"{f' from {cfg.init_from}' if cfg.init_from else ''} | train "
                     f"{plan.n_sequences} sequences of {cfg.block_size}: {plan.steps_per_epoch} "
                     f"steps/epoch, {plan.dropped} dropped per epoch")
            if getattr(self.train_data.split, "masked", False):  # rows data (data.py)
                self.log(f"rows: one a sequence, padded to {cfg.block_size}; only trained "
                         f"targets count (loss, tokens/s); {self.train_data.split.cut} train "
                         f"and {self.val_split.cut} val rows longer than {cfg.block_size + 1} "
                         "tokens cut")
            if self.lora:
                trained = lora.trainable_count(self.model)
                blocks = "all" if cfg.lora_layers < 0 else f"the last {cfg.lora_layers}"
                self.log(f"LoRA: rank {cfg.lora_rank}, scale {cfg.lora_scale}, dropout "
                         f"{cfg.lora_dropout} on {blocks} blocks' "
                         f"{', '.join(lora.parse_keys(cfg.lora_keys))}: {trained:,} trainable "
                         f"parameters ({100 * trained / count_parameters(self.model):.2f}%), the "
                         f"base frozen{' and quantized' if lora.is_quantized(self.model) else ''}")
            self.log(f"compute {cfg.dtype} on float32 master weights, {self.reduction()}"
                     f" | {self.flops_per_token / 1e6:.2f} MFLOPs per token; mfu against "
                     f"{self.peak_source}")
            if note := compile_cache.cold_note(cold, self.size):
                self.log(note)
        if cfg.resume:
            self.resume()
        metrics_path = self.out / "metrics.jsonl"
        if self.rank == 0:
            start_record(metrics_path, self.step, self.size)
        last = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
        show_bar = cfg.progress and self.rank == 0 and sys.stdout.isatty()
        record: dict = {}
        loss_sum, interval_steps, t0 = mx.array(0.0), 0, time.perf_counter()
        interval_tokens = 0  # trained targets: every position for text data
        while self.step < last:
            interval_tokens += self.train_data.trained_tokens(self.step)
            logged = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == last
            step_loss, norm = self.train_step(timed=logged)
            self.beat()
            loss_sum = loss_sum + step_loss
            interval_steps += 1
            if show_bar:
                print_progress(self.step, last)
            if self.step % cfg.log_every == 0 or self.step == last:
                elapsed = time.perf_counter() - t0
                loss = (mx.distributed.all_sum(loss_sum, group=self.group)
                        / (self.size * interval_steps)).item()
                mem, rss = self.gather_memory()
                record = {"step": self.step, "loss": loss,
                          "tokens_per_s": round(interval_tokens / elapsed, 1),
                          "lr": float(self.optimizer.learning_rate.item()),
                          "grad_norm": float(norm.item()), "peak_mem_mb": mem,
                          "peak_rss_mb": rss, "ranks": self.size}
                record["mfu"] = round(self.flops_per_token * record["tokens_per_s"]
                                      / (self.peak * self.size), 6)
                record.update(self.split)  # this step's: compute, gradient all-reduce, optimizer
                record["dtype"] = cfg.dtype
                if self.rank == 0:
                    if show_bar:
                        print("\r", end="")
                    self.log(f"step {self.step:>6}/{cfg.steps} | loss {loss:.4f} | lr "
                             f"{record['lr']:.2e} | {record['tokens_per_s']:,.0f} tok/s | peak MiB "
                             f"per rank {'/'.join(f'{v:.0f}' for v in mem)} (mlx), "
                             f"{'/'.join(f'{v:.0f}' for v in rss)} (rss) | mfu "
                             f"{100 * record['mfu']:.1f}% | step {record['compute_s'] * 1000:.0f} ms "
                             f"compute, {record['comm_s'] * 1000:.0f} comm, "
                             f"{record['optimizer_s'] * 1000:.0f} optimizer")
                    save_record(metrics_path, record)
                loss_sum, interval_steps, interval_tokens = mx.array(0.0), 0, 0
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == last):
                val = self.evaluate()
                if self.rank == 0:
                    self.log(f"step {self.step:>6}/{cfg.steps} | val loss {val:.4f}")
                    save_record(metrics_path, {"step": self.step, "val_loss": val})
                record["val_loss"] = val
                self.beat()
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < last:
                self.checkpoint()
                self.beat()
            if interval_steps == 0 and self.step < last and self.stop.agreed():
                self.checkpoint()  # every rank at this logged step (stopping.py)
                raise Stopped(self.step)
            if interval_steps == 0:
                t0 = time.perf_counter()  # time only training, not logging or evaluation
        self.checkpoint()
        self.export()
        return record

    def sample(self) -> str:
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
        trainer.beat("done")  # sampling and plotting follow on rank 0 only
    except Stopped as stopped:
        never_block_output()  # the controller may be cut off (stopping.py)
        try:
            log(f"{stopped}; checkpoint in {trainer.out / 'checkpoints'}")
        except OSError:
            pass
        return STOPPED_EXIT
    except (ValueError, DataError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:  # a full disk under another file the run writes (metrics.jsonl)
        if not is_disk_full(e):
            raise
        print(f"error: {full_disk_error(e, cfg.out)}", file=sys.stderr, flush=True)
        return 2
    if is_root:
        metrics = trainer.out / "metrics.jsonl"
        if metrics.exists() and not recording():  # else mlxcluster draws it where it keeps the record
            log(plot_metrics(metrics, trainer.out / "loss.png"))
        if cfg.sample_tokens > 0:
            text = trainer.sample()
            (trainer.out / "sample.txt").write_text(text + "\n")
            log(f"sample: {text!r}")
        log(f"done: step {trainer.step}, checkpoint in {trainer.out / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

