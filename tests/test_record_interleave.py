"""Rank 0's long record lines arrive whole through the real mlx.launch while the other ranks
beat. mlx.launch forwards each rank's output in 8 KiB reads, one rank's after another's, so
two ranks writing the same stream interleave inside a line; LoRA's adapters travel as record
lines of ~700 KB (FILE_PIECE_BYTES in base64). Seen over the lab: the adapters never
reached --out here, a piece's tail printed as text. Heartbeats go to stderr, rank 0's
records to stdout: nothing interleaves with them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

from mlxcluster.launch.record import RunRecord

from .conftest import require
from .train_support import MLX_LAUNCH, REPO

RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import mlx.core as mx
    from reference_train.metrics import emit_folder, print_heartbeat
    rank = mx.distributed.init().rank()
    deadline = time.monotonic() + 3
    if rank == 0:
        time.sleep(0.5)  # the others already beating
        for _ in range(3):
            emit_folder(Path(sys.argv[1]), "adapters")
    else:
        while time.monotonic() < deadline:
            print_heartbeat(rank, 7)
""")


def test_record_files_arrive_whole_while_other_ranks_beat(tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    folder = tmp_path / "adapters"
    folder.mkdir()
    data = os.urandom(1_500_000)  # three pieces, each a ~700 KB line
    (folder / "adapters.safetensors").write_bytes(data)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([MLX_LAUNCH, "-n", "3", "--", sys.executable, str(script), str(folder)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = RunRecord(tmp_path / "out")
    shown = [s for s in map(record.feed, proc.stdout.splitlines()) if s is not None]
    record.close()
    got = tmp_path / "out" / "adapters" / "adapters.safetensors"
    assert record.bad_lines == 0 and not [s for s in shown if s.strip()], shown[:3]
    assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert proc.stderr.count("@@mlxcluster-heartbeat") > 10  # the others did beat meanwhile
