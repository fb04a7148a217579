"""``mlxcluster discover``: find Macs with Bonjour, probe them, write an inventory.

    mlxcluster discover                              # browse 3 s, probe over SSH, print a table
    mlxcluster discover --write cluster.yaml         # ... and write an inventory
    mlxcluster discover --interface 192.168.1.20     # browse from one local address only
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from tabulate import tabulate

from mlxcluster.discover import browse, discovered_inventory, inventory_yaml
from mlxcluster.doctor_collect import collect_captures
from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.facts import host_facts


@click.command("discover")
@click.option("--timeout", type=click.FloatRange(0.5, 60), default=3.0, show_default=True,
              help="Seconds to listen for Bonjour answers.")
@click.option("--interface", "interfaces", multiple=True, metavar="IP",
              help="Local IPv4 address to browse from (repeatable; default: all interfaces).")
@click.option("--python", default=sys.executable, show_default=True,
              help="The python path to probe with and to write (the same on every host).")
@click.option("--user", default=None, help="SSH user for the inventory (default: ssh config / login).")
@click.option("--cluster", default="discovered", show_default=True, help="Cluster name to write.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
              help="OpenSSH config for the probe and the inventory.")
@click.option("--no-probe", is_flag=True, help="Only list what answered; do not SSH to it.")
@click.option("--accept-new-host-keys", is_flag=True, help="Trust unknown host keys on first use.")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), default=None,
              help="Write an inventory YAML of the hosts that announce SSH.")
@click.option("--force", is_flag=True, help="Overwrite --write FILE if it exists.")
def command(timeout, interfaces, python, user, cluster, ssh_config, no_probe, accept_new_host_keys,
            write_path, force):
    """Find Macs on the local network (Bonjour _ssh._tcp / _device-info._tcp)."""
    if write_path and Path(write_path).exists() and not force:
        raise InputError(f"{write_path} exists", "pass --force to overwrite it, or another path")
    hosts = browse(timeout, list(interfaces) or None)
    if not hosts:
        raise MlxclusterError("no host answered on Bonjour within "
                              f"{timeout:.0f} s", "turn on Remote Login (System Settings > General > "
                              "Sharing) on each Mac, be on the same network, or raise --timeout")
    with_ssh = [h for h in hosts if h.target and h.ssh_port]
    facts, errors = {}, {}
    if with_ssh and not no_probe:
        inventory = discovered_inventory(with_ssh, cluster=cluster, python=python, user=user,
                                         ssh_config=ssh_config)
        captures = collect_captures(inventory, accept_new_host_keys=accept_new_host_keys)
        by_target = {h.ssh: h.name for h in inventory.hosts}
        for h in with_ssh:
            capture = captures.get(by_target.get(h.target, ""))
            if capture is None:
                continue
            facts[h.instance] = host_facts(capture)
            if capture.error:
                errors[h.instance] = capture.error
    rows = []
    for h in hosts:
        f = facts.get(h.instance)
        if not h.ssh_port:
            status = "no SSH announced"
        elif no_probe:
            status = "not probed"
        elif h.instance in errors:
            status = "✗ " + errors[h.instance]
        else:
            status = "ok"
        rows.append([h.name, h.target or "-", h.model or "-", f.hostname if f else "-",
                     " ".join(x for x in ((f.os_name, f.os_version) if f else ()) if x) or "-",
                     (f.mlx_version if f else None) or "-", status])
    click.echo(tabulate(rows, headers=["name", "address", "model", "hostname", "os", "mlx", "ssh"]))
    if write_path:
        if not with_ssh:
            raise MlxclusterError("no host announces SSH: nothing to write",
                                  "turn on Remote Login on the Macs you want in the cluster")
        text = inventory_yaml(with_ssh, cluster=cluster, python=python, user=user, ssh_config=ssh_config)
        Path(write_path).write_text(text, encoding="utf-8")
        click.echo(f"wrote {write_path} ({len(with_ssh)} hosts); check it with: "
                   f"mlxcluster doctor -i {write_path}")
