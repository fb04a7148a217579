"""A folder on a host brought here, each file checked by sha256 before it is put in place.

The host's agent (``send``) writes the folder's list of files, each with its
size and sha256, then their bytes, on ssh's stdout (no terminal, nothing
else on the stream); here the agent's own ``receive`` reads them, hashes
each as it arrives, and renames it into place only when it is the file the
host listed: a stream cut off or altered leaves nothing half-written here.
Regular files only, not the folder's dot files, links or subfolders.

``fetch_heads`` brings named files of a folder, and of its weight files only
their safetensors headers (the agent's ``heads``): what this machine reads
of a model only the hosts hold (transfer/view.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from mlxcluster.transfer import agent
from mlxcluster.transfer.link import ProcessLink, TransferError
from mlxcluster.transfer.send import Transferred, agent_command, last_line

FETCH_IDLE_S = 120.0


def fetch(link: ProcessLink, there: str, here: str | Path,
          timeout: float = FETCH_IDLE_S) -> Transferred:
    """The regular files of ``there`` on the link's host into ``here`` (made
    when the host has the folder). Given up when no byte comes for
    ``timeout``. Raises TransferError with what the host said."""
    return fetched(link, "send", {"dir": str(there)}, here, timeout)


def fetch_heads(link: ProcessLink, there: str, whole: Sequence[str], headers: Sequence[str],
                here: str | Path, timeout: float = FETCH_IDLE_S) -> Transferred:
    """The ``whole`` files of ``there`` on the link's host (below it, links
    followed) and of each of ``headers`` (safetensors files) its header
    alone, into ``here`` under the same names, each checked by the sha256
    the host took of what it sent. Raises TransferError as ``fetch``."""
    return fetched(link, "heads", {"dir": str(there), "whole": list(whole),
                                   "headers": list(headers)}, here, timeout)


def fetched(link: ProcessLink, op: str, spec: dict, here: str | Path,
            timeout: float) -> Transferred:
    """What the agent's ``op`` (send, heads) streams from the link's host,
    received here into ``here`` by the agent's own ``receive``."""
    there = spec["dir"]
    start = time.monotonic()
    sent: list[dict] = []

    def receive(stream: BinaryIO) -> Exception | None:
        header = stream.readline()
        if not header:
            return None  # the agent said nothing: its stderr says why
        try:
            files = json.loads(header)["files"]
            sent.extend(files)
            agent.receive({"dir": str(here), "files": files}, stream)
        except (OSError, ValueError, KeyError) as err:
            return err
        return None

    result, failed = link.read(agent_command(link.python, op, spec), receive, timeout=timeout)
    if isinstance(failed, OSError):  # here: the host's broken pipe would hide it
        raise TransferError(f"{there} from {link.name} could not be written here: {failed}")
    if result.exit_status != 0:  # the host's reason first: a stream it cut is its doing
        said = last_line(result.stderr) or f"exit code {result.exit_status}"
        raise TransferError(f"{link.name}: {said}")
    if failed is not None:
        raise TransferError(f"{link.name}: {there}: {failed}")
    return Transferred(link.name, tuple(f["name"] for f in sent), sum(f["bytes"] for f in sent),
                       time.monotonic() - start, "ssh stream")
