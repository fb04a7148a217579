"""A pipeline stage's checkpoints mirrored on the next stage's host.

Each stage writes its checkpoints on its own host's disk (pipeline_outputs.py);
when that host is lost, so is its piece, and no resume can start (resplit.py
names it). So with one copy of the pipeline (no replicas) of N > 1 stages,
after each checkpoint stage k also sends its piece to stage (k + 1) mod N,
which writes it, byte for byte, under the folder name of stage k:

    host of stage 2:  OUT/checkpoints/stage_2_of_3/step_000010/...   its own piece
                      OUT/checkpoints/stage_1_of_3/step_000010/...   stage 1's, mirrored
    host of stage 3:  OUT/checkpoints/stage_3_of_3/...   OUT/checkpoints/stage_2_of_3/...
    host of stage 1:  OUT/checkpoints/stage_1_of_3/...   OUT/checkpoints/stage_3_of_3/...

The copy is verified against the hashes in its state.json and installed as any
checkpoint is (checkpoint.install_checkpoint: atomic, `latest`, pruned to
--keep_checkpoints). No mirror where the next stage sees the same --out (ranks on
one machine, or a disk the hosts share: storage.py) or with replicas (another
copy of the pipeline holds every stage). Stage k and k + 1 are neighbours, on
ring too: the files go with send and receive, in chunks (a file is never held
whole), each rank sending to the next and receiving from the previous at once,
on two streams (collectives.Exchange).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from .checkpoint import ARRAY_FILES, CHECKPOINT_FILES, install_checkpoint
from .collectives import CHUNK_BYTES, Exchange
from .disk_room import free_bytes, human, is_disk_full, room_verdict, said_when_full
from .files import file_sha256
from .pipeline_outputs import stage_folder
from .storage import Layout


def mirrored_stages(layout: Layout, stages: int, replicas: int) -> list[bool]:
    """For each stage k: whether its checkpoints are mirrored on stage (k + 1) mod N's
    host. `layout` is the world's (rank r is stage r with one copy of the pipeline):
    not when the two see the same --out, nor with replicas, nor with one stage."""
    if stages < 2 or replicas > 1:
        return [False] * stages
    return [layout.writer(k) != layout.writer((k + 1) % stages) for k in range(stages)]


def describe_mirrors(layout: Layout, mirrored: list[bool]) -> list[str]:
    """The log's lines, one per mirrored stage."""
    n = len(mirrored)
    return [f"stage {k + 1}'s checkpoints are mirrored on {layout.hosts[(k + 1) % n]} "
            f"(stage {(k + 1) % n + 1}'s host)" for k in range(n) if mirrored[k]]


def no_room_for(what: str, root: Path, free: int | None, needed: int, stage: int) -> str:
    """Why a mirrored piece is not kept on this host: the run goes on (this stage's
    own checkpoint is whole); losing stage ``stage``'s host then loses its piece."""
    room = "its room could not be read" if free is None else f"{human(free)} free"
    return (f"{what} not kept: {root} has {room}, the piece is {human(needed)}; the run goes "
            f"on, but without this copy --elastic cannot go on if stage {stage + 1}'s host is "
            f"lost: free room on {socket.gethostname()}")


def mirror_checkpoint(group, saved: Path, stage: int, mirrored: list[bool],
                      keep: int) -> str | None:
    """After every stage wrote its checkpoint `saved` (OUT/checkpoints/stage_K_of_N/
    step_S; collective over the pipeline `group`, stage i being rank i): send it to the
    next stage when `mirrored[stage]`, and receive, verify and install the previous
    stage's when `mirrored[stage - 1]`. Returns a problem with the copy received (it is
    then not installed: damaged, or no room for it on this host's disk, found before or
    while writing; the rest is received all the same, so the sender never waits), or
    None."""
    n = len(mirrored)
    sends, receives = mirrored[stage], mirrored[(stage - 1) % n]
    if not (sends or receives):
        return None
    after, before = (stage + 1) % n, (stage - 1) % n
    root = saved.parent.parent / stage_folder(before, n)
    link = Exchange(group)
    sizes = [(saved / name).stat().st_size for name in CHECKPOINT_FILES] if sends else []
    if sends:
        link.send(mx.array(sizes, dtype=mx.int64), after)
    incoming = link.receive((len(CHECKPOINT_FILES),), mx.int64, before) if receives else None
    link.evaluate(*([incoming] if receives else []))
    theirs = [int(v) for v in incoming.tolist()] if receives else []
    tmp, problem = None, None
    what = f"stage {before + 1}'s mirrored checkpoint {saved.name}"
    if receives:
        root.mkdir(parents=True, exist_ok=True)
        free = free_bytes(root)
        if free is not None and room_verdict(free, sum(theirs)) == "full":
            problem = no_room_for(what, root, free, sum(theirs), before)
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f".{saved.name}.mirror.", dir=root))
    try:
        for i, name in enumerate(CHECKPOINT_FILES):
            with contextlib.ExitStack() as files:
                source = files.enter_context(open(saved / name, "rb")) if sends else None
                target = files.enter_context(open(tmp / name, "wb")) if tmp else None
                out = sizes[i] if sends else 0
                into = theirs[i] if receives else 0
                for start in range(0, max(out, into), CHUNK_BYTES):
                    if start < out:
                        chunk = source.read(min(CHUNK_BYTES, out - start))
                        link.send(mx.array(np.frombuffer(chunk, dtype=np.uint8)), after)
                    got = link.receive((min(CHUNK_BYTES, into - start),), mx.uint8, before) \
                        if start < into else None
                    link.evaluate(*([got] if got is not None else []))
                    if got is None or problem is not None:
                        continue  # the rest is received all the same: the sender goes on
                    try:
                        target.write(np.array(got).data)
                    except OSError as err:
                        if not is_disk_full(err):
                            raise
                        problem = no_room_for(what, root, free_bytes(root), sum(theirs), before)
        if problem is not None or tmp is None:
            return problem
        state = json.loads((tmp / "state.json").read_text())
        for name in ARRAY_FILES:
            if file_sha256(tmp / name) != (state.get("hashes") or {}).get(name):
                return f"{what} arrived damaged ({name} does not match its hash): not kept"
        with said_when_full(root, what):
            install_checkpoint(root, tmp, state["step"], keep)
        tmp = None
        return None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
