"""A running serve, told to `mlxcluster jobs` on the same machine.

`jobs` asks the hosts which ranks run; what only the machine running serve
knows (the address, the requests and tokens so far) it reads from a small
file serve keeps up to date here, one per run, removed when serve ends::

    /run/user/501/mlxcluster-serving/mlxserve-3f2a9c81d0.json   (else $TMPDIR/mlxcluster-serving-UID/)
    {"run_id": "mlxserve-3f2a9c81d0", "pid": 4242, "address": "http://127.0.0.1:8080/v1",
     "requests": 12, "completion_tokens": 3456, "updated": 1795928307.1}

A file whose pid is gone (serve killed with SIGKILL) is passed over. The
folder is the user's own (0700); the key is never in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

EVERY_S = 5.0


def serving_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "mlxcluster-serving"
    return Path(tempfile.gettempdir()) / f"mlxcluster-serving-{os.getuid()}"


@dataclass(frozen=True)
class Announced:
    run_id: str
    address: str
    requests: int
    completion_tokens: int

    def line(self) -> str:
        return (f"serving at {self.address}: {self.requests} request(s), "
                f"{self.completion_tokens} token(s) generated")


def _write(folder: Path, run_id: str, facts: dict) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{run_id}.", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump({"run_id": run_id, "pid": os.getpid(), **facts, "updated": time.time()}, f)
    os.replace(tmp, folder / f"{run_id}.json")


@contextlib.contextmanager
def announcing(run_id: str, address: str, counts: Callable[[], tuple[int, int]],
               folder: Path | None = None, every: float = EVERY_S) -> Iterator[None]:
    """Within: the run's file kept up to date every ``every`` seconds
    (``counts()``: requests answered, tokens generated); removed after."""
    folder = folder or serving_dir()
    stop = threading.Event()

    def keep() -> None:
        while True:
            requests, tokens = counts()
            with contextlib.suppress(OSError):  # a full /tmp must not stop serve
                _write(folder, run_id, {"address": address, "requests": requests,
                                        "completion_tokens": tokens})
            if stop.wait(every):
                return

    thread = threading.Thread(target=keep, name="serve-announce", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        with contextlib.suppress(OSError):
            (folder / f"{run_id}.json").unlink()


def announced(folder: Path | None = None) -> dict[str, Announced]:
    """The serve runs of this machine, by run id (their serve process alive)."""
    folder = folder or serving_dir()
    found: dict[str, Announced] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            facts = json.loads(path.read_text())
            os.kill(int(facts["pid"]), 0)
            found[facts["run_id"]] = Announced(facts["run_id"], facts["address"],
                                               int(facts["requests"]),
                                               int(facts["completion_tokens"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone, or not ours to read
    return found
