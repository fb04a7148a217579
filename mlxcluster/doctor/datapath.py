"""Data-path reachability: real TCP connects on the real ring ports.

SSH working proves little about the data path: the ring backend and MPI
connect to other IPs (Thunderbolt, a second NIC) and other ports (32323 and
up), which a firewall or a missing route can block while ping and SSH work.
So, on every host we start a short-lived listener on exactly the ports
``mlx.launch --backend ring`` would give that host, then from every host we
connect to every other host's data IPs, and report errno per pair.

One tiny standard-library script per host (``AGENT``, run with ``<python>
-c``, one SSH session) does both halves: it binds, prints what it bound, then
reads the list of endpoints to connect to on stdin and prints one result per
connect, all while it keeps accepting. It exits when its stdin closes or
after ``LISTEN_SECONDS``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from mlxcluster.ssh.remote import ParamikoRunner, python_command, read_line, run_parallel

RING_STARTING_PORT = 32323  # mlx.launch --starting-port default
LISTEN_SECONDS = 60
CONNECT_TIMEOUT = 3.0

AGENT = r"""
import errno, json, os, re, select, socket, subprocess, sys, threading, time
spec = json.loads(sys.argv[1])
socks, bound, errors, holders = [], [], [], []

def holder(port):
    # Who listens on the port, as "name (pid N)": lsof (macOS, most Linux), else ss.
    tools = (["lsof", "-nP", "-iTCP:%d" % port, "-sTCP:LISTEN", "-Fpc"], ["ss", "-ltnpH", "sport = :%d" % port])
    for argv in tools:
        try:
            out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"^p(\d+)\nc(.+)$", out, re.M)
        if m:
            return "%s (pid %s)" % (m.group(2), m.group(1))
        m = re.search(r'\(\("([^"]+)",pid=(\d+)', out)
        if m:
            return "%s (pid %s)" % (m.group(1), m.group(2))
    return None

def listen(ip, port, patience):
    # A port still held by something that is exiting (the agent of a run that
    # just ended, a finished job) frees within moments: retry that briefly.
    give_up = time.time() + patience
    while True:
        s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
            s.listen(64)
            return s
        except OSError as e:
            s.close()
            if e.errno != errno.EADDRINUSE or time.time() > give_up:
                raise
            time.sleep(0.1)

for ip, port in spec["binds"]:
    try:
        socks.append(listen(ip, port, spec.get("busy_patience", 2.0)))
        bound.append([ip, port])
    except OSError as e:
        errors.append([ip, port, errno.errorcode.get(e.errno, str(e.errno))])
        if e.errno == errno.EADDRINUSE:
            holders.append([ip, port, holder(port)])
sys.stdout.write(json.dumps({"bound": bound, "errors": errors, "holders": holders}) + "\n")
sys.stdout.flush()

def one(results, i, ip, port, timeout):
    t = time.time()
    try:
        socket.create_connection((ip, port), timeout=timeout).close()
        r = "ok"
    except socket.timeout:
        r = "ETIMEDOUT"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    results[i] = [ip, port, r, round(time.time() - t, 3)]

def connect_all(request):
    targets = request["targets"]
    results = [None] * len(targets)
    threads = [threading.Thread(target=one, args=(results, i, ip, port, request["timeout"]))
               for i, (ip, port) in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write(json.dumps(results) + "\n")
    sys.stdout.flush()

# Keep accepting while our own connects run: the other hosts test us meanwhile.
deadline = time.time() + spec["seconds"]
pending = b""
while time.time() < deadline:
    ready = select.select(socks + [0], [], [], 0.5)[0]
    for s in ready:
        if s != 0:
            s.accept()[0].close()
    if 0 in ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            threading.Thread(target=connect_all, args=(json.loads(line),), daemon=True).start()
"""


@dataclass(frozen=True)
class Endpoint:
    host: str
    ip: str
    port: int


@dataclass(frozen=True)
class Connect:
    """One TCP connect from ``source`` to ``target``'s endpoint."""

    source: str
    target: str
    ip: str
    port: int
    result: str  # "ok" or an errno name (ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH...)
    seconds: float


@dataclass
class DataPathReport:
    endpoints: dict[str, list[Endpoint]]
    # Per host: endpoints its listener could not bind ([ip, port, errno name]).
    bind_errors: dict[str, list[tuple[str, int, str]]] = field(default_factory=dict)
    connects: list[Connect] = field(default_factory=list)
    # Hosts that could not take part, with why (no SSH, listener failed...).
    skipped: dict[str, str] = field(default_factory=dict)
    # Per host: who holds a port it could not bind (EADDRINUSE), "name (pid N)".
    holders: dict[str, dict[tuple[str, int], str]] = field(default_factory=dict)


def ring_endpoints(addresses: dict[str, list[str]], starting_port: int = RING_STARTING_PORT,
                   connections_per_ip: int = 1) -> dict[str, list[Endpoint]]:
    """The ip:port each host listens on, numbered as mlx.launch numbers them
    (host order, then IP order, +1 per connection)."""
    port = starting_port
    plan: dict[str, list[Endpoint]] = {}
    for host, ips in addresses.items():
        plan[host] = []
        for ip in ips:
            for _ in range(connections_per_ip):
                plan[host].append(Endpoint(host, ip, port))
                port += 1
    return plan


def check_data_paths(
    runner: ParamikoRunner,
    hosts: Iterable,  # inventory Hosts that answered over SSH
    addresses: dict[str, list[str]],  # every inventory host, in inventory order
    pythons: dict[str, str],
    *,
    starting_port: int = RING_STARTING_PORT,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> DataPathReport:
    """Listen on every reachable host's ring endpoints, connect from every other one.

    Ports are numbered over ALL hosts (as mlx.launch numbers them), so a host
    that is down does not shift the ports tested on the others.
    """
    hosts = {h.name: h for h in hosts}
    report = DataPathReport(ring_endpoints(addresses, starting_port))
    for name in report.endpoints:
        if name not in hosts:
            report.skipped[name] = "not reachable over SSH"
    channels = {}

    def listen(name: str):
        host = hosts[name]
        binds = [[e.ip, e.port] for e in report.endpoints[name]]
        channel = runner.start(host.ssh, python_command(pythons[name], AGENT,
                               {"binds": binds, "seconds": LISTEN_SECONDS}), user=host.user, port=host.port)
        channels[name] = channel
        return json.loads(_answer(channel, runner.command_timeout, "listener"))

    listened = run_parallel([n for n in report.endpoints if n in hosts], listen)
    ready: dict[str, set[tuple[str, int]]] = {}
    for name, outcome in listened.items():
        if not outcome.ok:
            report.skipped[name] = f"listener did not start: {outcome.error}"
            continue
        ready[name] = {(ip, port) for ip, port in outcome.value["bound"]}
        if outcome.value["errors"]:
            report.bind_errors[name] = [tuple(e) for e in outcome.value["errors"]]
        found = {(ip, port): who for ip, port, who in outcome.value.get("holders", []) if who}
        if found:
            report.holders[name] = found

    def connect_from(name: str) -> list[Connect]:
        # Every listener is up before any host is told to connect.
        targets = [e for other, eps in report.endpoints.items() if other != name and other in ready
                   for e in eps if (e.ip, e.port) in ready[other]]
        if not targets:
            return []
        request = {"targets": [[e.ip, e.port] for e in targets], "timeout": connect_timeout}
        channels[name].sendall((json.dumps(request) + "\n").encode())
        rows = json.loads(_answer(channels[name], connect_timeout + runner.command_timeout, "connect test"))
        return [Connect(name, e.host, ip, port, r, secs) for e, (ip, port, r, secs) in zip(targets, rows, strict=True)]

    try:
        connected = run_parallel(list(ready), connect_from)
    finally:
        for channel in channels.values():
            try:
                channel.shutdown_write()  # the agent exits on stdin EOF
                channel.close()
            except (OSError, EOFError):
                pass
    for name, outcome in connected.items():
        if outcome.ok:
            report.connects.extend(outcome.value)
        else:
            report.skipped[name] = f"connect test did not run: {outcome.error}"
    return report


def _answer(channel, timeout: float, what: str) -> str:
    """The agent's next line, or an error carrying its last stderr line."""
    line = read_line(channel, timeout)
    if line is not None:
        return line
    err = b""
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(65536)
    last = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"{what} printed nothing: {last}")
