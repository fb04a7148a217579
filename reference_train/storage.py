"""Which ranks see the same --out: one disk for several hosts (a NAS, an NFS or SMB home).

Macs have their own disks, and the trainer keeps one copy of each checkpoint
per host (resume.py). When --out is on storage several hosts see, those
copies are one folder: every host's writer renamed its checkpoint into the
same place and one of them crashed (`OSError: [Errno 39] Directory not empty:
'.../checkpoints/.step_000315.g3h_yzsz' -> '.../checkpoints/step_000315'`).
The path alone cannot tell (the same path is one folder on a NAS and one per
Mac on their own disks), so before the first write the hosts find out, with
a token written by one and looked for by the others (a collective: every rank
calls resume.find_storage in the same order):

1. the writer of each host (its lowest rank) creates --out and a file of
   its own random name in it:

       OUT/.mlxcluster-storage/9f1c0e4b2a7d4e0c8b6a5f3e2d1c0b9a   (empty; its name is the token)

2. the ranks exchange the tokens (an all_gather: once it returns, every
   token is written);
3. each writer looks for every other writer's token by its exact name (a
   lookup by a name nobody looked up before, so no NFS client has it cached
   as absent) and the ranks exchange what they found (a ranks x ranks
   matrix, all_gather'ed: once it returns, every writer has looked);
4. the writers remove their tokens (and the folder, when it is empty).

Hosts that see one another's tokens share --out (`storage_groups`); the
lowest rank among them writes for all of them: checkpoints, `latest`,
pruning, OUT/model, OUT/adapters (HostLayout.writer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# No mlx here: mlxcluster's doctor and data sync use the names and the
# grouping below (the same tokens, over ssh) without it; the collective
# that finds out in a job is resume.find_storage.
STORAGE_DIR = ".mlxcluster-storage"
TOKEN_BYTES = 16


def linked_groups(sees: list[list[bool]], among: list[int]) -> dict[int, int]:
    """For each index in `among`, the lowest index it is linked to: i and j are
    linked when `sees[i][j]` or `sees[j][i]` (one found the other's token; a
    lookup may miss in one direction, never find what is not there), or
    through a third (a NAS mounted by all)."""
    parent = {w: w for w in among}

    def root(w: int) -> int:
        while parent[w] != w:
            w = parent[w]
        return w

    for i in among:
        for j in among:
            if i != j and (sees[i][j] or sees[j][i]):
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)
    return {w: root(w) for w in among}


def storage_groups(hosts: list[str], sees: list[list[bool]]) -> list[int]:
    """Each rank's writer: the lowest rank of the ranks that see the same --out.

    `hosts[r]` is rank r's host; `sees[i][j]` says rank i found rank j's token
    (only the lowest rank of each host writes and looks: the other rows and
    columns are ignored). Ranks on one host share its disk; hosts linked by
    their tokens (`linked_groups`) share one."""
    host_writer = [hosts.index(h) for h in hosts]
    group = linked_groups(sees, sorted(set(host_writer)))
    return [group[w] for w in host_writer]


class Layout(Protocol):
    """What the grouping reads of resume.HostLayout."""

    hosts: list[str]

    def writer(self, rank: int) -> int: ...


def shared_groups(layout: Layout) -> list[list[int]]:
    """The groups of ranks that share one --out across more than one host, each in rank order."""
    groups: dict[int, list[int]] = {}
    for r in range(len(layout.hosts)):
        groups.setdefault(layout.writer(r), []).append(r)
    return [ranks for ranks in groups.values() if len({layout.hosts[r] for r in ranks}) > 1]


def describe_storage(layout: Layout, out: Path) -> str | None:
    """One line for the log naming the hosts that share --out (None when none do)."""
    groups = shared_groups(layout)
    if not groups:
        return None
    parts = []
    for ranks in groups:
        hosts = list(dict.fromkeys(layout.hosts[r] for r in ranks))
        parts.append(f"{', '.join(hosts)} see one --out {out}: checkpoints and exports written "
                     f"once, by rank {ranks[0]} on {layout.hosts[ranks[0]]}")
    return "shared storage: " + "; ".join(parts)
