"""Hostfiles: the MLX JSON hostfile ``mlx.launch --hostfile`` reads, and the
Open MPI hostfile (``host slots=1`` lines). Model, parsing, validation and
byte-stable serialisation; generation lives in ``hostfile_generate``.

MLX JSON hostfile (mlx ``_distributed_utils/common.py``)::

    {
      "backend": "jaccl",
      "envs": ["MLX_METAL_FAST_SYNCH=1"],
      "hosts": [
        {"ssh": "studio-1", "ips": ["192.168.1.21"], "rdma": [null, "rdma_en3"]},
        {"ssh": "studio-2", "ips": ["192.168.1.22"], "rdma": ["rdma_en5", null]}
      ]
    }

A bare list of hosts is accepted too (mlx's legacy form). An ``rdma`` entry
may be a list when several cables join a pair.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcluster.capture import IBV_DEVICES, IFCONFIG
from mlxcluster.errors import HostfileError
from mlxcluster.inventory import parse_ip, ssh_target_ok
from mlxcluster.parsers.ibv import parse_ibv_devices
from mlxcluster.parsers.ifconfig import ipv4_addresses, parse_ifconfig

BACKENDS = ("ring", "jaccl", "jaccl-ring", "mpi", "nccl")
JACCL_BACKENDS = ("jaccl", "jaccl-ring")

RdmaEntry = str | tuple[str, ...] | None
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_RDMA = re.compile(r"^rdma_[A-Za-z0-9]+$")
_MPI_LINE = re.compile(r"^(\S+)(?:\s+slots=(\S+))?(?:\s+(.*))?$")


@dataclass(frozen=True)
class HostEntry:
    ssh: str
    ips: tuple[str, ...] = ()
    rdma: tuple[RdmaEntry, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ssh": self.ssh,
            "ips": list(self.ips),
            "rdma": [list(r) if isinstance(r, tuple) else r for r in self.rdma],
        }


@dataclass(frozen=True)
class MlxHostfile:
    backend: str
    envs: tuple[str, ...]
    hosts: tuple[HostEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "envs": list(self.envs),
                "hosts": [h.to_json() for h in self.hosts]}

    def dumps(self) -> str:
        """Deterministic text: fixed key order, 2-space indent, one rdma row per line."""
        lines = ["{", f'  "backend": {json.dumps(self.backend)},',
                 f'  "envs": {json.dumps(list(self.envs))},', '  "hosts": [']
        for i, host in enumerate(self.hosts):
            comma = "," if i < len(self.hosts) - 1 else ""
            lines.append("    " + json.dumps(host.to_json()) + comma)
        lines += ["  ]", "}"]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class MpiHost:
    host: str
    slots: int


# ---- parsing ----------------------------------------------------------------


def _rdma_entry(value: Any, where: str, problems: list[str]) -> RdmaEntry:
    if value is None:
        return None
    if isinstance(value, str):
        if not _RDMA.match(value):
            problems.append(f"{where}: {value!r} is not an RDMA device name like rdma_en3")
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        for v in value:
            if not _RDMA.match(v):
                problems.append(f"{where}: {v!r} is not an RDMA device name like rdma_en3")
        return tuple(value)
    problems.append(f"{where}: must be null, a device name or a list of device names")
    return None


def parse_mlx_hostfile(text: str, source: str = "<hostfile>") -> MlxHostfile:
    """Parse and validate an MLX JSON hostfile; every problem in one HostfileError."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HostfileError(f"{source} is not valid JSON ({exc})",
                            "regenerate it: mlxcluster hostfile generate -i INVENTORY --backend ...") from None
    problems: list[str] = []
    backend, envs, raw_hosts = "", [], data
    if isinstance(data, dict):
        backend = data.get("backend", "")
        envs = data.get("envs", [])
        raw_hosts = data.get("hosts")
        for key in sorted(set(data) - {"backend", "envs", "hosts"}):
            problems.append(f"unknown top-level key {key!r}")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        problems.append("'hosts' must be a non-empty list")
        raw_hosts = []
    if backend not in ("", *BACKENDS):
        problems.append(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if not isinstance(envs, list) or not all(isinstance(e, str) and _ENV.match(e) for e in envs):
        problems.append("'envs' must be a list of \"NAME=value\" strings")
        envs = []
    hosts = []
    for i, raw in enumerate(raw_hosts):
        where = f"hosts[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("ssh"), str) or not raw["ssh"]:
            problems.append(f"{where}: needs an \"ssh\" host name")
            continue
        if not ssh_target_ok(raw["ssh"]):
            # It reaches ssh's argv and mlx.launch's: a leading '-' would be an option.
            problems.append(f"{where}: ssh {raw['ssh']!r} is not a [user@]Host alias, hostname or IP "
                            "(no leading '-', spaces, quotes or shell characters)")
            continue
        ips = raw.get("ips", [])
        if not isinstance(ips, list):
            problems.append(f"{where} ({raw['ssh']}): 'ips' must be a list")
            ips = []
        for ip in ips:
            if parse_ip(ip) is None:
                problems.append(f"{where} ({raw['ssh']}): {ip!r} is not an IP address")
        rdma = raw.get("rdma", [])
        if not isinstance(rdma, list):
            problems.append(f"{where} ({raw['ssh']}): 'rdma' must be a list")
            rdma = []
        entries = tuple(_rdma_entry(r, f"{where}.rdma[{j}]", problems) for j, r in enumerate(rdma))
        hosts.append(HostEntry(raw["ssh"], tuple(str(ip) for ip in ips), entries))
    hf = MlxHostfile(backend, tuple(envs), tuple(hosts))
    problems += structure_problems(hf)
    if problems:
        raise HostfileError(
            f"hostfile {source} is invalid ({len(problems)} problem(s)):\n"
            + "\n".join(f"  - {p}" for p in problems),
            "fix the lines above or regenerate: mlxcluster hostfile generate -i INVENTORY --backend ...",
        )
    return hf


def structure_problems(hf: MlxHostfile) -> list[str]:
    """Problems mlx.launch would hit: duplicates, rdma matrix shape, missing IPs."""
    problems = []
    seen: dict[str, int] = {}
    for i, h in enumerate(hf.hosts):
        # Local ranks (what `hostfile generate` writes for --local) share 127.0.0.1.
        if h.ssh in seen and h.ssh not in LOOPBACK_HOSTS:
            problems.append(f"host {h.ssh!r} is listed twice (ranks {seen[h.ssh]} and {i})")
        seen.setdefault(h.ssh, i)
    owners: dict[str, str] = {}
    for h in hf.hosts:
        for ip in h.ips:
            if ip in owners and owners[ip] != h.ssh:
                problems.append(f"IP {ip} is listed for both {owners[ip]} and {h.ssh}")
            owners.setdefault(ip, h.ssh)
    n = len(hf.hosts)
    if hf.backend == "ring":
        for h in hf.hosts:
            if not h.ips:
                problems.append(f"{h.ssh}: the ring backend needs at least one IP per host")
        counts = {len(h.ips) for h in hf.hosts if h.ips}
        if len(counts) > 1:
            problems.append(f"ring hosts list different numbers of IPs {sorted(counts)}; "
                            "each IP is one connection, every host needs the same count")
    if hf.backend in ("nccl", *JACCL_BACKENDS) and hf.hosts and not hf.hosts[0].ips:
        problems.append(f"{hf.hosts[0].ssh}: rank 0 needs an IP (the coordinator address)")
    if hf.backend in JACCL_BACKENDS:
        for i, h in enumerate(hf.hosts):
            if len(h.rdma) != n:
                problems.append(f"{h.ssh}: 'rdma' has {len(h.rdma)} entries, needs {n} (one per host)")
                continue
            if h.rdma[i] is not None:
                problems.append(f"{h.ssh}: rdma[{i}] (itself) must be null")
            wanted = ({(i - 1) % n, (i + 1) % n} if hf.backend == "jaccl-ring" else set(range(n))) - {i}
            for j in sorted(wanted):
                if h.rdma[j] is None:
                    problems.append(f"{h.ssh}: no RDMA device listed towards {hf.hosts[j].ssh}")
    return problems


def parse_mpi_hostfile(text: str, source: str = "<hostfile>") -> tuple[MpiHost, ...]:
    """Parse an Open MPI hostfile (``host slots=N`` per line, ``#`` comments)."""
    problems, hosts, seen = [], [], set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _MPI_LINE.match(line)
        slots = m.group(2) if m else None
        if not m or (slots is not None and not (slots.isdigit() and int(slots) > 0)):
            problems.append(f"line {number}: expected 'host slots=N', got {raw.strip()!r}")
            continue
        if not ssh_target_ok(m.group(1)):
            problems.append(f"line {number}: {m.group(1)!r} is not a [user@]host name or IP")
            continue
        if m.group(1) in seen:
            problems.append(f"line {number}: host {m.group(1)!r} is listed twice")
            continue
        seen.add(m.group(1))
        hosts.append(MpiHost(m.group(1), int(slots) if slots else 1))
    if not hosts and not problems:
        problems.append("no hosts listed")
    if problems:
        raise HostfileError(
            f"MPI hostfile {source} is invalid ({len(problems)} problem(s)):\n"
            + "\n".join(f"  - {p}" for p in problems),
            "regenerate it: mlxcluster hostfile generate -i INVENTORY --backend mpi -o FILE",
        )
    return tuple(hosts)


def dumps_mpi_hostfile(hosts: tuple[MpiHost, ...]) -> str:
    return "".join(f"{h.host} slots={h.slots}\n" for h in hosts)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise HostfileError(f"cannot read hostfile {path}: {why}",
                            "pass the path of a file written by 'mlxcluster hostfile generate'") from None


def load_hostfile(path: str | Path) -> MlxHostfile | tuple[MpiHost, ...]:
    """Read either kind: JSON (starts with ``{`` or ``[``) or an MPI hostfile."""
    p = Path(path)
    text = _read(p)
    if text.lstrip()[:1] in ("{", "["):
        return parse_mlx_hostfile(text, str(p))
    return parse_mpi_hostfile(text, str(p))


def load_mlx_hostfile(path: str | Path) -> MlxHostfile:
    """Read and validate an MLX JSON hostfile (what mlx.launch --hostfile reads)."""
    return parse_mlx_hostfile(_read(Path(path)), str(path))


def cluster_problems(hf: MlxHostfile | tuple[MpiHost, ...], inventory=None,
                     captures: dict | None = None) -> list[str]:
    """Problems against the cluster: hosts missing from the inventory, IPs that
    no interface of their host carries, RDMA devices the host does not have.

    ``captures`` (host name -> HostCapture) supplies each host's ``ifconfig``
    and ``ibv_devices``; hosts without a capture are not IP-checked.
    """
    entries = hf.hosts if isinstance(hf, MlxHostfile) else tuple(
        HostEntry(h.host) for h in hf)
    problems = []
    names: dict[str, str] = {}
    if inventory is not None:
        for host in inventory.hosts:
            names.setdefault(host.ssh, host.name)
            names.setdefault(host.name, host.name)
            for ip in host.ips:
                names.setdefault(ip, host.name)
        for e in entries:
            if e.ssh not in names:
                problems.append(f"{e.ssh}: not a host of inventory {inventory.path or inventory.cluster}")
    for e in entries:
        name = names.get(e.ssh, e.ssh)
        cap = (captures or {}).get(name)
        if cap is None:
            continue
        if cap.text(IFCONFIG) is not None:
            interfaces = parse_ifconfig(cap.text(IFCONFIG))
            present = {ip: i.name for i in interfaces.values() for ip in ipv4_addresses(i)}
            for ip in e.ips:
                if ip not in present and ":" not in ip:
                    problems.append(f"{e.ssh}: IP {ip} is not on any interface of {name}")
        if cap.text(IBV_DEVICES) is not None:
            have = {d.name for d in parse_ibv_devices(cap.text(IBV_DEVICES))}
            wanted = {d for r in e.rdma if r for d in ((r,) if isinstance(r, str) else r)}
            for dev in sorted(wanted - have):
                problems.append(f"{e.ssh}: RDMA device {dev} does not exist on {name} "
                                f"(ibv_devices lists {', '.join(sorted(have)) or 'none'})")
    return problems
