"""`mlxcluster discover`: find Macs over Bonjour, show them, write an inventory."""

from __future__ import annotations

import sys

import click
from tabulate import tabulate

from mlxcluster.cli.params import Seconds
from mlxcluster.errors import InputError
from mlxcluster.facts.collect import probe_discovered
from mlxcluster.inventory.discovery import browse, probe_ssh, render_inventory
from mlxcluster.inventory.inventory import abs_path_ok, name_ok, parse_inventory, show, user_ok
from mlxcluster.outputs import check_output_paths, write_files


def check_flags(*, write_path: str | None, force: bool, cluster: str, python: str | None,
                python_given: bool, user: str | None) -> None:
    """Every value discover writes into the inventory (or probes with), checked
    before the browse: a bad one is named by its flag, not found afterwards as
    an invalid inventory. ``python`` None: not used, not checked."""
    if not name_ok(cluster):
        raise InputError(f"--cluster {show(cluster)} is not a plain name (letters, digits, '.', '_', '-')",
                         "e.g. --cluster lab")
    if python is not None and not abs_path_ok(python):
        flag = "--python" if python_given else "--python (default: this interpreter)"
        raise InputError(f"{flag} {show(python)} is not an absolute path without spaces or shell characters",
                         "pass the hosts' python, e.g. --python /opt/venv/bin/python")
    if user is not None and not user_ok(user):
        raise InputError(f"--user {show(user)} is not a user name", "e.g. --user me")
    if write_path is not None:
        check_output_paths([write_path], {}, force=force)


@click.command("discover")
@click.option("--timeout", default=3.0, show_default=True, type=Seconds(0.5, 60),
              help="Seconds to listen for Bonjour answers.")
@click.option("--interface", "interfaces", multiple=True, metavar="IP",
              help="Local interface address to browse on (repeatable; default: all).")
@click.option("--write", "write_path", type=click.Path(dir_okay=False),
              help="Write an inventory YAML of the hosts that offer SSH (an existing file only with --force).")
@click.option("--force", is_flag=True, help="With --write: replace an existing file.")
@click.option("--cluster", default="discovered", show_default=True, help="Cluster name for --write.")
@click.option("--python", "python", default=None,
              help="Python path for every host in --write (default: this interpreter).")
@click.option("--user", default=None, help="ssh user for --write.")
@click.option("--ssh-config", "ssh_config", type=click.Path(exists=True, dir_okay=False),
              help="OpenSSH config for --probe (and written into the inventory).")
@click.option("--probe", "deep_probe", is_flag=True,
              help="Also log in (keys only) and run doctor's probe: python, mlx, chip, memory.")
@click.option("--connect-timeout", type=Seconds(0.5, 60), default=5.0, show_default=True)
@click.option("--all", "show_all", is_flag=True, help="List non-Macs too.")
def command(timeout, interfaces, write_path, force, cluster, python, user, ssh_config, deep_probe,
            connect_timeout, show_all):
    """Browse Bonjour for _ssh._tcp and _device-info._tcp and probe what answers."""
    python_given = python is not None
    python = python or sys.executable
    used = write_path is not None or deep_probe or python_given
    check_flags(write_path=write_path, force=force, cluster=cluster, python=python if used else None,
                python_given=python_given, user=user)
    hosts = probe_ssh(browse(timeout=timeout, interfaces=list(interfaces) or None))
    shown = [h for h in hosts if show_all or h.is_mac or h.model is None]
    facts = {}
    if deep_probe and shown:
        facts = probe_discovered(shown, python=python, user=user, ssh_config=ssh_config,
                                 connect_timeout=connect_timeout)
    if not shown:
        click.echo("no hosts answered (are the Macs on this network with Remote Login on?)")
    else:
        headers = ["name", "hostname", "addresses", "model", "ssh"]
        rows = [[h.name, h.hostname or "-", ", ".join(h.addresses) or "-", h.model or "?",
                 h.ssh_banner or (f"no: {h.ssh_error}" if h.ssh_error else "-")] for h in shown]
        if deep_probe:
            headers += ["hostname (probe)", "chip", "python", "mlx"]
            for row, h in zip(rows, shown, strict=True):
                f = facts.get(h.name)
                if f is None or not f.probed:
                    row += ["not probed", "-", "-", "-"]
                else:
                    row += [f.hostname or "?", f.chip or "?", f.python_version or "?",
                            f.mlx_version or f"missing ({f.mlx_import_error or 'not importable'})"]
        click.echo(tabulate(rows, headers=headers))
    if write_path:
        text = render_inventory(shown, cluster=cluster, python=python, user=user, ssh_config=ssh_config)
        if "hosts: []" in text:
            raise InputError("no host with SSH was found; nothing to write",
                             "turn on Remote Login (System Settings > General > Sharing) on each Mac")
        parse_inventory(text, source=write_path)  # never write an inventory we cannot load
        write_files({write_path: text})
        click.echo(f"wrote {write_path}")
