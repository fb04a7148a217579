"""``mlxcluster hostfile generate|check``: write and validate hostfiles."""

from __future__ import annotations

import click

from mlxcluster.cli.params import choose_inventory, inventory_option
from mlxcluster.errors import EXIT_FAILED, HostfileError
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.facts.collect import collect_captures
from mlxcluster.hostfile.generation import GenerateRequest
from mlxcluster.hostfile.generation import generate as generate_hostfile
from mlxcluster.hostfile.hostfile import BACKENDS, MlxHostfile, check_against_cluster, load_hostfile
from mlxcluster.hostfile.hostfile_generate import DEFAULT_TCP_LINKS
from mlxcluster.inventory.inventory import load_inventory


@click.group("hostfile")
def command():
    """Generate and check hostfiles for mlx.launch and mpirun."""


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
    chosen = choose_inventory(inventory_path)
    made = generate_hostfile(GenerateRequest(
        str(chosen.path), backend, output, force, from_dir, tuple(envs), tcp_links, if_include,
        mpi_libname, tuple(mpi_args), fmt, script, plan_ips_flag, apply_plan))
    click.echo(made.shown, nl=False)
    for note in made.notes:
        click.echo(f"note: {note}", err=True)
    for warning in made.warnings:
        click.echo(f"warning: {warning}", err=True)
    for host, commands in made.plan_commands:
        click.echo(f"# {host}")
        for line in commands:
            click.echo(line)
    for name in made.applied:
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
