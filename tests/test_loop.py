"""The training loop handed its parts (reference_train/loop.py, issue 38 item 7): any
step function that keeps the contract trains through it, the callback is told what
happens in order, the metrics record keeps its keys and their order, and the log
line its format. The real runs through the data-parallel step are the trainer
tests (test_train_run.py, test_lora.py, ...): the same losses as before."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from reference_train.callbacks import Callbacks, Report, TrainingCallback, log_line
from reference_train.loop import LoopPlan, StepResult, train_loop
from reference_train.metrics import RECORD_ENV
from reference_train.stopping import Stopped

RECORD_KEYS = ["step", "loss", "tokens_per_s", "lr", "grad_norm", "peak_mem_mb", "peak_rss_mb",
               "ranks", "mfu", "compute_s", "comm_s", "optimizer_s", "dtype"]


class Told(TrainingCallback):
    """Every call, in order."""

    def __init__(self):
        self.calls: list[tuple] = []

    def on_train_start(self, step):
        self.calls.append(("start", step))

    def on_step(self, step):
        self.calls.append(("step", step))

    def on_log(self, record):
        self.calls.append(("log", record["step"], record["loss"]))

    def on_eval(self, step, val_loss):
        self.calls.append(("eval", step, val_loss))

    def on_checkpoint(self, step):
        self.calls.append(("checkpoint", step))


class Rows:
    """Global batch i: rows of the value i (its loss, in the step below, is i)."""

    def batch(self, i):
        return np.full((2, 3), i, dtype=np.int32), np.zeros((2, 3), dtype=np.int32)

    def trained_tokens(self, i):
        return 6


class SumStep:
    """A step function of another kind than data-parallel's: it trains nothing,
    its loss is the batch's value, and it notes what it was handed."""

    def __init__(self):
        self.handed: list[tuple] = []

    def __call__(self, model, optimizer, batch, timed):
        self.handed.append((model, optimizer, int(batch[0][0, 0]), timed))
        phases = {"compute_s": 0.5, "comm_s": 0.25, "optimizer_s": 0.125} if timed else {}
        return StepResult(mx.array(float(batch[0][0, 0])), mx.array(2.0), phases)


def run(plan: LoopPlan, stop=lambda: False):
    model, optimizer = object(), SimpleNamespace(learning_rate=mx.array(0.01))
    step, told, saved = SumStep(), Told(), []
    record = train_loop(model, optimizer, Rows(), step, told, plan=plan,
                        group=mx.distributed.init(), evaluate=lambda m: 7.0 if m is model else -1,
                        save=saved.append, stop=stop)
    return record, step, told, saved, (model, optimizer)


def test_the_loop_runs_any_step_function_and_tells_the_callback_in_order():
    plan = LoopPlan(start=0, last=5, log_every=2, eval_every=3, checkpoint_every=4,
                    flops_per_token=100.0, peak_flops=1e6, dtype="float32")
    record, step, told, saved, parts = run(plan)
    # handed the model and optimizer, global batches 0..4 in order, timed at logged steps
    assert [h[:2] == parts for h in step.handed] == [True] * 5
    assert [(h[2], h[3]) for h in step.handed] == [(0, False), (1, True), (2, False), (3, True),
                                                  (4, True)]
    # the loss logged: the mean over the interval's steps (batches 0,1 -> 0.5; 2,3; 4)
    assert told.calls == [("start", 0), ("step", 1), ("step", 2), ("log", 2, 0.5), ("step", 3),
                          ("eval", 3, 7.0), ("step", 4), ("log", 4, 2.5), ("checkpoint", 4),
                          ("step", 5), ("log", 5, 4.0), ("eval", 5, 7.0)]  # and at the last
    assert saved == [4]  # not at the last step: that checkpoint is the caller's
    assert list(record) == [*RECORD_KEYS, "val_loss"] and record["val_loss"] == 7.0
    assert record["step"] == 5 and record["grad_norm"] == 2.0 and record["ranks"] == 1
    assert record["lr"] == pytest.approx(0.01) and record["dtype"] == "float32"
    assert (record["compute_s"], record["comm_s"], record["optimizer_s"]) == (0.5, 0.25, 0.125)
    assert record["mfu"] == round(100.0 * record["tokens_per_s"] / 1e6, 6)
    assert len(record["peak_mem_mb"]) == len(record["peak_rss_mb"]) == 1


def test_a_resumed_loop_starts_at_its_step_and_evaluates_at_the_last():
    record, step, told, saved, _ = run(LoopPlan(start=3, last=5, log_every=10, eval_every=10))
    assert [h[2] for h in step.handed] == [3, 4]
    assert told.calls == [("start", 3), ("step", 4), ("step", 5), ("log", 5, 3.5),
                          ("eval", 5, 7.0)]
    assert record["val_loss"] == 7.0 and saved == []


def test_asked_to_stop_it_saves_at_a_logged_step_and_raises():
    asked = []

    def stop():
        asked.append(True)
        return len(asked) == 2  # at the second logged step

    with pytest.raises(Stopped) as stopped:
        run(LoopPlan(start=0, last=10, log_every=2), stop=stop)
    assert stopped.value.step == 4 and len(asked) == 2


def test_the_report_writes_the_log_line_and_the_record(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)  # the record to the file
    record = {"step": 10, "loss": 4.83215, "tokens_per_s": 5120.4, "lr": 3e-4, "grad_norm": 1.9,
              "peak_mem_mb": [101.2, 100.9], "peak_rss_mb": [410.0, 402.3], "ranks": 2,
              "mfu": 0.0012, "compute_s": 0.21, "comm_s": 0.012, "optimizer_s": 0.003,
              "dtype": "float32"}
    said: list[str] = []
    path = tmp_path / "metrics.jsonl"
    report = Callbacks(TrainingCallback(), Report(said.append, path, steps=100, ranks=2))
    report.on_train_start(0)
    report.on_log(record)
    report.on_eval(10, 4.5)
    assert said == [
        "step     10/100 | loss 4.8322 | lr 3.00e-04 | 5,120 tok/s | peak MiB per rank 101/101 "
        "(mlx), 410/402 (rss) | mfu 0.1% | step 210 ms compute, 12 comm, 3 optimizer",
        "step     10/100 | val loss 4.5000"]
    assert said[0] == log_line(record, 100)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [record, {"step": 10, "val_loss": 4.5}]
    assert list(lines[0]) == RECORD_KEYS
