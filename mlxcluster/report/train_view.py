"""What the page shows of a training run: its ``metrics.jsonl``.

The reference trainer (rank 0) appends one JSON object per logged step and
one per evaluation, e.g.::

    {"step": 10, "loss": 3.91, "tokens_per_s": 5120.4, "lr": 0.0003, "grad_norm": 1.2,
     "peak_mem_mb": [812.5, 810.1], "peak_rss_mb": [1500.2, 1490.0], "ranks": 2}
    {"step": 10, "val_loss": 3.95}

A preference run (--objective dpo or orpo) adds to each logged step's record::

    {"chosen_reward": 1.53, "rejected_reward": -0.70, "reward_margin": 2.24, "accuracy": 1.0}

Kept by `mlxcluster train`, it also holds the run's events (``time`` in
seconds since the epoch), shown in order::

    {"event": "start", "step": 0, "ranks": 3, "time": ...}
    {"event": "restart", "restart": 1, "max_restarts": 2, "cause": "...", "time": ...}
    {"event": "host_dropped", "host": "mac3", "reason": "unreachable over ssh", "ranks": 2,
     "grad_accum": 2, "time": ...}
    {"event": "host_dropped", "host": "mac3", "reason": "unreachable over ssh", "ranks": 2,
     "pipeline": 2, "time": ...}          (a pipeline's stages re-split over the hosts left)
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.report.svg import figure_svg, pyplot

METRICS = "metrics.jsonl"


@dataclass
class TrainView:
    name: str  # the run folder
    steps: int
    ranks: int | None
    first_loss: float | None
    last_loss: float | None
    last_val: float | None
    tokens_per_s: float | None  # median over the logged intervals
    peak_mem_mb: list[float]  # per rank, the highest seen
    loss_plot: object | None = None
    speed_plot: object | None = None
    memory_plot: object | None = None
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # why the run stopped early; None: it finished
    events: list[tuple[str, str]] = field(default_factory=list)  # (time, what), launches on
    mfu: float | None = None  # median over the logged steps (reference_train/mfu.py)
    split_ms: dict[str, float] = field(default_factory=dict)  # median ms: compute, comm, optimizer
    preference: dict[str, float] = field(default_factory=dict)  # the last logged rewards, margin...
    preference_plot: object | None = None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl; an InputError naming the file
    when it is missing or a line is not JSON."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        raise InputError(f"no {METRICS} in {run_dir}",
                         "pass the --out folder of a training run (mlxcluster train ... -- --out DIR)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path} line {number} is not JSON",
                             "the file is written by the reference trainer; was it edited?") from None
        if isinstance(record, dict):
            records.append(record)
    return records


def _loss_plot(train, val):
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", markersize=3, label="validation loss")
    ax.set_title("loss and validation loss")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return figure_svg(fig)


def _speed_plot(speed):
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot([s for s, _ in speed], [v for _, v in speed], color="tab:green")
    ax.set_title("tokens/s")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("tokens/s (all ranks)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return figure_svg(fig)


def _memory_plot(mem_rows):
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ranks = max(len(m) for _, m in mem_rows)
    for rank in range(ranks):
        points = [(s, m[rank]) for s, m in mem_rows if len(m) > rank]
        ax.plot([s for s, _ in points], [v for _, v in points], label=f"rank {rank}")
    ax.set_title("peak memory per rank")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("peak mlx memory (MiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=4)
    fig.tight_layout()
    return figure_svg(fig)


PREFERENCE = ("chosen_reward", "rejected_reward", "reward_margin", "accuracy")


def _preference_plot(rows):
    """The rewards and their margin (left axis) and the accuracy (right) of a preference run."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    steps = [r["step"] for r in rows]
    for key, label in (("chosen_reward", "chosen reward"), ("rejected_reward", "rejected reward"),
                       ("reward_margin", "reward margin")):
        ax.plot(steps, [r[key] for r in rows], label=label)
    ax.set_title("preference: rewards, margin and accuracy")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("reward")
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot(steps, [r["accuracy"] for r in rows], "k:", label="accuracy")
    right.set_ylim(-0.05, 1.05)
    right.set_ylabel("accuracy")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize="small")
    fig.tight_layout()
    return figure_svg(fig)


def train_view(records: list[dict], name: str) -> TrainView:
    """Summary numbers and the three plots (loss and validation, tokens/s,
    memory per rank) of one run's metrics."""
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    speed = [(r["step"], r["tokens_per_s"]) for r in records if "tokens_per_s" in r]
    mem_rows = [(r["step"], list(r["peak_mem_mb"])) for r in records if r.get("peak_mem_mb")]
    steps = max((r.get("step", 0) for r in records), default=0)
    ranks = next((r["ranks"] for r in reversed(records) if "ranks" in r), None)
    peak: list[float] = []
    for _, mem in mem_rows:
        peak = [max(a, b) for a, b in zip(peak, mem, strict=False)] + mem[len(peak):]
    view = TrainView(
        name=name, steps=steps, ranks=ranks,
        first_loss=train[0][1] if train else None, last_loss=train[-1][1] if train else None,
        last_val=val[-1][1] if val else None,
        tokens_per_s=statistics.median(v for _, v in speed) if speed else None,
        peak_mem_mb=peak,
    )
    mfus = [r["mfu"] for r in records if "mfu" in r]
    view.mfu = statistics.median(mfus) if mfus else None
    for key in ("compute_s", "comm_s", "optimizer_s"):
        values = [r[key] for r in records if key in r]
        if values:
            view.split_ms[key[:-2]] = 1000 * statistics.median(values)
    events = [r for r in records if "event" in r]
    if any(e["event"] != "start" for e in events) or len(events) > 1:  # more than one plain launch
        view.events = [(_clock(e.get("time")), describe_event(e)) for e in events]
    if not records:
        view.notes.append(f"{METRICS} holds no record yet: the run logged no step")
    if train or val:
        view.loss_plot = _loss_plot(train, val)
    if speed:
        view.speed_plot = _speed_plot(speed)
    if mem_rows:
        view.memory_plot = _memory_plot(mem_rows)
    preference = [r for r in records if all(k in r for k in PREFERENCE)]
    if preference:
        view.preference = {k: preference[-1][k] for k in PREFERENCE}
        view.preference_plot = _preference_plot(preference)
    return view


def describe_event(event: dict) -> str:
    """One event of the record in words."""
    kind = event["event"]
    if kind == "start":
        where = "from the start" if not event.get("step") else f"resuming at step {event['step']}"
        return f"launched on {event.get('ranks', '?')} rank(s), {where}"
    if kind == "restart":
        return (f"restart {event.get('restart')}/{event.get('max_restarts')} after: "
                f"{event.get('cause', '?')}")
    if kind == "host_dropped":
        now = (f"--pipeline {event['pipeline']}" if "pipeline" in event  # its stages re-split
               else f"grad_accum {event.get('grad_accum')}")
        return (f"dropped {event.get('host')} ({event.get('reason')}): going on with "
                f"{event.get('ranks')} rank(s), {now}")
    return json.dumps(event)


def _clock(when) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "-"


def run_view(run_dir: str | Path, failed: str | None = None) -> TrainView:
    """train_view of a run folder (its metrics.jsonl); ``failed``: why it stopped early."""
    view = train_view(read_metrics(run_dir), Path(run_dir).name or str(run_dir))
    view.failed = failed
    return view
