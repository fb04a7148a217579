"""What doctor measures live, every host and every test at once.

``collect_live`` probes every host (``mlxcluster/facts/collect.py``) and,
beside it, the live-only measurements doctor's checks judge: SSH via paramiko
and via OpenSSH BatchMode, host-to-host SSH from every host (``hops``),
and data-path TCP connects (``datapath``).
"""

from __future__ import annotations

import ipaddress
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from mlxcluster.doctor.datapath import DataPathReport, check_data_paths
from mlxcluster.facts.capture import HostCapture
from mlxcluster.facts.collect import PROBE_TIMEOUT, capture_or_error, probe_host
from mlxcluster.ssh import remote
from mlxcluster.ssh.hops import PARALLEL, run_hops
from mlxcluster.ssh.openssh import OpenSshRunner
from mlxcluster.ssh.remote import ParamikoRunner, run_parallel
from mlxcluster.ssh.results import Outcome


@dataclass
class LiveCollection:
    """Everything observed live; checks judge it, nothing here judges."""

    captures: dict[str, HostCapture]
    paramiko: dict[str, Outcome]  # host -> Outcome(value=HostCapture | error=SshError)
    openssh: dict[str, Outcome]  # host -> Outcome(value=CommandResult | error)
    # Every host's hops to the others, a -> b as {a: {b: Outcome}}, in the
    # inventory's order (a host not connected is absent); the first host, whose
    # hops mpirun started there makes, is named apart (None: one host).
    host_to_host: dict[str, dict[str, Outcome]] = field(default_factory=dict)
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
    runner = runner or remote.open_runner(inventory.ssh_config, connect_timeout=connect_timeout,
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


def collect_host_to_host(runner: ParamikoRunner, hosts: list, links: dict[str, Future], connect_timeout: float
                         ) -> tuple[str | None, dict[str, dict[str, Outcome]]]:
    """From every host, ssh BatchMode to every other host (mpirun's path from
    wherever it is started, and tree spawn's onward calls), each host as soon
    as it is connected: (the first host, {a: {b: Outcome}}). The
    first host hops to all at once; the others ``PARALLEL`` at a time, each
    starting with the host after it, so no host gets more connections at once
    than sshd's ``MaxStartups`` takes."""
    if len(hosts) < 2:
        return None, {}

    def hops_from(i: int) -> dict[str, Outcome] | None:
        source = hosts[i]
        if not links[source.name].result().ok:
            return None
        if i == 0:
            return run_hops(runner, source, hosts[1:], connect_timeout)
        return run_hops(runner, source, hosts[i + 1:] + hosts[:i], connect_timeout, parallel=PARALLEL)

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        results = list(pool.map(hops_from, range(len(hosts))))
    return hosts[0].name, {h.name: r for h, r in zip(hosts, results, strict=True) if r is not None}
