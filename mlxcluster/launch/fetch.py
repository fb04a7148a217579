"""A folder a rank wrote on its own host, brought to the same path here over ssh.

The run's record carries LoRA's adapters in its lines, but under mlx.launch a remote rank
runs behind `ssh -tt`: its stdout and stderr share one terminal, and mlx.launch forwards
every rank's terminal in 8 KiB reads, one rank after another. Another rank's line (its
heartbeat, its exit line) can so land inside one of rank 0's long record lines and cut it;
measured over the lab: 2 of 5 elastic QLoRA runs ended without the adapters here. When the
record's copy did not arrive whole, the folder is read from a host that wrote it: one
`tar` over ssh (no terminal, nothing else on the stream), regular files only, each written
whole (temporary file, then renamed).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import Path

from mlxcluster.jobs.hosts import RankHost, host_argv

FETCH_TIMEOUT_S = 120.0


def fetch_folder(host: RankHost, folder: str | Path, env: dict[str, str] | None = None,
                 timeout: float = FETCH_TIMEOUT_S) -> list[Path]:
    """Copy the regular files of ``folder`` on ``host`` into ``folder`` here; returns them.
    Raises OSError (with what the host said) when the host has no such folder or the
    stream is cut; nothing half-written is left here."""
    here = Path(folder)
    # COPYFILE_DISABLE: macOS's tar would add AppleDouble "._NAME" files of the attributes
    command = f"COPYFILE_DISABLE=1 tar -cf - -C {shlex.quote(str(folder))} ."
    with tempfile.TemporaryFile() as stream:
        proc = subprocess.run(host_argv(host, command), stdout=stream, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout, env=env)
        if proc.returncode != 0:
            said = proc.stderr.decode(errors="replace").strip().splitlines()
            raise OSError(f"{host.name}: {said[-1] if said else f'exit code {proc.returncode}'}")
        stream.seek(0)
        with tarfile.open(fileobj=stream, mode="r:") as tar:
            members = [m for m in tar.getmembers() if m.isfile()
                       and "/" not in m.name.removeprefix("./")
                       and not m.name.removeprefix("./").startswith(".")]
            here.mkdir(parents=True, exist_ok=True)
            written = []
            for member in members:
                data = tar.extractfile(member).read()
                target = here / member.name.removeprefix("./")
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=here)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, 0o644)
                os.replace(tmp, target)
                written.append(target)
    return written
