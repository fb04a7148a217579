"""`mlxcluster discover`: find Macs over Bonjour, show them, write an inventory."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from tabulate import tabulate

from mlxcluster.discovery import browse, probe_ssh, render_inventory
from mlxcluster.errors import InputError
from mlxcluster.inventory import parse_inventory


@click.command("discover")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0.5, 60),
              help="Seconds to listen for Bonjour answers.")
@click.option("--interface", "interfaces", multiple=True, metavar="IP",
              help="Local interface address to browse on (repeatable; default: all).")
@click.option("--write", "write_path", type=click.Path(dir_okay=False),
              help="Write an inventory YAML of the hosts that offer SSH.")
@click.option("--cluster", default="discovered", show_default=True, help="Cluster name for --write.")
@click.option("--python", "python", default=None,
              help="Python path for every host in --write (default: this interpreter).")
@click.option("--user", default=None, help="ssh user for --write.")
@click.option("--all", "show_all", is_flag=True, help="List non-Macs too.")
def command(timeout, interfaces, write_path, cluster, python, user, show_all):
    """Browse Bonjour for _ssh._tcp and _device-info._tcp and probe what answers."""
    hosts = probe_ssh(browse(timeout=timeout, interfaces=list(interfaces) or None))
    shown = [h for h in hosts if show_all or h.is_mac or h.model is None]
    if not shown:
        click.echo("no hosts answered (are the Macs on this network with Remote Login on?)")
    else:
        rows = [[h.name, h.hostname or "-", ", ".join(h.addresses) or "-", h.model or "?",
                 h.ssh_banner or (f"no: {h.ssh_error}" if h.ssh_error else "-")] for h in shown]
        click.echo(tabulate(rows, headers=["name", "hostname", "addresses", "model", "ssh"]))
    if write_path:
        text = render_inventory(shown, cluster=cluster, python=python or sys.executable, user=user)
        if "hosts: []" in text:
            raise InputError("no host with SSH was found; nothing to write",
                             "turn on Remote Login (System Settings > General > Sharing) on each Mac")
        parse_inventory(text, source=write_path)  # never write an inventory we cannot load
        Path(write_path).write_text(text)
        click.echo(f"wrote {write_path}")
