"""What a run tells the world as it goes: heartbeats, metrics records, the loss curve.

Two line protocols with `mlxcluster train`, each switched on by an
environment variable it sets (mlxcluster/jobs/stall.py and
mlxcluster/train_record.py read them, and hold copies of the marks):

- heartbeats: every rank prints "@@mlxcluster-heartbeat RANK STEP" after each
  step, evaluation and checkpoint, and "... RANK done" when training ends; the
  launcher watches these lines to find a stalled job (and does not show them).
  One short flushed line per step: measured cost in docs/performance-runs.md.
- the record: kept on the machine running mlxcluster, not on rank 0's host
  (Macs have their own disks): rank 0 prints each metrics record as
  "@@mlxcluster-record {json}" instead of writing --out/metrics.jsonl, and a
  {"event": "start", "step": N} record when training starts (N > 0 after a
  resume); mlxcluster writes them to its own --out/metrics.jsonl.

Without them, rank 0 appends the records to --out/metrics.jsonl and draws
--out/loss.png at the end. Nothing here imports mlx (tests/test_train_config.py
checks), so that `mlxcluster train` draws the loss curve from the record it
kept without loading MLX.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from pathlib import Path

HEARTBEAT_ENV = "MLXCLUSTER_HEARTBEAT"
HEARTBEAT_MARK = "@@mlxcluster-heartbeat"
RECORD_ENV = "MLXCLUSTER_RECORD"
RECORD_MARK = "@@mlxcluster-record"
# SIGUSR2 asks every rank to checkpoint and stop (stopping.py); on when mlxcluster sets it.
STOP_ENV = "MLXCLUSTER_STOP_CHECK"
# A file of the run's output (LoRA's adapters: small) sent to mlxcluster's
# record in base64 pieces, so that it also lands where mlxcluster runs.
FILE_EVENT = "file"
FILE_PIECE_BYTES = 512 << 10
# A record sent again from a resumed checkpoint (replay_records): kept only where missing.
REPLAYED = "replayed"


def _switched_on(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


# ---------------------------------------------------------------- heartbeats


def heartbeat_wanted() -> bool:
    """Whether a launcher watches this run's heartbeats (HEARTBEAT_ENV)."""
    return _switched_on(HEARTBEAT_ENV)


def print_heartbeat(rank: int, what: int | str) -> None:
    """One heartbeat: rank `rank` reached step `what` (or "done"). On stderr: every rank
    beats, and mlx.launch forwards each rank's stream in 8 KiB reads, one rank's after
    another's, so beats on stdout landed inside rank 0's record lines (a LoRA adapters
    piece is ~700 KB of base64) and cut them; stdout is rank 0's alone. The launcher
    watches both streams."""
    print(f"{HEARTBEAT_MARK} {rank} {what}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the record


def recording() -> bool:
    """Whether mlxcluster keeps the run's record (RECORD_ENV)."""
    return _switched_on(RECORD_ENV)


def record_line(record: dict) -> str:
    """A record as the line mlxcluster reads (without its newline)."""
    return f"{RECORD_MARK} {json.dumps(record)}"


def emit_record(record: dict) -> None:
    print(record_line(record), flush=True)


def start_record(path: Path, step: int, ranks: int) -> None:
    """Training starts at `step` (0, or where a resume continues): mlxcluster is told
    so, or the metrics file at `path` loses the records a resumed run will redo."""
    if recording():
        emit_record({"event": "start", "step": step, "ranks": ranks})
    else:
        truncate_metrics(path, step)


def save_record(path: Path, record: dict) -> None:
    """A metrics record: to mlxcluster's record when it keeps one, else to `path`."""
    if recording():
        emit_record(record)
    else:
        append_metrics(path, record)


def replay_records(path: Path, records: list[dict]) -> None:
    """A resumed checkpoint's records (callbacks.RecentRecords), each marked
    "replayed": to mlxcluster's record, which keeps those it lacks, or
    appended to `path` where it lacks them."""
    replayed = [{**r, REPLAYED: True} for r in records]
    if recording():
        for record in replayed:
            emit_record(record)
        return
    have = logged_keys(path)
    for record in replayed:
        if record_key(record) not in have:
            append_metrics(path, record)


def record_key(record: dict) -> tuple[int, str] | None:
    """What a record logs once per run: (step, "loss" or "val_loss"); None for events."""
    kind = next((k for k in ("loss", "val_loss") if k in record), None)
    return None if kind is None else (int(record.get("step", 0)), kind)


def logged_keys(path: Path) -> set[tuple[int, str] | None]:
    """The record keys a metrics file holds (none when it is not there)."""
    if not path.exists():
        return set()
    return {record_key(json.loads(line)) for line in path.read_text().splitlines()
            if line.strip()}


def emit_folder(folder: Path, name: str) -> None:
    """Every file of ``folder`` to mlxcluster's record, as ``name/FILE``, in
    pieces of FILE_PIECE_BYTES (each a record line), with its sha256."""
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        pieces = max(1, -(-len(data) // FILE_PIECE_BYTES))
        for i in range(pieces):
            piece = data[i * FILE_PIECE_BYTES:(i + 1) * FILE_PIECE_BYTES]
            emit_record({"event": FILE_EVENT, "path": f"{name}/{path.name}", "piece": i,
                         "pieces": pieces, "sha256": digest,
                         "data": base64.b64encode(piece).decode("ascii")})


def append_metrics(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step`, so a resumed run does not log steps twice."""
    if not path.exists():
        return
    if step == 0:
        path.unlink()
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))


# ---------------------------------------------------------------- on screen and on paper


def print_progress(step: int, total: int, width: int = 30) -> None:
    done = int(width * step / max(total, 1))
    print(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total}", end="", flush=True)


def plot_metrics(metrics_path: Path, png: Path) -> str:
    """Draw the loss curve; returns what happened (matplotlib is optional)."""
    try:
        # Lazy: an optional package, and a slow import only the end of a run needs.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "loss curve skipped: matplotlib is not installed (pip install matplotlib)"
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return f"loss curve: {png}"
