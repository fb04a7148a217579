"""Parse ``sw_vers`` (one or two tabs after the colon, depending on macOS)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MacOSVersion:
    product: str | None
    version: str | None  # "26.6.2"
    build: str | None  # "25G83"; betas end in a lowercase letter ("25D5087f")

    @property
    def is_beta(self) -> bool:
        return bool(self.build and re.fullmatch(r"\d+[A-Z]\d{4}[a-z]", self.build))

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """(26, 6, 2); () when unknown."""
        if not self.version:
            return ()
        parts = []
        for piece in self.version.split("."):
            if not piece.isdigit():
                break
            parts.append(int(piece))
        return tuple(parts)


def parse_sw_vers(text: str | None) -> MacOSVersion:
    """Read ProductName / ProductVersion / BuildVersion; missing keys are None."""
    values: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            values[key.strip()] = value.strip()
    return MacOSVersion(
        values.get("ProductName"), values.get("ProductVersion"), values.get("BuildVersion")
    )
