"""What a run does with what its training loop measures: the loop (loop.py) calls a
`TrainingCallback`, as mlx-lm's `train()` calls its `TrainingCallback`; the
heartbeats, the progress bar, the log lines and the metrics record implement it.

Every method is called on every rank, at the same steps; what a rank does with it
is its callback's choice (main gives rank 0 the log and the record, every rank the
heartbeats). The values are Python numbers and dicts, never mlx arrays: nothing
here imports mlx.

    on_train_start(step)      before the first step; `step` = where training starts
                              (0, or the step a resume continues from)
    on_step(step)             after each optimizer step; `step` = steps done
    on_log(record)            every --log_every steps and at the last: the metrics
                              record (below), the loss averaged over ranks and steps
    on_eval(step, val_loss)   after each validation
    on_checkpoint(step)       after a checkpoint written during training
    on_train_end(step)        when training, its last checkpoint and export are done

A logged record, as metrics.jsonl holds it (its keys in this order):

    {"step": 10, "loss": 4.83, "tokens_per_s": 5120.0, "lr": 0.0003, "grad_norm": 1.9,
     "peak_mem_mb": [101.2, 100.9], "peak_rss_mb": [410.0, 402.3], "ranks": 2,
     "mfu": 0.0012, "compute_s": 0.21, "comm_s": 0.01, "optimizer_s": 0.003,
     "dtype": "float32"}
"""

from __future__ import annotations

from pathlib import Path

from .metrics import print_heartbeat, print_progress, replay_records, save_record, start_record


class TrainingCallback:
    """Told what the training loop does; every method does nothing unless overridden."""

    def on_train_start(self, step: int) -> None:
        pass

    def on_step(self, step: int) -> None:
        pass

    def on_log(self, record: dict) -> None:
        pass

    def on_eval(self, step: int, val_loss: float) -> None:
        pass

    def on_checkpoint(self, step: int) -> None:
        pass

    def on_train_end(self, step: int) -> None:
        pass


class Callbacks(TrainingCallback):
    """Several callbacks, each told in turn, in the order given."""

    def __init__(self, *callbacks: TrainingCallback):
        self.callbacks = callbacks

    def _tell(self, method: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, method)(*args)

    def on_train_start(self, step: int) -> None:
        self._tell("on_train_start", step)

    def on_step(self, step: int) -> None:
        self._tell("on_step", step)

    def on_log(self, record: dict) -> None:
        self._tell("on_log", record)

    def on_eval(self, step: int, val_loss: float) -> None:
        self._tell("on_eval", step, val_loss)

    def on_checkpoint(self, step: int) -> None:
        self._tell("on_checkpoint", step)

    def on_train_end(self, step: int) -> None:
        self._tell("on_train_end", step)


class Heartbeats(TrainingCallback):
    """A heartbeat after each step, evaluation and checkpoint, and "done" at the end,
    for a launcher watching for a stalled rank (metrics.py)."""

    def __init__(self, rank: int):
        self.rank = rank

    def on_step(self, step: int) -> None:
        print_heartbeat(self.rank, step)

    def on_eval(self, step: int, val_loss: float) -> None:
        print_heartbeat(self.rank, step)

    def on_checkpoint(self, step: int) -> None:
        print_heartbeat(self.rank, step)

    def on_train_end(self, step: int) -> None:
        print_heartbeat(self.rank, "done")


class RecentRecords(TrainingCallback):
    """Every rank's copy of the records logged since the last checkpoint (each
    rank computes them: the loss is all-reduced), kept in the next checkpoint's
    state.json. Lines in flight when a job stops never reach mlxcluster's
    record (mlx.launch stops reading a dying job's ranks: seen in CI, step 2's
    loss missing after a resume from another host's checkpoint); a resume
    from that checkpoint replays them (Report)."""

    def __init__(self):
        self.records: list[dict] = []

    def on_log(self, record: dict) -> None:
        self.records.append(dict(record))  # the loop adds val_loss to its dict afterwards

    def on_eval(self, step: int, val_loss: float) -> None:
        self.records.append({"step": step, "val_loss": val_loss})

    def on_checkpoint(self, step: int) -> None:
        self.records.clear()


class ProgressBar(TrainingCallback):
    """A bar redrawn after each step (on a terminal), cleared before each log line."""

    def __init__(self, last: int):
        self.last = last

    def on_step(self, step: int) -> None:
        print_progress(step, self.last)

    def on_log(self, record: dict) -> None:
        print("\r", end="")


class Report(TrainingCallback):
    """The run's log lines and its metrics record (--out/metrics.jsonl, or
    mlxcluster's record when it keeps one): rank 0's."""

    def __init__(self, log, metrics_path: Path, steps: int, ranks: int,
                 replay: list[dict] | None = None):
        self.log, self.path, self.steps, self.ranks = log, metrics_path, steps, ranks
        self.replay = replay or []  # the resumed checkpoint's records (RecentRecords)

    def on_train_start(self, step: int) -> None:
        start_record(self.path, step, self.ranks)
        replay_records(self.path, self.replay)

    def on_log(self, record: dict) -> None:
        self.log(log_line(record, self.steps))
        save_record(self.path, record)

    def on_eval(self, step: int, val_loss: float) -> None:
        self.log(f"step {step:>6}/{self.steps} | val loss {val_loss:.4f}")
        save_record(self.path, {"step": step, "val_loss": val_loss})


def log_line(record: dict, steps: int) -> str:
    """A logged record as the log shows it."""
    mem, rss = record["peak_mem_mb"], record["peak_rss_mb"]
    preference = ""
    if "reward_margin" in record:  # --objective dpo or orpo (objectives.py)
        preference = (f" | rewards {record['chosen_reward']:.3f} chosen, "
                      f"{record['rejected_reward']:.3f} rejected, margin "
                      f"{record['reward_margin']:.3f}, acc {record['accuracy']:.3f}")
    return (f"step {record['step']:>6}/{steps} | loss {record['loss']:.4f}{preference} | lr "
            f"{record['lr']:.2e} | {record['tokens_per_s']:,.0f} tok/s | peak MiB "
            f"per rank {'/'.join(f'{v:.0f}' for v in mem)} (mlx), "
            f"{'/'.join(f'{v:.0f}' for v in rss)} (rss) | mfu "
            f"{100 * record['mfu']:.1f}% | step {record['compute_s'] * 1000:.0f} ms "
            f"compute, {record['comm_s'] * 1000:.0f} comm, "
            f"{record['optimizer_s'] * 1000:.0f} optimizer")
