"""``mlxcluster doctor``: find every cluster problem before a job hangs.

    mlxcluster doctor                                 # live, the default inventory (./cluster.yaml...)
    mlxcluster doctor -i cluster.yaml                 # live, every host in parallel
    mlxcluster doctor -i cluster.yaml --json          # machine-readable
    mlxcluster doctor -i cluster.yaml --collect DIR   # also save raw outputs per host
    mlxcluster doctor --from DIR [-i cluster.yaml]    # replay a saved folder
    mlxcluster doctor ... --html report.html          # also write the HTML page (docs/report.md)

    mlxcluster doctor -i cluster.yaml --fix           # the plan of fixes, a yes, applied, checked again
    mlxcluster doctor -i cluster.yaml --fix --dry-run # the plan only
    mlxcluster doctor -i cluster.yaml --fix --html fixed.html  # and a page of what it fixed
    mlxcluster doctor -i cluster.yaml --imports mlx_lm  # also what a run -m mlx_lm job needs (--fix installs it)
    mlxcluster doctor -i cluster.yaml --model DIR     # will serve split DIR over the hosts and fit? (--fix: wired limit)
    mlxcluster doctor --undo ~/.config/mlxcluster/fixes/TIME.json
    mlxcluster doctor -i cluster.yaml --shared-path /Volumes/nas/runs  # which hosts see one folder there

Exit codes: 0 nothing failed, 1 a check failed (or warned, with --strict, or
the --collect folder could not be written), 2 usage, inventory, hostfile or
--collect folder error (checked before any host is probed). With --fix: 0
only when every planned fix worked, the checks it was for pass and nothing
fails after; 1 otherwise (also a --dry-run or a "no" with a plan that is not
empty); 2 a bad flag combination, --fix with no terminal to ask on and no
--yes, or an inventory or journal folder that cannot be written (before any
host is changed). --undo: 0 every recorded change undone, 1 one was not, 2
not a journal. --shared-path: 0 every host answered, 1 one could not be asked.
"""

from __future__ import annotations

import json

import click
from tabulate import tabulate

from mlxcluster.cli import doctor_fix
from mlxcluster.cli.doctor_fix import run_fix, run_undo
from mlxcluster.cli.params import LocalMeansHere, Seconds, inventory_option
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.checks.mpi import mpi_available
from mlxcluster.doctor.doctor import BACKENDS, DoctorReport
from mlxcluster.doctor.request import doctor_request, examine, request_inventory
from mlxcluster.doctor.shared_path import HERE, SharedPathReport, look_over_ssh
from mlxcluster.errors import EXIT_FAILED, EXIT_OK
from mlxcluster.facts.capture import save_capture_dir
from mlxcluster.facts.facts import HostFacts
from mlxcluster.report import Report
from mlxcluster.topology.topology import build_topology

MARKS = {
    Status.PASS: ("[✓]", "green"),
    Status.WARN: ("[!]", "yellow"),
    Status.FAIL: ("[✗]", "red"),
    Status.CRASH: ("[✗]", "red"),
    Status.SKIP: ("[-]", None),
}


def run_shared_path(inventory, path: str, as_json: bool, connect_timeout: float,
                    accept_new_host_keys: bool) -> int:
    """``--shared-path DIR``: the look (mlxcluster/doctor/shared_path.py), rendered; the exit code."""
    report = look_over_ssh(inventory, path, connect_timeout=connect_timeout,
                           accept_new_host_keys=accept_new_host_keys)
    hosts_failed = [h for h in report.failed if h != HERE]
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line, colour in render_shared_path(report, len(inventory.hosts)):
            click.secho(line, fg=colour, bold=colour is not None and line[:1] in "✓!✗")
    return EXIT_FAILED if hosts_failed else EXIT_OK


def render_shared_path(report: SharedPathReport, n_hosts: int) -> list[tuple[str, str | None]]:
    """Lines (text, colour): one per folder, one per host not asked, the verdict."""
    lines: list[tuple[str, str | None]] = [
        (f"mlxcluster doctor: which hosts see the same {report.path} ({n_hosts} hosts"
         f"{' and ' + HERE if any(HERE in f for f in report.folders) else ''}, a token each, "
         f"{report.seconds:.1f} s)", None), ("", None)]
    for names in report.folders:
        if len(names) > 1:
            lines.append((f"[✓] one folder: {', '.join(names)}", "green"))
            lines.append(("    shared storage: train's --out there is written once, by the lowest "
                          "rank among them; --data and --init_from there are not sent to them", None))
        else:
            lines.append((f"[✓] its own folder: {names[0]}", "green"))
    for name, why in report.failed.items():
        mark, colour = ("[!]", "yellow") if name == HERE else ("[✗]", "red")
        lines.append((f"{mark} {name}: not asked: {why}", colour))
    lines.append(("", None))
    shared = report.shared()
    if shared:
        verdict = "; ".join(f"{', '.join(f)} see one {report.path}" for f in shared)
        lines.append((f"✓ shared storage: {verdict}", "green"))
    else:
        lines.append((f"✓ no shared storage: each host has its own {report.path}", "green"))
    if any(h != HERE for h in report.failed):
        lines[-1] = (f"✗ {len([h for h in report.failed if h != HERE])} host(s) could not be asked; "
                     + lines[-1][0][2:], "red")
    return lines


def exit_code(report: DoctorReport, strict: bool) -> int:
    """0 when nothing failed; 1 on a failure (or a warning with --strict)."""
    if report.failed() or (strict and report.warned()):
        return EXIT_FAILED
    return EXIT_OK


def render_check(result: CheckResult, verbose: bool) -> list[tuple[str, str | None]]:
    """Lines (text, colour) for one check: mark + title, evidence, fix."""
    mark, colour = MARKS[result.status]
    title = result.title + (" (crashed)" if result.status is Status.CRASH else "")
    lines: list[tuple[str, str | None]] = [(f"{mark} {title}  [{result.id}]", colour)]
    if result.status is Status.SKIP:
        if result.hint:
            lines.append((f"    skipped: {result.hint}", None))
        if verbose:
            lines += [(f"    {host}: {text}", None) for host, text in result.hosts.items()]
        return lines
    if result.status is not Status.PASS or verbose:
        lines += [(f"    {host}: {text}", None) for host, text in result.hosts.items()]
    if result.hint and result.status is not Status.PASS:
        lines.append((f"    fix: {result.hint}", colour))
    return lines


def launchable_backends(f: HostFacts) -> dict[str, bool | None]:
    """The backends as mlxcluster launches them: mpi counts with the
    MLX_MPI_LIBNAME mlxcluster sets (as the backends check judges it)."""
    return {**f.backends, "mpi": mpi_available(f)} if f.backends else {}


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.0f} GiB" if value else "?"


def facts_table(facts: dict[str, HostFacts]) -> str:
    """The host facts table shown under the checks."""
    rows = []
    for name, f in facts.items():
        rows.append([
            name, f.hostname or "?", " ".join(x for x in (f.os_name, f.os_version, f.os_build) if x) or "?",
            f.model or f.chip or "?", _gib(f.memory_bytes), f.python_version or "?", f.mlx_version or "-",
            ",".join(b for b, ok in launchable_backends(f).items() if ok) or "-",
            f.mpirun_version or "-",
        ])
    return tabulate(rows, headers=["host", "hostname", "os", "model", "memory", "python", "mlx",
                                   "backends", "open mpi"])


def verdict_line(report: DoctorReport) -> tuple[str, str]:
    failed, warned = report.failed(), report.warned()
    if failed:
        return (f"✗ {len(failed)} check(s) failed: {', '.join(r.id for r in failed)}"
                + (f"; {len(warned)} warning(s)" if warned else ""), "red")
    if warned:
        return f"! no failures, {len(warned)} warning(s): {', '.join(r.id for r in warned)}", "yellow"
    return "✓ no issues found", "green"


def ignored_text(ignored: dict[str, str]) -> str:
    """'__MACOSX/ (macOS archive metadata), notes/ (no capture file)'."""
    return ", ".join(f"{name}/ ({why})" for name, why in ignored.items())


def render(report: DoctorReport, verbose: bool) -> None:
    where = "live" if report.live else ("this machine" if report.cluster == "local" else "replay")
    click.echo(f"mlxcluster doctor: {report.cluster or 'captures'} ({len(report.captures)} hosts, {where}, "
               f"{report.seconds:.1f} s)")
    ignored = report.extra.get("ignored")
    if ignored:
        click.echo(f"ignored (not hosts): {ignored_text(ignored)}")
    click.echo("")
    skipped = [r for r in report.results if r.status is Status.SKIP]
    for result in report.results:
        if result.status is Status.SKIP and not verbose:
            continue  # what could not run here says nothing about the cluster: counted below
        for text, colour in render_check(result, verbose):
            click.secho(text, fg=colour)
    if skipped and not verbose:
        click.echo(f"[-] {len(skipped)} check(s) skipped: not needed or not possible here "
                   "(-v lists each and why)")
    click.echo("")
    click.echo(facts_table(report.facts))
    click.echo("")
    text, colour = verdict_line(report)
    click.secho(text, fg=colour, bold=True)


@click.command("doctor", cls=LocalMeansHere)
@inventory_option("Inventory YAML (default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                  "~/.config/mlxcluster/cluster.yaml; with --from only when given).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report only.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--collect", "collect_dir", type=click.Path(file_okay=False),
              help="Save every raw output as DIR/<host>/<file>.")
@click.option("--from", "from_dir", type=click.Path(file_okay=False),
              help="Replay a folder written by --collect (no live host needed).")
@click.option("--local", "local", is_flag=True,
              help="Check this machine, where --local N ranks run (N may be given, as to train); no SSH.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Trust unknown host keys on first use and save them to known_hosts.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="The backend you will launch with (default: ring, what mlx.launch uses).")
@click.option("--connect-timeout", type=Seconds(0.5, 120), default=5.0, show_default=True,
              help="Seconds to wait for each SSH connection.")
@click.option("--no-data-path", is_flag=True, help="Skip the TCP data-path test.")
@click.option("--hostfile", "hostfile", type=click.Path(dir_okay=False),
              help="The hostfile you launch with: compared with the live cabling.")
@click.option("-v", "--verbose", is_flag=True, help="Show evidence for passing checks too.")
@click.option("--fix", is_flag=True,
              help="After the checks, plan the fixes of what failed or warned, ask, apply, check again.")
@click.option("--dry-run", is_flag=True, help="With --fix: print the plan only.")
@click.option("--yes", is_flag=True, help="With --fix: apply the plan without asking.")
@click.option("--fix-timeout", type=Seconds(1, 3600), default=60.0, show_default=True,
              help="Seconds each fix's command may take on a host.")
@click.option("--mlx-version", "mlx_version", metavar="X",
              help="With --fix: the mlx every host gets where versions differ (default: most hosts' one; "
                   "a tie: this machine's, else the newest).")
@click.option("--train-data", "train_data", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="The --data folder you will train on: also check what its ranks import for it "
                   "(tokenizers, for data tokenized with a tokenizer.json); --fix installs it.")
@click.option("--imports", "imports", multiple=True, metavar="MODULE",
              help="What your job's ranks import (repeatable): mlx_lm, for run -m mlx_lm ..., also checks "
                   "mlx-lm is installed, one version everywhere; --fix installs it.")
@click.option("--model", "model", type=click.Path(file_okay=False), metavar="DIR",
              help="A model folder to serve: check that it splits over the hosts (one rank each) and fits "
                   "each host's memory and GPU wired limit, as serve does; --fix raises a Mac's wired limit.")
@click.option("--pipeline", is_flag=True, help="With --model: judge mlx-lm's --pipeline split (whole layers "
                                                "per rank) instead of tensor parallelism.")
@click.option("--undo", "undo_path", type=click.Path(dir_okay=False),
              help="Undo what a --fix run changed (its journal, ~/.config/mlxcluster/fixes/TIME.json).")
@click.option("--shared-path", "shared_path", metavar="DIR",
              help="Only say which hosts (and this machine) see the same DIR, e.g. a NAS where "
                   "train's --out goes: a token written by each, looked for by the others.")
@html_option("the report")
def command(**flags):
    """Check every host of the cluster and say how to fix what is wrong."""
    request = doctor_request(data_modules=train_data_modules, can_ask=doctor_fix.can_ask(), **flags)
    ctx = click.get_current_context()
    if request.mode == "undo":
        ctx.exit(run_undo(request.undo_path, request.connect_timeout))
    inventory = request_inventory(request, note=lambda text: click.echo(text, err=True))
    if request.mode == "shared-path":
        ctx.exit(run_shared_path(inventory, request.shared_path, request.as_json,
                                 request.connect_timeout, request.accept_new_host_keys))
    check_html_path(request.html_path)
    if request.mode == "fix":
        ctx.exit(run_fix(inventory, request, render=render))
    report = examine(request, inventory)
    if request.as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=False))
    else:
        render(report, request.verbose)
    if request.html_path:
        emit_page(Report(doctor=report, topology=build_topology(report.captures)), request.html_path,
                  err=request.as_json)
    if request.collect_dir:
        # After the report is printed: a failed write (an error, exit 1) does not lose it.
        save_capture_dir(report.captures, request.collect_dir)
        if not request.as_json:
            click.echo(f"raw outputs saved under {request.collect_dir}/<host>/")
    ctx.exit(exit_code(report, request.strict))


def train_data_modules(data: str) -> tuple[str, ...]:
    """What the ranks import for --train-data DIR (the trainer hand-off's
    rule; its config module imports mlx: only when asked)."""
    from mlxcluster.launch.trainer import data_modules

    return data_modules(data)
