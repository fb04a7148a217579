"""Parse ``rdma_ctl status`` (macOS 26.2+, RDMA over Thunderbolt).

It prints one word, ``enabled`` or ``disabled``, and exits 0 either way; run
where it cannot answer it prints why ("rdma_ctl: This tool needs to be
executed from Recovery OS.") and still exits 0 (jasonpaulso/omlx-plus
preflight). Only the text says whether RDMA is on.
"""

from __future__ import annotations

from dataclasses import dataclass

ENABLED = "enabled"
DISABLED = "disabled"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class RdmaCtlStatus:
    state: str  # ENABLED / DISABLED / UNKNOWN
    said: str  # what rdma_ctl printed, first non-empty line ("" when nothing)

    @property
    def enabled(self) -> bool:
        return self.state == ENABLED


def parse_rdma_ctl_status(text: str | None) -> RdmaCtlStatus:
    """The RDMA state rdma_ctl reported. Only the exact words count: anything
    else (a message about Recovery OS, an empty capture) is UNKNOWN, with what
    it said kept for the report."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    said = lines[0] if lines else ""
    word = said.lower()
    if len(lines) == 1 and word in (ENABLED, DISABLED):
        return RdmaCtlStatus(word, said)
    return RdmaCtlStatus(UNKNOWN, said[:200])
