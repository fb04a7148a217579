"""serve.log: what happened to a served model, one line each, with the time."""

from __future__ import annotations

import time
from pathlib import Path


class ServeJournal:
    """serve.log: each launch, each restart and its cause, each time the
    model was up, with the time."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, text: str) -> None:
        self.file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
