"""The run's record, kept on the machine that runs `mlxcluster train`: the
launcher's half of the record protocol (the trainer's half, and its marks,
are reference_train/metrics.py).

Macs have their own disks: what rank 0 would write under --out lands on rank
0's Mac, and a restart on other hosts (or a lost rank-0 Mac) would scatter or
lose it. So with MLXCLUSTER_RECORD=1 the trainer prints its metrics records
as `@@mlxcluster-record {json}` lines, and this module writes them here, at
the same --out path:

    OUT/metrics.jsonl   the trainer's records ({"step": 10, "loss": ...}), its
                        {"event": "start", "step": N} lines, and mlxcluster's own
                        events, each with the time it was written
    OUT/train.log       every line the job printed, as shown, each launch headed
    OUT/loss.png        drawn here when the job ends

A start at step N (a resume) drops the records of later steps, so a resumed
run does not log steps twice, as the trainer does for its own metrics.jsonl.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from reference_train.metrics import RECORD_ENV, RECORD_MARK, truncate_metrics

__all__ = ["RECORD_ENV", "RunRecord"]

RECORD_RE = re.compile(re.escape(RECORD_MARK) + r" (.*?)\s*$")


class RunRecord:
    """Takes the job's lines: hides and stores record lines, logs the rest."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics = self.out / "metrics.jsonl"
        self.log_path = self.out / "train.log"
        self._log = open(self.log_path, "a", encoding="utf-8")
        self.bad_lines = 0

    def start_launch(self, what: str) -> None:
        self._log.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n")
        self._log.flush()

    def feed(self, line: str) -> str | None:
        """The line to show, or None for a record line (stored instead)."""
        found = RECORD_RE.search(line)
        if found is None:
            self._log.write(line + "\n")
            self._log.flush()
            return line
        try:
            record = json.loads(found.group(1))
        except ValueError:
            self.bad_lines += 1  # cut by a dying rank: the log keeps it
            self._log.write(line + "\n")
            return None
        if record.get("event") == "start":
            truncate_metrics(self.metrics, int(record.get("step", 0)))
        self.add(record)
        return None

    def add(self, record: dict) -> None:
        """Append one record (the trainer's, or an event of mlxcluster's own)."""
        if "event" in record:
            record = {**record, "time": round(time.time(), 3)}
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def resume_bound(self, log_every: int, eval_every: int) -> int:
        """The first step a restart must not resume past: a loss (or val loss)
        the trainer logged up to it but that never reached this machine (lost
        in flight with rank 0's host) would be missing from the record for good.
        Resuming before it redoes those steps, exactly, and logs them again."""
        losses, vals = [0], [0]
        if self.metrics.exists():
            for line in self.metrics.read_text(encoding="utf-8").splitlines():
                record = json.loads(line) if line.strip() else {}
                if "loss" in record:
                    losses.append(record["step"])
                if "val_loss" in record:
                    vals.append(record["step"])
        bound = max(losses) + log_every
        if eval_every:
            bound = min(bound, max(vals) + eval_every)
        return bound

    def close(self) -> None:
        self._log.close()

