"""The settings ``tune`` tries: backend x ring connections per IP x MPI
``btl_tcp_links`` x data interfaces (when every host has several)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost

RING_CONNECTIONS = (1, 2, 4)  # mlx.launch --connections-per-ip
MPI_TCP_LINKS = (1, 2, 4, 8)  # --mca btl_tcp_links
TUNABLE_BACKENDS = ("ring", "mpi")  # TCP backends; jaccl/nccl have no such knobs


@dataclass(frozen=True)
class Candidate:
    """One setting: ``connections`` is ring's connections per IP, ``tcp_links``
    MPI's btl_tcp_links; ``ip_index`` restricts every host to its i-th data
    IP (None: every IP the inventory lists)."""

    backend: str
    connections: int = 1
    tcp_links: int = 0
    ip_index: int | None = None

    @property
    def label(self) -> str:
        knob = (f"ring x{self.connections}/ip" if self.backend == "ring"
                else f"mpi links={self.tcp_links}")
        return knob if self.ip_index is None else f"{knob} ip#{self.ip_index + 1}"

    def streams(self, n_ips: int = 1) -> int:
        """TCP connections this setting opens to one neighbour (the raw
        stream it is compared with uses as many)."""
        if self.backend == "ring":
            return self.connections * (1 if self.ip_index is not None else n_ips)
        return self.tcp_links

    @property
    def cost(self) -> tuple:
        """Smaller is simpler: the pick among settings tied within the noise."""
        default = self.ip_index is None
        return (self.streams(), 0 if default else 1, TUNABLE_BACKENDS.index(self.backend),
                self.ip_index or 0)

    def hosts(self, hosts: tuple[RankHost, ...]) -> tuple[RankHost, ...]:
        """``hosts`` restricted to this setting's data IP."""
        if self.ip_index is None:
            return hosts
        return tuple(replace(h, ips=(h.ips[self.ip_index],)) for h in hosts)


def parse_backends(text: str) -> tuple[str, ...]:
    """'ring,mpi' -> ('ring', 'mpi'); only the TCP backends have knobs to tune."""
    names = tuple(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    bad = [b for b in names if b not in TUNABLE_BACKENDS]
    if bad or not names:
        raise InputError(f"cannot tune backend(s) {', '.join(bad) or '(none)'}",
                         f"choose among {','.join(TUNABLE_BACKENDS)} (jaccl and nccl have no "
                         "connection knobs to tune)")
    return names


def make_candidates(backends: tuple[str, ...], hosts: tuple[RankHost, ...],
                    ring_connections: tuple[int, ...] = RING_CONNECTIONS,
                    mpi_tcp_links: tuple[int, ...] = MPI_TCP_LINKS) -> list[Candidate]:
    """Every setting to try, in a fixed order. When every host lists several
    data IPs, each IP alone is tried too (with the backend's default knob)."""
    out: list[Candidate] = []
    for backend in backends:
        if backend == "ring":
            out += [Candidate("ring", connections=c) for c in ring_connections]
        else:
            out += [Candidate("mpi", tcp_links=k) for k in mpi_tcp_links]
    n_ips = min((len(h.ips) for h in hosts), default=1)
    if n_ips > 1:
        for backend in backends:
            base = Candidate("ring") if backend == "ring" else Candidate("mpi", tcp_links=4)
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
