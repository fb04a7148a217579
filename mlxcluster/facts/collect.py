"""Collect what doctor needs from live hosts, every host in parallel.

``collect_captures(inventory)`` pipes the probe to ``<python> -`` on every
host over paramiko and returns one ``HostCapture`` per host (the probe's
JSON as probe.json, the raw macOS outputs as their own capture files).
``collect_live`` does that plus the live-only measurements doctor's checks
judge: SSH via paramiko and via OpenSSH BatchMode, host-to-host SSH from the
first host (``hops``), and data-path TCP connects (``datapath``), all at once.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import socket
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.doctor.datapath import DataPathReport, check_data_paths
from mlxcluster.facts.capture import PROBE, RAW_CAPTURE_FILES, HostCapture
from mlxcluster.ssh.hops import run_hops
from mlxcluster.ssh.openssh import OpenSshRunner
from mlxcluster.ssh.remote import CommandResult, Outcome, ParamikoRunner, run_parallel

PROBE_TIMEOUT = 60.0


def probe_source() -> str:
    """The probe script's text (sent on stdin; nothing is installed remotely)."""
    return (Path(__file__).with_name("probe_script.py")).read_text(encoding="utf-8")


def probe_command(python: str, env: dict[str, str]) -> str:
    """``env K=V ... <python> - --inventory-env K,...``, every part quoted."""
    parts: list[str] = []
    if env:
        parts += ["env"] + [f"{k}={v}" for k, v in sorted(env.items())]
    parts += [python, "-"]
    if env:
        parts += ["--inventory-env", ",".join(sorted(env))]
    return " ".join(shlex.quote(p) for p in parts)


def capture_from_probe(name: str, result: CommandResult, python: str) -> HostCapture:
    """Split the probe's output into capture files; explain a probe that did not run."""
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        last = (result.stderr.strip().splitlines() or [f"exit {result.exit_status}"])[-1]
        if result.exit_status == 127 or "No such file" in result.stderr:
            why = f"python {python} not found on this host ({last})"
        else:
            why = f"probe failed with {python}: exit {result.exit_status}: {last}"
        return HostCapture(name=name, error=why)
    try:
        facts = json.loads(lines[-1])
    except ValueError:
        facts = None
    if not isinstance(facts, dict):
        return HostCapture(name=name, error=f"the probe printed no JSON object (last line: {lines[-1][:120]!r})")
    raw = facts.pop("raw", None)
    files = {PROBE: json.dumps(facts, indent=1, sort_keys=True) + "\n"}
    # Raw outputs become files under --collect DIR/<host>/: keep only the
    # documented names, whatever the host's output says ('../x' or '/x' would
    # write outside DIR).
    if isinstance(raw, dict):
        files.update({k: v for k, v in raw.items() if k in RAW_CAPTURE_FILES and isinstance(v, str)})
    return HostCapture(name=name, files=files)


def probe_host(runner: ParamikoRunner, host, timeout: float = PROBE_TIMEOUT) -> HostCapture:
    """Run the probe on one host; SshError propagates (the caller records it)."""
    result = runner.run(host.ssh, probe_command(host.python, dict(host.env)), user=host.user,
                        port=host.port, stdin=probe_source(), timeout=timeout)
    return capture_from_probe(host.name, result, host.python)


def probe_locally(host, timeout: float = PROBE_TIMEOUT) -> HostCapture:
    """Run the probe on this machine without SSH: ranks on 127.0.0.1 are
    started locally by mlx.launch too."""
    started = time.monotonic()
    try:
        proc = subprocess.run(["/bin/sh", "-c", probe_command(host.python, dict(host.env))],
                              input=probe_source(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return HostCapture(name=host.name, error=f"probe timed out after {timeout:.0f}s")
    result = CommandResult(proc.stdout, proc.stderr, proc.returncode, time.monotonic() - started)
    return capture_from_probe(host.name, result, host.python)


def capture_or_error(name: str, outcome: Outcome) -> HostCapture:
    if outcome.ok:
        return outcome.value
    return HostCapture(name=name, error=str(outcome.error))


def collect_captures(inventory, *, runner: ParamikoRunner | None = None, connect_timeout: float = 5.0,
                     command_timeout: float = PROBE_TIMEOUT,
                     accept_new_host_keys: bool = False) -> dict[str, HostCapture]:
    """Probe every inventory host in parallel; unreachable hosts get ``error`` set."""
    own = runner is None
    runner = runner or ParamikoRunner(inventory.ssh_config, connect_timeout=connect_timeout,
                                      command_timeout=command_timeout,
                                      accept_new_host_keys=accept_new_host_keys)
    try:
        hosts = {h.name: h for h in inventory.hosts}
        outcomes = run_parallel(hosts, lambda n: probe_host(runner, hosts[n], command_timeout))
        return {n: capture_or_error(n, o) for n, o in outcomes.items()}
    finally:
        if own:
            runner.close()


@dataclass
class LiveCollection:
    """Everything observed live; checks judge it, nothing here judges."""

    captures: dict[str, HostCapture]
    paramiko: dict[str, Outcome]  # host -> Outcome(value=HostCapture | error=SshError)
    openssh: dict[str, Outcome]  # host -> Outcome(value=CommandResult | error)
    host_to_host: dict[str, Outcome] = field(default_factory=dict)  # "a -> b" -> Outcome
    host_to_host_source: str | None = None
    data_path: DataPathReport | None = None
    ssh_options: dict[str, Outcome] = field(default_factory=dict)  # host -> Outcome(value=ssh -G dict)


def data_addresses(runner: ParamikoRunner, host) -> list[str]:
    """The host's data IPs: inventory ``ips``, else the address SSH reached."""
    if host.ips:
        return list(host.ips)
    target = runner.target(host.ssh, host.user, host.port)
    try:
        ipaddress.ip_address(target.hostname)
        return [target.hostname]
    except ValueError:
        pass
    peer = runner.peer_address(host.ssh, host.user, host.port)
    if peer:
        return [peer]
    try:
        return [socket.gethostbyname(target.hostname)]
    except OSError:
        return []


def collect_live(inventory, *, connect_timeout: float = 5.0, command_timeout: float = PROBE_TIMEOUT,
                 accept_new_host_keys: bool = False, data_path: bool = True,
                 runner: ParamikoRunner | None = None, host_to_host: bool = True) -> LiveCollection:
    """Every host at once, and every test at once.

    One paramiko connection per host; each host's probe starts as soon as
    that host is connected, and the host-to-host hops as soon as the first
    host is, so a dead host (which costs one connect timeout) delays nothing
    else. The OpenSSH BatchMode test runs beside the connects and the
    data-path agents start once every connect has resolved (ports are
    numbered over all hosts). Doctor's wall time is the slowest of these, not
    their sum. With ``accept_new_host_keys`` the OpenSSH test waits for the
    connects: it must see the keys paramiko accepted and saved. Without
    ``host_to_host`` (only mpirun started on a host needs it) no hop is made.
    """
    own = runner is None
    runner = runner or ParamikoRunner(inventory.ssh_config, connect_timeout=connect_timeout,
                                      command_timeout=command_timeout,
                                      accept_new_host_keys=accept_new_host_keys)
    openssh = OpenSshRunner(inventory.ssh_config, connect_timeout=connect_timeout,
                            command_timeout=connect_timeout + 15)
    hosts = {h.name: h for h in inventory.hosts}
    links: dict[str, Future] = {n: Future() for n in hosts}  # -> Outcome of the connect

    def connect_then_probe(name: str) -> HostCapture:
        host = hosts[name]
        try:
            runner.connect(host.ssh, host.user, host.port)
        except BaseException as exc:
            links[name].set_result(Outcome(name, error=exc))
            raise
        links[name].set_result(Outcome(name, value=True))
        return probe_host(runner, host, command_timeout)

    def batch_all():
        return run_parallel(hosts, lambda n: openssh.run(hosts[n].ssh, "true", user=hosts[n].user,
                                                          port=hosts[n].port))

    pool = ThreadPoolExecutor(max_workers=4)
    try:
        batch_f = None if accept_new_host_keys else pool.submit(batch_all)
        # What plain `ssh HOST` would do (ssh -G, local): the policy mlx.launch
        # and mpirun get when run without mlxcluster.
        options_f = pool.submit(run_parallel, hosts, lambda n: openssh.resolved_options(
            hosts[n].ssh, user=hosts[n].user, port=hosts[n].port))
        probe_f = pool.submit(run_parallel, hosts, connect_then_probe)
        h2h_f = (pool.submit(collect_host_to_host, runner, list(hosts.values()), links, connect_timeout)
                 if host_to_host else None)
        connected = {n: link.result() for n, link in links.items()}
        batch_f = batch_f or pool.submit(batch_all)
        up = [h for n, h in hosts.items() if connected[n].ok]
        dp_f = None
        if data_path and len(up) > 1:
            addresses = {n: data_addresses(runner, h) if connected[n].ok else list(h.ips)
                         for n, h in hosts.items()}
            dp_f = pool.submit(check_data_paths, runner, up, addresses, {h.name: h.python for h in up})
        probed = probe_f.result()
        live = LiveCollection({n: capture_or_error(n, o) for n, o in probed.items()}, probed,
                              batch_f.result())
        if h2h_f is not None:
            live.host_to_host_source, live.host_to_host = h2h_f.result()
        live.data_path = dp_f.result() if dp_f else None
        live.ssh_options = options_f.result()
        pool.shutdown()
        return live
    except KeyboardInterrupt:
        # Do not wait for threads blocked in a connect or a read: the
        # connections close below, and the CLI exits without joining them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if own:
            runner.close()


def collect_host_to_host(runner: ParamikoRunner, hosts: list, links: dict[str, Future],
                         connect_timeout: float) -> tuple[str | None, dict[str, Outcome]]:
    """From the first host, ssh BatchMode to every other host (mpirun's path),
    as soon as the first host is connected."""
    if len(hosts) < 2:
        return None, {}
    first, others = hosts[0], hosts[1:]
    if not links[first.name].result().ok:
        return first.name, {}
    return first.name, run_hops(runner, first, others, connect_timeout)
