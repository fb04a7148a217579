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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxcluster.errors import HostfileError
from mlxcluster.facts.capture import IBV_DEVICES, IFCONFIG
from mlxcluster.facts.facts import host_facts
from mlxcluster.facts.parsers.ibv import parse_ibv_devices
from mlxcluster.facts.parsers.ifconfig import ipv4_addresses, parse_ifconfig
from mlxcluster.inventory.inventory import parse_ip, shorten, show, ssh_target_ok

BACKENDS = ("ring", "jaccl", "jaccl-ring", "mpi", "nccl")
JACCL_BACKENDS = ("jaccl", "jaccl-ring")

RdmaEntry = str | tuple[str, ...] | None
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_RDMA = re.compile(r"^rdma_[A-Za-z0-9]+\Z")
# Open MPI hostfile keywords we write or accept (``host slots=N max_slots=M``);
# ASCII digits only (str.isdigit() is true for '²' and '٣').
_MPI_KEYWORDS = ("slots", "max_slots")
_MPI_SETTING = re.compile(r"^([A-Za-z_-]+)=([0-9]{1,10})\Z")
_MPI_BLANKS = " \t\f\v"  # what Open MPI's hostfile lexer skips between words
_MPI_MAX_SLOTS = 2**31 - 1  # Open MPI keeps slot counts in an int
_JSON_START = ("{", "[", '"')


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
            problems.append(f"{where}: {show(value)} is not an RDMA device name like rdma_en3")
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        for v in value:
            if not _RDMA.match(v):
                problems.append(f"{where}: {show(v)} is not an RDMA device name like rdma_en3")
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
    except RecursionError:
        raise HostfileError(f"{source} is not a hostfile: its JSON nests too deeply to read",
                            "regenerate it: mlxcluster hostfile generate -i INVENTORY --backend ...") from None
    if not isinstance(data, (dict, list)):
        raise HostfileError(
            f"{source} holds the JSON value {show(data)}, not a hostfile "
            '(an object with "hosts", or a list of hosts)',
            "regenerate it: mlxcluster hostfile generate -i INVENTORY --backend ... "
            "(an MPI hostfile line is 'host slots=1')")
    problems: list[str] = []
    backend, envs, raw_hosts = "", [], data
    if isinstance(data, dict):
        backend = data.get("backend", "")
        envs = data.get("envs", [])
        raw_hosts = data.get("hosts")
        for key in sorted(set(data) - {"backend", "envs", "hosts"}):
            problems.append(f"unknown top-level key {show(key)}")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        problems.append("'hosts' must be a non-empty list")
        raw_hosts = []
    if backend not in ("", *BACKENDS):
        problems.append(f"backend {show(backend)} is not one of {', '.join(BACKENDS)}")
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
            problems.append(f"{where}: ssh {show(raw['ssh'])} is not a [user@]Host alias, hostname or IP "
                            "(no leading '-', spaces, quotes or shell characters)")
            continue
        ips = raw.get("ips", [])
        if not isinstance(ips, list):
            problems.append(f"{where} ({raw['ssh']}): 'ips' must be a list")
            ips = []
        for ip in ips:
            if parse_ip(ip) is None:
                problems.append(f"{where} ({raw['ssh']}): {show(ip)} is not an IP address")
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


def _mpi_settings(rest: str) -> tuple[dict[str, int], str | None]:
    """``slots=N max_slots=M`` (spaces around '=' allowed, as Open MPI reads
    them) as a dict, or the reason the text is not that."""
    settings: dict[str, int] = {}
    for token in re.sub(r"[ ]*=[ ]*", "=", rest).split(" ") if rest else ():
        m = _MPI_SETTING.match(token)
        if not m or m.group(1) not in _MPI_KEYWORDS:
            return settings, f"{show(token)} is not slots=N or max_slots=N"
        key, value = m.group(1), int(m.group(2))
        if key in settings:
            return settings, f"{key} is given twice"
        if not 1 <= value <= _MPI_MAX_SLOTS:
            return settings, f"{key} must be a whole number from 1 to {_MPI_MAX_SLOTS}"
        settings[key] = value
    if settings.get("max_slots", _MPI_MAX_SLOTS) < settings.get("slots", 1):
        return settings, "max_slots is less than slots"
    return settings, None


def parse_mpi_hostfile(text: str, source: str = "<hostfile>") -> tuple[MpiHost, ...]:
    """Parse an Open MPI hostfile: ``host [slots=N] [max_slots=M]`` per line,
    ``#`` comments; anything else on a line is a problem (Open MPI refuses it)."""
    problems, hosts, seen = [], [], set()
    for number, raw in enumerate(text.split("\n"), 1):  # only '\n' ends a line for Open MPI
        line = raw.split("#", 1)[0].strip(_MPI_BLANKS + "\r")
        if not line:
            continue
        host, _, rest = re.sub(f"[{_MPI_BLANKS}]+", " ", line).partition(" ")
        settings, why = _mpi_settings(rest)
        if why is not None:
            problems.append(f"line {number}: expected 'host slots=N' (optionally max_slots=M), "
                            f"got {show(raw.strip())}: {why}")
            continue
        if not ssh_target_ok(host):
            problems.append(f"line {number}: {show(host)} is not a [user@]host name or IP")
            continue
        if host in seen and host not in LOOPBACK_HOSTS:  # local ranks share 127.0.0.1, as in JSON
            problems.append(f"line {number}: host {show(host)} is listed twice")
            continue
        seen.add(host)
        hosts.append(MpiHost(host, settings.get("slots", 1)))
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
    """The file's text; a UTF-8 BOM (some editors write one) is dropped."""
    hint = "pass the path of a file written by 'mlxcluster hostfile generate'"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HostfileError(f"cannot read hostfile {path}: {exc.strerror or exc}", hint) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HostfileError(f"cannot read hostfile {path}: line {line} is not UTF-8 text "
                            f"(byte 0x{data[exc.start]:02x} at offset {exc.start})", hint) from None


def is_json_text(text: str) -> bool:
    """Whether ``text`` is (meant as) JSON: it starts like JSON, or parses as
    a JSON value ('5'). Such a file is never reread as an MPI hostfile."""
    if text.lstrip()[:1] in _JSON_START:
        return True
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def load_hostfile(path: str | Path) -> MlxHostfile | tuple[MpiHost, ...]:
    """Read either kind: JSON (see is_json_text) or an MPI hostfile."""
    p = Path(path)
    text = _read(p)
    if is_json_text(text):
        return parse_mlx_hostfile(text, str(p))
    return parse_mpi_hostfile(text, str(p))


def load_mlx_hostfile(path: str | Path) -> MlxHostfile:
    """Read and validate an MLX JSON hostfile (what mlx.launch --hostfile reads)."""
    return parse_mlx_hostfile(_read(Path(path)), str(path))


def load_launch_hostfile(path: str | Path) -> MlxHostfile:
    """Either kind as the hosts to launch on: an MPI hostfile (what ``tune``
    and ``hostfile generate --backend mpi`` write) becomes an mpi-backend
    hostfile with one host per slot, its line's name as ssh target and IP."""
    hostfile = load_hostfile(path)
    if isinstance(hostfile, MlxHostfile):
        return hostfile
    return MlxHostfile("mpi", (), tuple(HostEntry(h.host, (h.host,)) for h in hostfile
                                        for _ in range(h.slots)))


@dataclass(frozen=True)
class ClusterCheck:
    """What ``check_against_cluster`` found: ``problems`` (mismatches), and
    the hosts whose IPs / RDMA devices could not be checked, with why."""

    problems: list[str] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)  # host -> why ("ssh (rank i)" when repeated)
    checked: list[str] = field(default_factory=list)  # hosts compared with a capture


def cluster_problems(hf: MlxHostfile | tuple[MpiHost, ...], inventory=None,
                     captures: dict | None = None) -> list[str]:
    """The mismatches of ``check_against_cluster`` (hosts it could not check are not problems)."""
    return check_against_cluster(hf, inventory, captures).problems


def probe_ipv4_addresses(cap) -> set[str]:
    """The IPv4 addresses the probe saw on the host's interfaces (every platform)."""
    return {a["address"] for iface in host_facts(cap).interfaces for a in iface.get("addrs", ())
            if a.get("family") == "inet" and a.get("address")}


def check_against_cluster(hf: MlxHostfile | tuple[MpiHost, ...], inventory=None,
                          captures: dict | None = None) -> ClusterCheck:
    """Check a hostfile against the cluster: hosts missing from the inventory,
    IPs that no interface of their host carries, RDMA devices the host does
    not have.

    ``captures`` (host name -> HostCapture) supplies each host's ``ifconfig``
    and ``ibv_devices``. A host with IPs or RDMA devices to check but no
    usable capture (no folder of its name, not probed, the file missing or
    unreadable) is ``unchecked``, never silently passed. Without captures
    nothing is compared and nothing is reported unchecked.
    """
    entries = hf.hosts if isinstance(hf, MlxHostfile) else tuple(
        HostEntry(h.host) for h in hf)
    result = ClusterCheck()
    problems, unchecked = result.problems, result.unchecked
    names: dict[str, str] = {}
    if inventory is not None:
        for host in inventory.hosts:
            names.setdefault(host.ssh, host.name)
            names.setdefault(host.name, host.name)
            for ip in host.ips:
                names.setdefault(ip, host.name)
        # A hostfile's user@ (generate writes the inventory's user) names no other host.
        names.update({e.ssh: names[e.ssh.rpartition("@")[2]] for e in entries
                      if e.ssh.rpartition("@")[2] in names})
        for e in entries:
            if e.ssh not in names:
                problems.append(f"{e.ssh}: not a host of inventory {inventory.path or inventory.cluster}")
    if captures is None:
        return result
    repeated = {e.ssh for i, e in enumerate(entries) if e.ssh in {x.ssh for x in entries[:i]}}
    for rank, e in enumerate(entries):
        label = f"{e.ssh} (rank {rank})" if e.ssh in repeated else e.ssh
        name = names.get(e.ssh, e.ssh)
        wanted = {d for r in e.rdma if r for d in ((r,) if isinstance(r, str) else r)}
        if not e.ips and not wanted:
            continue  # nothing of this host to compare
        cap = captures.get(name)
        if cap is None:
            unchecked[label] = (f"no capture of {name}" if inventory is not None
                                else f"no capture folder named {name!r} (capture folders carry inventory "
                                     "host names: pass -i INVENTORY to map ssh targets to them)")
            continue
        if cap.error is not None and not cap.files:
            unchecked[label] = f"{name} could not be probed: {shorten(cap.error)}"
            continue
        why = []
        if e.ips:
            text, bad = cap.text(IFCONFIG), cap.problems().get(IFCONFIG)
            interfaces = parse_ifconfig(text) if text is not None and bad is None else {}
            # Hosts without ifconfig output (Linux) list their addresses in the probe.
            probed = probe_ipv4_addresses(cap) if not interfaces else set()
            if probed:
                present = probed
            elif text is None or bad is not None:
                why.append(f"its {IFCONFIG} capture is {bad or 'missing'}")
            elif not interfaces:
                why.append(f"its {IFCONFIG} capture lists no interface")
            else:
                present = {ip for i in interfaces.values() for ip in ipv4_addresses(i)}
            if not why:
                for ip in e.ips:
                    if ":" in ip:
                        why.append(f"IPv6 {ip} not compared (only IPv4 addresses are)")
                    elif ip not in present:
                        problems.append(f"{e.ssh}: IP {ip} is not on any interface of {name}")
        if wanted:
            text, bad = cap.text(IBV_DEVICES), cap.problems().get(IBV_DEVICES)
            if text is None or bad is not None:
                why.append(f"its {IBV_DEVICES} capture is {bad or 'missing'}")
            else:
                have = {d.name for d in parse_ibv_devices(text)}
                for dev in sorted(wanted - have):
                    problems.append(f"{e.ssh}: RDMA device {dev} does not exist on {name} "
                                    f"(ibv_devices lists {', '.join(sorted(have)) or 'none'})")
        if why:
            unchecked[label] = "; ".join(why)
        else:
            result.checked.append(label)
    return result
