"""A folder a rank wrote on its own host, brought to the same path here over ssh.

The run's record carries LoRA's adapters in its lines, but under mlx.launch a remote rank
runs behind `ssh -tt`: its stdout and stderr share one terminal, and mlx.launch forwards
every rank's terminal in 8 KiB reads, one rank after another. Another rank's line (its
heartbeat, its exit line) can so land inside one of rank 0's long record lines and cut it;
measured over the lab: 2 of 5 elastic QLoRA runs ended without the adapters here. When the
record's copy did not arrive whole, the folder is read from a host that wrote it by
mlxcluster.transfer's fetch: one ssh call (no terminal, nothing else on the stream), regular
files only, each checked by sha256 and written whole (temporary file, then renamed).
"""

from __future__ import annotations

import os
from pathlib import Path

from mlxcluster.jobs.hosts import RankHost, host_link
from mlxcluster.transfer.fetch import FETCH_IDLE_S, fetch
from mlxcluster.transfer.link import TransferError


def fetch_folder(host: RankHost, folder: str | Path, env: dict[str, str] | None = None,
                 timeout: float = FETCH_IDLE_S) -> list[Path]:
    """Copy the regular files of ``folder`` on ``host`` into ``folder`` here; returns them.
    Raises OSError (with what the host said) when the host has no such folder or the
    stream is cut or stalls for ``timeout``; nothing half-written is left here."""
    # The ranks start in the directory mlxcluster runs in: a relative folder is
    # that directory's on the host too, not its ssh session's HOME (seen in CI:
    # `train -- --out runs/x` then found no adapters on the host).
    remote = os.path.abspath(folder)
    try:
        got = fetch(host_link(host, env), remote, folder, timeout)
    except TransferError as err:
        raise OSError(err.message) from None
    return [Path(folder) / name for name in got.names]
