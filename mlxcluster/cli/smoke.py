"""``mlxcluster smoke``: prove a backend moves correct data between every rank,
measure how fast, and never hang.

    mlxcluster smoke --backend ring --local 3
    mlxcluster smoke --backend mpi -i cluster.yaml --bench --sizes 1K:256M --plot bw.png
    mlxcluster smoke -i cluster.yaml            # every backend, one row each
    mlxcluster smoke --backend ring             # the default inventory (./cluster.yaml...)
    mlxcluster smoke --backend ring -i cluster.yaml --soak 2h   # stays up, stays right

Exit codes: 0 every rank of every backend that ran passed; 1 a rank failed,
exited or gave a wrong result; 2 bad input; 3 the backend asked for cannot
run here; 4 stalled (a rank made no progress within its deadline: per phase,
a soak's per iteration; see smoke.run.exit_code_for); 128 + signal
interrupted (a soak prints its summary so far first).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click
from tabulate import tabulate

from mlxcluster.cli.params import Duration, LocalMeansHere, inventory_option, load_chosen_inventory
from mlxcluster.cli.report import check_html_path, emit_page, html_option
from mlxcluster.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STALLED,
    EXIT_UNAVAILABLE,
    InputError,
    Interrupted,
    MlxclusterError,
)
from mlxcluster.hostfile.tuned import MAX_CONNECTIONS, apply_tuned, read_tuned, split_words
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.jobs.connections import shared_hosts
from mlxcluster.jobs.hosts import (
    RankHost,
    hosts_from_hostfile,
    hosts_from_inventory,
    local_hosts,
    require_local_pythons,
)
from mlxcluster.report import Report
from mlxcluster.smoke.jaccl import run_jaccl
from mlxcluster.smoke.launch import BACKENDS, WorkerOptions
from mlxcluster.smoke.report import check_plot_path, reports_to_dict, write_plot
from mlxcluster.smoke.run import SmokeReport, exit_code_for, run_backend
from mlxcluster.smoke.soak import SoakSummary, new_seed
from mlxcluster.smoke.stats import format_bytes, parse_size_range

# The last line of a text run, one per exit code exit_code_for gives (docs/smoke.md).
VERDICTS = {EXIT_OK: "smoke passed", EXIT_FAILED: "smoke FAILED",
            EXIT_UNAVAILABLE: "backend unavailable",
            EXIT_STALLED: "smoke STALLED: a rank made no progress within the deadline"}

DTYPE_CHOICES = ("float32", "float16", "bfloat16", "int32")
MARK = {"passed": "✓", "failed": "✗", "unavailable": "-"}


def inventory_hosts(inventory: Inventory, python: str | None) -> tuple[RankHost, ...]:
    """One rank per inventory host; --python overrides the inventory's."""
    hosts = hosts_from_inventory(inventory)
    return tuple(replace(h, python=python) for h in hosts) if python else hosts


def parse_dtypes(text: str) -> tuple[str, ...]:
    dtypes = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in dtypes if d not in DTYPE_CHOICES]
    if bad or not dtypes:
        raise InputError(f"unknown dtype(s) {', '.join(bad) or '(none)'}",
                         f"choose from {','.join(DTYPE_CHOICES)}")
    return dtypes


def render_summary(reports: list[SmokeReport]) -> str:
    rows = []
    for r in reports:
        ranks = f"{sum(o.status == 'passed' for o in r.ranks)}/{len(r.ranks)}" if r.ranks else "-"
        passed = f"{r.soak.iterations} soak iterations" if r.soak else f"{r.checks} checks"
        detail = r.reason if r.status != "passed" else passed
        if r.status == "unavailable":
            detail = f"unavailable: {r.reason}"
        rows.append([f"{MARK.get(r.status, '?')} {r.backend}", r.status, ranks,
                     f"{r.duration_s:.1f}s" if r.duration_s else "-", detail])
    return tabulate(rows, headers=["backend", "status", "ranks ok", "time", "detail"])


def render_failures(report: SmokeReport) -> str:
    lines = []
    for o in report.failed_ranks:
        lines.append(f"  rank {o.rank} on {o.host}: {o.status}: {o.detail}")
        if o.stderr_tail and o.status != "stopped":
            lines.append("    stderr (tail):")
            lines += [f"      {line}" for line in o.stderr_tail.splitlines()[-12:]]
    # Messages whose cause is known (docs/errors.md): cause and fix under the failure.
    lines += [f"  known error: {d.text()}" for d in report.known_errors()]
    if report.stall:
        lines.append(f"  stalled: {report.stall}")
        lines.append(f"  every rank's state and Python stacks: {report.stall_dir or 'could not be saved'}")
    for problem in report.cleanup_problems:
        lines.append(f"  cleanup: {problem} (processes and files of run {report.run_id} may be left there)")
    return "\n".join(lines)


def render_unavailable(report: SmokeReport) -> str:
    lines = [f"{report.backend} unavailable:"]
    lines += [f"  {host}: {why}" for host, why in report.host_reasons.items()]
    return "\n".join(lines + ([f"fix: {report.hint}"] if report.hint else []))


def render_bench(report: SmokeReport) -> str:
    rows = [[b.op, format_bytes(b.bytes), f"{b.p50_s * 1e6:.1f}", f"{b.p90_s * 1e6:.1f}",
             f"{b.algbw_gbps:.3g}", f"{b.busbw_gbps:.3g}"] for b in report.bench]
    table = tabulate(rows, headers=["op", "bytes", "p50 us", "p90 us", "algbw GB/s", "busbw GB/s"], disable_numparse=True,
                     colalign=("left", "right", "right", "right", "right", "right"))
    fits = tabulate([[f.op, f"{f.alpha_s * 1e6:.1f}",
                      f"{f.beta_gbps:.3g}" if f.beta_gbps else "-"] for f in report.fits],
                    headers=["op", "alpha (latency) us", "beta (bandwidth) GB/s"], disable_numparse=True)
    return f"{report.backend} benchmark ({len(report.ranks)} ranks, time = slowest rank):\n{table}\n\n{fits}"


def render_soak(backend: str, soak: SoakSummary) -> str:
    """The soak's summary: per op the iterations and the slowest one, then
    any wrong result; the seed that replays the same sizes."""
    rows = [[o.op, o.iterations, format_bytes(o.slowest_bytes), f"{o.slowest_s:.4f}", o.slowest_rank]
            for o in soak.ops]
    table = tabulate(rows, headers=["op", "iterations", "slowest at (bytes)", "slowest s", "on rank"],
                     disable_numparse=True, colalign=("left", "right", "right", "right", "right"))
    lines = [f"{backend} soak: {soak.elapsed_s:.0f} s of {soak.duration_s:.0f} s, "
             f"{soak.iterations} iterations, seed {soak.seed} (replay: --soak "
             f"{soak.duration_s:g}s --seed {soak.seed})", table]
    for w in soak.wrong:
        source = f" from rank {w.peer}" if w.peer is not None else ""
        lines.append(f"wrong result: rank {w.rank}, {w.op} {w.dtype} size {w.size} "
                     f"({format_bytes(w.bytes)}){source}: first bad index {w.bad_index}, "
                     f"got {w.got}, expected {w.expected}")
    return "\n".join(lines)


def soak_progress_line(backend: str, soak: SoakSummary) -> str:
    """A heartbeat while a soak runs: how far, how many iterations per op."""
    counts = ", ".join(f"{o.op} {o.iterations}" for o in soak.ops) or "starting"
    return f"soak {backend}: {soak.elapsed_s:.0f}/{soak.duration_s:.0f} s, {counts}"


@click.command("smoke", cls=LocalMeansHere, runs_ranks=True)
@click.option("--backend", type=click.Choice([*BACKENDS, "any"]), default=None,
              help="Backend to test; 'any' or none tries every backend the hosts support.")
@click.option("--hostfile", type=click.Path(dir_okay=False), help="MLX JSON hostfile.")
@inventory_option("Cluster inventory (YAML). Used when no --hostfile or --local is given; default: "
                  "$MLXCLUSTER_INVENTORY, else ./cluster.yaml, else ~/.config/mlxcluster/cluster.yaml.")
@click.option("--local", "local_n", type=click.IntRange(2, 64), metavar="[N]",
              help="Run N ranks on this machine (--local alone: 2).")
@click.option("--python", help="Python on the hosts (default: the inventory's, else this one).")
@click.option("--bench", is_flag=True, help="Also time every op at power-of-two sizes.")
@click.option("--sizes", default="1K:16M", show_default=True,
              help="LO:HI bytes: the benchmark sweep, and the correctness sizes (1 element, "
                   "one near LO, one above HI).")
@click.option("--dtypes", default=",".join(DTYPE_CHOICES), show_default=True)
@click.option("--phase-timeout", "timeout_s", type=Duration(1, 3600), default=60.0, show_default=True,
              help="Per-phase deadline (init, correctness, bench; a soak: per iteration): "
                   "60, 90s, 2m. (--timeout, on train, run and serve, bounds a whole run.)")
@click.option("--connections-per-ip", type=click.IntRange(1, MAX_CONNECTIONS), default=None,
              help="ring: mlx.launch --connections-per-ip (default: the --hostfile's .args, as "
                   "'mlxcluster tune' wrote it, else 1).")
@click.option("--mpi-arg", "mpi_args", multiple=True, metavar="ARG",
              help="mpi: extra mpirun argument (repeatable; use --mpi-arg=--flag).")
@click.option("--soak", "soak_s", type=Duration(1, 7 * 86400), default=None,
              help="Instead of the fixed checks: all_sum / all_gather / send-recv again and "
                   "again at random sizes within --sizes for this long (60s, 30m, 2h), every "
                   "result checked, --phase-timeout per iteration.")
@click.option("--seed", type=click.IntRange(0), default=None,
              help="The soak's random sizes (default: a new one, printed; give it to replay).")
@click.option("--stall-dir", type=click.Path(file_okay=False), default="runs", show_default=True,
              help="Where a hang's report goes: DIR/stall-RUN_ID/, every rank's state and "
                   "stacks (created when missing; run keeps its logs in runs/ too).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (docs/smoke.md).")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG of busbw and latency (or .pdf, .svg: the file's extension).")
@html_option("the results (and the benchmark plots)")
def command(backend, hostfile, inventory_path, local_n, python, bench, sizes, dtypes, timeout_s,
            connections_per_ip, mpi_args, soak_s, seed, stall_dir, as_json, plot, html_path):
    """Run all_sum / all_gather / send-recv smoke tests per backend."""
    sources = [s for s in (hostfile, inventory_path, local_n) if s]
    if len(sources) > 1:
        raise InputError("give one of --hostfile, -i/--inventory, --local N, not several",
                         "with none of them smoke uses the default inventory (./cluster.yaml...)")
    if plot and not bench:
        raise InputError("--plot draws the benchmark", "add --bench")
    if soak_s and bench:
        raise InputError("--soak and --bench are two runs", "run the benchmark and the soak apart")
    if seed is not None and not soak_s:
        raise InputError("--seed chooses a soak's sizes", "add --soak DURATION (e.g. --soak 10m)")
    if plot:
        check_plot_path(plot)
    check_html_path(html_path)
    lo, hi = parse_size_range(sizes)
    if soak_s and seed is None:
        seed = new_seed()
    file_backend = ""
    inventory = None
    if local_n:
        hosts = local_hosts(local_n, python)
    elif hostfile:
        hosts, file_backend = hosts_from_hostfile(hostfile, python)
    else:  # -i, else the default inventory
        inventory = load_chosen_inventory(inventory_path, other_sources="--hostfile FILE or --local N")
        hosts = inventory_hosts(inventory, python)
    if len(hosts) < 2:
        raise InputError(f"smoke needs at least 2 hosts, got {len(hosts)}",
                         "MLX's backends do not start a group of one; list more hosts")
    require_local_pythons(hosts)
    # One ssh login per host for every backend tried (jobs.connections), until the command ends.
    hosts = click.get_current_context().with_resource(shared_hosts(hosts))
    if backend is None and file_backend:
        if file_backend not in BACKENDS:  # e.g. jaccl-ring: do not quietly try every backend
            raise InputError(
                f"hostfile {hostfile} is for the {file_backend} backend, which smoke does not "
                f"test (it tests {', '.join(BACKENDS)})",
                "pass --backend: ring or mpi to test these hosts over TCP, or jaccl with a "
                "full-mesh hostfile (mlxcluster hostfile generate --backend jaccl)")
        backend = file_backend
    single = backend not in (None, "any")
    backends = [backend] if single else list(BACKENDS)
    tuned = read_tuned(hostfile)
    applied = {name: apply_tuned(tuned, name, connections_per_ip, tuple(mpi_args)) for name in backends}
    for note in dict.fromkeys(n for a in applied.values() for n in a.notes):
        click.echo(note, err=True)

    opts = WorkerOptions(dtypes=parse_dtypes(dtypes), lo_bytes=lo, hi_bytes=hi, bench=bench,
                         soak_s=soak_s or 0.0, seed=seed or 0)
    reports = []
    for name in backends:
        if soak_s:  # on stderr with --json too: the seed replays a failure, the lines are heartbeats
            click.echo(f"smoke {name}: {len(hosts)} rank(s), soak {soak_s:g} s, seed {seed} ...",
                       err=True)
        elif not as_json:
            click.echo(f"smoke {name}: {len(hosts)} rank(s) ...", err=True)
        try:
            if name == "jaccl" and inventory is not None:  # the RDMA matrix comes from the live topology
                reports.append(run_jaccl(inventory, hosts, opts, timeout_s))
            else:
                reports.append(run_backend(
                    name, hosts, replace(opts, connections_per_ip=applied[name].connections_per_ip),
                    timeout_s, mpi_args=split_words(applied[name].mpi_args),
                    stall_root=Path(stall_dir),
                    on_soak_progress=lambda s, name=name: click.echo(soak_progress_line(name, s),
                                                                     err=True)))
        except Interrupted as stop:
            if isinstance(stop.partial, SoakSummary):  # what the soak proved until the signal
                click.echo(json.dumps({"backend": name, "interrupted": True,
                                       "soak": stop.partial.to_dict()}, indent=2) if as_json
                           else render_soak(name, stop.partial))
            raise
    code = exit_code_for(reports, single)
    plot_error = None
    if plot:
        try:
            write_plot(reports, plot)
        except MlxclusterError as err:  # the results are still printed, this after them
            plot_error = err
    exit_with = (code or EXIT_FAILED) if plot_error else code

    if as_json:
        click.echo(json.dumps(reports_to_dict(reports, exit_with,
                                              plot_error and plot_error.message), indent=2))
    else:
        click.echo(render_summary(reports))
        for r in reports:
            if r.status == "unavailable" and r.host_reasons:
                click.echo("\n" + render_unavailable(r))
            if r.status == "failed":
                click.echo(f"\n{r.backend} failed (run {r.run_id}):")
                click.echo(render_failures(r))
            if r.bench:
                click.echo("\n" + render_bench(r))
            if r.soak:
                click.echo("\n" + render_soak(r.backend, r.soak))
        click.echo(f"\n{VERDICTS[code]}")
    if html_path:
        emit_page(Report(smoke=reports_to_dict(reports, exit_with, plot_error and plot_error.message)),
                  html_path, err=as_json)
    sys.stdout.flush()
    if plot_error:
        click.secho(f"error: {plot_error.message}", fg="red", err=True)
        if plot_error.hint:
            click.echo(f"fix: {plot_error.hint}", err=True)
    click.get_current_context().exit(exit_with)
