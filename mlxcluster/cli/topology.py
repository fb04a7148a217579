"""``mlxcluster topology``: the Thunderbolt cabling of the cluster."""

from __future__ import annotations

import json

import click

from mlxcluster.cli.doctor import ignored_text
from mlxcluster.cli.params import inventory_option, load_chosen_inventory
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.errors import InputError
from mlxcluster.facts.capture import read_capture_dir
from mlxcluster.facts.collect import collect_captures
from mlxcluster.report import Report
from mlxcluster.topology.topology import Topology, build_topology, unreadable_files
from mlxcluster.topology.topology_dot import check_png_output, render_png, to_dot


def render_text(t: Topology) -> str:
    """Human-readable report: ports per host, cables, matrix, ring, mesh."""
    out = []
    for name, host in t.hosts.items():
        bridge = {True: "HOLDS Thunderbolt ports", False: "clear", None: "unknown"}[
            host.bridge_holds_thunderbolt]
        rdma = ", ".join(host.rdma_devices) or "none"
        out.append(f"{name}  (thunderbolt: {host.state}; rdma: {rdma}; bridge0: {bridge})")
        for p in host.ports:
            speed = f"{p.speed_gbps:g} Gb/s" if p.speed_gbps is not None else "-"
            what = ""
            if p.peer:
                what = f"-> {p.peer.name} ({p.peer.model or '?'})"
                if p.via:
                    what += f" via {', '.join(p.via)}"
            others = [d for d in p.devices if d not in p.via]
            if others:
                what += (" " if what else "") + f"[{', '.join(others)}]"
            state = "connected" if p.connected else "empty"
            # What JACCL needs of the port, where captured: an IPv4 address, a PORT_ACTIVE device.
            ipv4 = host.port_ipv4(p)
            if p.connected and ipv4 is not None:
                what += f"  ipv4: {', '.join(ipv4) or 'none'}"
            active = host.rdma_active.get(f"rdma_{p.interface}") if p.interface else None
            if p.connected and active is not None:
                what += f"  rdma_{p.interface}: {'PORT_ACTIVE' if active else 'PORT_DOWN'}"
            out.append(f"  receptacle {p.receptacle if p.receptacle is not None else '?'}"
                       f"  {p.interface or '?':<6} {state:<9} {speed:<9} {what}".rstrip())
    out.append("")
    out.append("cables:" if t.links else "cables: none found between these hosts")
    for lk in t.links:
        speed = f"{lk.speed_gbps:g} Gb/s" if lk.speed_gbps is not None else "? Gb/s"
        out.append(f"  {lk.a} {lk.a_interface or '?'} <-> {lk.b} {lk.b_interface or '?'}"
                   f"  {speed}  ({lk.matched_by})")
    names = t.names()
    width = max(len(n) for n in names)
    out.append("")
    out.append("cables between hosts:")
    out.append("  " + " " * width + "  " + "  ".join(f"{n:>{width}}" for n in names))
    for n, row in zip(names, t.matrix(), strict=True):
        out.append(f"  {n:>{width}}  " + "  ".join(f"{c:>{width}}" for c in row))
    out.append("")
    out.append("ring: " + (" -> ".join([*t.ring, t.ring[0]]) if t.ring else "none through all hosts"))
    out.append(f"full mesh: {'yes' if t.full_mesh else 'no'}")
    return "\n".join(out)


@click.command("topology")
@inventory_option("Inventory file: probe the hosts live (default: $MLXCLUSTER_INVENTORY, else "
                  "./cluster.yaml, else ~/.config/mlxcluster/cluster.yaml).")
@click.option("--from", "from_dir", type=click.Path(file_okay=False),
              help="Capture directory (DIR/<host>/...), as written by 'doctor --collect'.")
@click.option("--json", "as_json", is_flag=True, help="Print the topology as JSON.")
@click.option("--dot", "as_dot", is_flag=True, help="Print the topology as graphviz DOT.")
@click.option("--png", "png", type=click.Path(dir_okay=False), help="Draw the topology to a PNG file.")
@html_option("the drawing and the cable table")
def command(inventory_path, from_dir, as_json, as_dot, png, html_path):
    """Show the Thunderbolt cabling: ports, cables, ring and mesh."""
    if inventory_path and from_dir:
        raise InputError("give one of -i INVENTORY or --from DIR, not both",
                         "e.g. mlxcluster topology --from captures/")
    if sum(map(bool, (as_json, as_dot, png))) > 1:
        raise InputError("choose one of --json, --dot, --png")
    if png:
        check_png_output(png)  # before any host is probed
    check_html_path(html_path)
    if from_dir:
        folder = read_capture_dir(from_dir)
        captures = folder.captures
        if folder.ignored:
            click.echo(f"note: ignored (not hosts): {ignored_text(folder.ignored)}", err=True)
    else:
        captures = collect_captures(load_chosen_inventory(inventory_path, other_sources="--from DIR"))
    t = build_topology(captures)
    if as_json:
        click.echo(json.dumps(t.to_json(), indent=2, sort_keys=False))
    elif as_dot:
        click.echo(to_dot(t), nl=False)
    elif png:
        path = render_png(to_dot(t), png)
        click.echo(f"wrote {path}")
    else:
        click.echo(render_text(t))
    if html_path:
        emit_page(Report(topology=t, title="mlxcluster topology"), html_path, err=as_json or as_dot)
    # A host we could not probe, or whose capture is unreadable, makes every cable to
    # it look missing: say why, fail.
    unreachable = {name: c.error for name, c in captures.items() if c.error}
    for name, error in unreachable.items():
        click.secho(f"error: {name} could not be probed: {error}", fg="red", err=True)
    if unreachable:
        click.echo("fix: run 'mlxcluster doctor -i INVENTORY' to see why", err=True)
    unreadable = unreadable_files(captures)
    for name, problems in unreadable.items():
        for path, why in problems.items():
            click.secho(f"error: {name}: {path} is unreadable ({why}); read as not captured", fg="red", err=True)
    if unreadable:
        click.echo("fix: capture those hosts again (mlxcluster doctor -i INVENTORY --collect NEWDIR), or replace "
                   "the files named with the output of their command", err=True)
    if unreachable or unreadable:
        click.get_current_context().exit(1)
