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
    OUT/adapters/       LoRA's adapters (the trainer sends its files in pieces,
                        each checked by its sha256 before it is renamed into place)

A start at step N (a resume) drops the records of later steps, so a resumed
run does not log steps twice, as the trainer does for its own metrics.jsonl.
Then the trainer sends again the records logged since the checkpoint before
the one it resumed from, marked "replayed": those whose lines were lost when
the job stopped are kept, the rest dropped (each step's loss once).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

from reference_train.metrics import (
    FILE_EVENT,
    RECORD_ENV,
    RECORD_MARK,
    REPLAYED,
    logged_keys,
    record_key,
    truncate_metrics,
)

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
        self.files: list[Path] = []  # the files the trainer sent, written here
        self._pieces: dict[str, list[bytes]] = {}  # path -> the pieces so far
        self.fetched_from: str | None = None  # the host a folder was read from instead
        self.stopped_at: int | None = None  # the launch's ranks stopped when asked, at this step
        self._logged: set | None = None  # the record's (step, kind)s, for replayed records

    def start_launch(self, what: str) -> None:
        self.stopped_at = None
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
        if record.get("event") == FILE_EVENT:
            self._take_piece(record)
            return None
        if record.get("event") == "start":
            truncate_metrics(self.metrics, int(record.get("step", 0)))
            self._logged = None
        if record.get("event") == "stopped":  # reference_train/stopping.py
            self.stopped_at = int(record.get("step", 0))
        if record.get(REPLAYED):
            if self._logged is None:  # read once per launch, when the first replay comes
                self._logged = logged_keys(self.metrics)
            if record_key(record) in self._logged:
                return None  # it arrived the first time
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

    def _take_piece(self, record: dict) -> None:
        """One piece of a file the trainer sends; the file, once whole and its
        sha256 right, written under --out (temp + rename). A piece out of
        order, a path leaving --out or a wrong sum: counted, nothing written."""
        name = str(record.get("path", ""))
        target = (self.out / name).resolve()
        if not name or Path(name).is_absolute() or self.out.resolve() not in target.parents:
            self.bad_lines += 1
            return
        pieces = self._pieces.setdefault(name, [])
        if record.get("piece") != len(pieces):  # a new send of the same file starts again
            pieces.clear()
            if record.get("piece") != 0:
                self.bad_lines += 1
                return
        pieces.append(base64.b64decode(record.get("data", "")))
        if len(pieces) < int(record.get("pieces", 1)):
            return
        data = b"".join(self._pieces.pop(name))
        if hashlib.sha256(data).hexdigest() != record.get("sha256"):
            self.bad_lines += 1
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        self.files.append(target)

    def arrived(self, name: str) -> bool:
        """Whether the file ``name`` (under --out) came whole with the record."""
        return (self.out / name).resolve() in [f.resolve() for f in self.files]

    def fetched(self, folder: str, files: list[Path], host: str) -> None:
        """``folder``'s files came over ssh from ``host`` instead (launch/fetch.py)."""
        self.files.extend(files)
        for name in [n for n in self._pieces if n.startswith(f"{folder}/")]:
            del self._pieces[name]
        self.fetched_from = host

    def damage(self) -> str | None:
        """What of the record did not arrive whole, said once the job has ended: lines
        that did not parse or add up, and the files whose pieces stopped short."""
        if not self.bad_lines and not self._pieces:
            return None
        said = f"{self.bad_lines} record line(s) arrived damaged" if self.bad_lines else ""
        if said and self.fetched_from:
            said += f" (the adapters were read from {self.fetched_from} instead)"
        if self._pieces:
            names = ", ".join(sorted(self._pieces))
            said += f"{'; ' if said else ''}{names} did not arrive here whole (every host " \
                    "that ran to the end wrote its own copy under --out)"
        return f"the run's record at {self.out}: {said}"

    def close(self) -> None:
        self._log.close()

