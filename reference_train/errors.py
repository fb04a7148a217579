"""The trainer's one error type: a problem with what it was given, and what to do about it.

Every module raises it (a corpus or token directory, a tokenizer, a model
folder, a checkpoint, --out), so the entry points (train, prepare, export)
catch one type and exit 2 with its message, hint included. It lives here,
below every module that raises it, so that none imports another only for it.
"""

from __future__ import annotations


class DataError(Exception):
    """Bad input to the trainer, with a hint on what to do."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (hint: {self.hint})" if self.hint else base
