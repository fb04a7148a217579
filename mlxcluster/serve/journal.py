"""serve.log: what happened to a served model, one line each, with the time.

    2026-11-26 21:40:02 launching 2 rank(s) on ring, run mlxserve-3f1c0a9b2e: mlx-lm's server, ...
    2026-11-26 21:40:33 serving tiny-chat at http://127.0.0.1:8080/v1 (2 ranks, tensor)
    2026-11-26 21:41:10 restart 1/3: the server stalled: ... rank 1 on labhost2 is stopped
    2026-11-26 21:41:40 serving tiny-chat at http://127.0.0.1:8080/v1 (2 ranks, tensor) again (restart 1, up in 29 s)
    2026-11-26 21:42:05 stopped: interrupted (SIGINT): the job was stopped on every rank

serving.serve_until_stopped writes it; the CLI only names the file and what
is served.
"""

from __future__ import annotations

import time
from pathlib import Path

from mlxcluster.jobs.events import Note, Restarting


def up_line(served: str, launch: int, seconds: float) -> str:
    """'serving NAME at ADDRESS (...)', and after a restart how soon it was up again."""
    again = f" again (restart {launch}, up in {seconds:.0f} s)" if launch else ""
    return f"serving {served}{again}"


class ServeJournal:
    """serve.log: each launch, each restart and its cause, each time the
    model was up, and the stop, with the time. ``served``: "NAME at ADDRESS
    (N ranks, SPLIT)"."""

    def __init__(self, path: Path, served: str):
        self.served = served
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, text: str) -> None:
        self.file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.file.flush()

    def event(self, event: object) -> None:
        """A launch's note or a restart (jobs.events); other events are the terminal's."""
        if isinstance(event, Restarting):
            self.write(f"restart {event.done}/{event.max_restarts}: {event.cause}")
        elif isinstance(event, Note):
            self.write(event.text)

    def up(self, launch: int, seconds: float) -> None:
        self.write(up_line(self.served, launch, seconds))

    def stopped(self, why: object) -> None:
        self.write(f"stopped: {why}")

    def close(self) -> None:
        self.file.close()
