"""Run the probe on hosts and return what it saw, every host in parallel.

``collect_captures(inventory)`` pipes the probe to ``<python> -`` on every
host over paramiko and returns one ``HostCapture`` per host (the probe's
JSON as probe.json, the raw macOS outputs as their own capture files).
``probe_discovered`` does the same for hosts found by Bonjour. Doctor's live
measurements (``mlxcluster/doctor/live.py``) start from ``probe_host``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

from mlxcluster.facts.capture import CAPTURE_FILES, PROBE, RAW_CAPTURE_FILES, HostCapture
from mlxcluster.facts.facts import HostFacts, host_facts
from mlxcluster.inventory.discovery import DiscoveredHost, inventory_entries, render_inventory
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.ssh import remote
from mlxcluster.ssh.remote import ParamikoRunner, run_parallel
from mlxcluster.ssh.results import CommandResult, Outcome

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
        # In CAPTURE_FILES' order, as a --collect folder is read back: a live
        # run and its replay list the same files the same way.
        files.update({k: raw[k] for k in CAPTURE_FILES if k in RAW_CAPTURE_FILES and isinstance(raw.get(k), str)})
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
    runner = runner or remote.open_runner(inventory.ssh_config, connect_timeout=connect_timeout,
                                          command_timeout=command_timeout,
                                          accept_new_host_keys=accept_new_host_keys)
    try:
        hosts = {h.name: h for h in inventory.hosts}
        outcomes = run_parallel(hosts, lambda n: probe_host(runner, hosts[n], command_timeout))
        return {n: capture_or_error(n, o) for n, o in outcomes.items()}
    finally:
        if own:
            runner.close()


def probe_discovered(hosts: list[DiscoveredHost], *, python: str, user: str | None = None,
                     ssh_config: str | None = None, connect_timeout: float = 5.0) -> dict[str, HostFacts]:
    """Run doctor's probe over SSH on every discovered host that offers SSH;
    facts by the host's Bonjour name (``facts.probed`` is False when it failed)."""
    # Probe the address that just answered: no dependence on .local name resolution.
    pairs = inventory_entries(hosts, prefer_ip=True)
    if not pairs:
        return {}
    inventory = parse_inventory(render_inventory(hosts, cluster="discovered", python=python, user=user,
                                                 ssh_config=ssh_config, prefer_ip=True), "<discovered>")
    captures = collect_captures(inventory, connect_timeout=connect_timeout)
    return {host.name: host_facts(captures[entry["name"]]) for host, entry in pairs}
