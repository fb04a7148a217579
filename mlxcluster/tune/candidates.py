"""The settings ``tune`` tries: backend x ring connections per IP x MPI
``btl_tcp_links`` (x Open MPI's allreduce algorithm) x data interfaces (when
every host has several)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlxcluster.errors import InputError
from mlxcluster.facts.mpi import ALLREDUCE_ALGORITHMS, allreduce_args
from mlxcluster.jobs.hosts import RankHost

RING_CONNECTIONS = (1, 2, 4)  # mlx.launch --connections-per-ip
MPI_TCP_LINKS = (1, 2, 4, 8)  # --mca btl_tcp_links
TUNABLE_BACKENDS = ("ring", "mpi")  # TCP backends; jaccl/nccl have no such knobs
# Open MPI's allreduce: "default" leaves its decision rules alone; "ring"
# forces its ring algorithm (coll_tuned_allreduce_algorithm 4). Only the ring
# is a candidate: on the lab's slow link it was the one forced algorithm
# faster than the default (2, 3 and 6 were not; docs/performance-runs.md).
MPI_ALLREDUCE = ("default", "ring")
# The btl_tcp_links values the ring allreduce is tried with (those of them in
# --tcp-links). Not the whole sweep, which would double the MPI candidates:
# the ring helps by its traffic pattern (every host sends 2(n-1)/n of the
# payload instead of rank 0 sending 2.6x), which does not depend on the links;
# 1 is the simplest, and 4 (hostfile generate's guess) shows whether striping
# adds to it on a link one stream cannot fill. 2 sits between; 8 stalled on the
# slow lab link. With neither in --tcp-links, every value given is tried.
RING_ALLREDUCE_LINKS = (1, 4)


@dataclass(frozen=True)
class Candidate:
    """One setting: ``connections`` is ring's connections per IP, ``tcp_links``
    MPI's btl_tcp_links; ``ip_index`` restricts every host to its i-th data
    IP (None: every IP the inventory lists)."""

    backend: str
    connections: int = 1
    tcp_links: int = 0
    ip_index: int | None = None
    allreduce: str = "default"  # mpi: a name of MPI_ALLREDUCE

    @property
    def label(self) -> str:
        knob = (f"ring x{self.connections}/ip" if self.backend == "ring"
                else f"mpi links={self.tcp_links}")
        if self.allreduce != "default":
            knob += f" allreduce={self.allreduce}"
        return knob if self.ip_index is None else f"{knob} ip#{self.ip_index + 1}"

    def streams(self, n_ips: int = 1) -> int:
        """TCP connections this setting opens to one neighbour (the raw
        stream it is compared with uses as many)."""
        if self.backend == "ring":
            return self.connections * (1 if self.ip_index is not None else n_ips)
        return self.tcp_links

    @property
    def cost(self) -> tuple:
        """Smaller is simpler: the pick among settings tied within the noise.
        Open MPI's own allreduce choice is simpler than a forced algorithm."""
        default = self.ip_index is None
        return (self.streams(), 0 if default else 1, MPI_ALLREDUCE.index(self.allreduce),
                TUNABLE_BACKENDS.index(self.backend), self.ip_index or 0)

    def allreduce_args(self) -> tuple[str, ...]:
        """The mpirun arguments forcing this setting's allreduce algorithm
        (none for Open MPI's default rules, or for ring)."""
        if self.backend != "mpi" or self.allreduce == "default":
            return ()
        return allreduce_args(ALLREDUCE_ALGORITHMS[self.allreduce])

    def hosts(self, hosts: tuple[RankHost, ...]) -> tuple[RankHost, ...]:
        """``hosts`` restricted to this setting's data IP."""
        if self.ip_index is None:
            return hosts
        return tuple(replace(h, ips=(h.ips[self.ip_index],)) for h in hosts)


def parse_choices(text: str, allowed: tuple[str, ...], problem: str, hint: str) -> tuple[str, ...]:
    """'a, b,a' -> ('a', 'b'); InputError ``problem`` + the names not ``allowed`` (or none given)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise InputError(f"{problem} {', '.join(bad) or '(none given)'}", hint)
    return names


def parse_backends(text: str) -> tuple[str, ...]:
    """'ring,mpi' -> ('ring', 'mpi'); only the TCP backends have knobs to tune."""
    return parse_choices(text, TUNABLE_BACKENDS, "cannot tune backend(s)",
                         f"choose among {','.join(TUNABLE_BACKENDS)} (jaccl and nccl have no "
                         "connection knobs to tune)")


def parse_allreduce(text: str) -> tuple[str, ...]:
    """'default,ring' -> ('default', 'ring'): Open MPI allreduce choices to try."""
    return parse_choices(text, MPI_ALLREDUCE, f"bad --mpi-allreduce {text!r}: unknown",
                         f"choose among {','.join(MPI_ALLREDUCE)}, e.g. --mpi-allreduce default,ring "
                         "(default: Open MPI's own decision rules; ring: its ring algorithm)")


def ring_allreduce_links(mpi_tcp_links: tuple[int, ...]) -> tuple[int, ...]:
    """The btl_tcp_links values the ring allreduce is tried with (RING_ALLREDUCE_LINKS)."""
    return tuple(k for k in mpi_tcp_links if k in RING_ALLREDUCE_LINKS) or mpi_tcp_links


def make_candidates(backends: tuple[str, ...], hosts: tuple[RankHost, ...],
                    ring_connections: tuple[int, ...] = RING_CONNECTIONS,
                    mpi_tcp_links: tuple[int, ...] = MPI_TCP_LINKS,
                    mpi_allreduce: tuple[str, ...] = MPI_ALLREDUCE) -> list[Candidate]:
    """Every setting to try, in a fixed order. When every host lists several
    data IPs, each IP alone is tried too (with the backend's default knob)."""
    out: list[Candidate] = []
    for backend in backends:
        if backend == "ring":
            out += [Candidate("ring", connections=c) for c in ring_connections]
            continue
        if "default" in mpi_allreduce:
            out += [Candidate("mpi", tcp_links=k) for k in mpi_tcp_links]
        if "ring" in mpi_allreduce:
            out += [Candidate("mpi", tcp_links=k, allreduce="ring")
                    for k in ring_allreduce_links(mpi_tcp_links)]
    n_ips = min((len(h.ips) for h in hosts), default=1)
    if n_ips > 1:
        for backend in backends:
            base = Candidate("ring") if backend == "ring" else Candidate(
                "mpi", tcp_links=4, allreduce="default" if "default" in mpi_allreduce else "ring")
            out += [replace(base, ip_index=i) for i in range(n_ips)]
    return out


def parse_counts(text: str, flag: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): the values of a knob to try (1..64 each)."""
    try:
        values = tuple(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))
    except ValueError:
        values = ()
    if not values or any(not 1 <= v <= 64 for v in values):
        raise InputError(f"bad {flag} {text!r}", f"give whole numbers from 1 to 64, e.g. {flag} 1,2,4")
    return values
