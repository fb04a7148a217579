"""``mlxcluster tune``: measure the launcher's tuning flags (ring
connections per IP, MPI btl_tcp_links and allreduce algorithm, the data
interface) instead of guessing them, and write the hostfile with the winner
(docs/tune.md).

    mlxcluster tune                              # ./cluster.yaml, ring and mpi, 32 MiB, 5 minutes
    mlxcluster tune -i cluster.yaml --backend ring --sizes 1M:64M --budget 10m -o hostfile.json

Exit codes: 0 a winner was chosen and written; 1 no candidate passed;
2 bad input.
"""

from __future__ import annotations

import json
from dataclasses import replace

import click
from tabulate import tabulate

from mlxcluster.cli.params import Duration, inventory_option, load_chosen_inventory
from mlxcluster.errors import EXIT_FAILED, EXIT_OK
from mlxcluster.jobs.connections import shared_hosts
from mlxcluster.jobs.hosts import hosts_from_inventory, require_local_pythons
from mlxcluster.outputs import write_files
from mlxcluster.smoke.stats import format_bytes, parse_size_range
from mlxcluster.tune.candidates import (
    MPI_ALLREDUCE,
    MPI_TCP_LINKS,
    RING_CONNECTIONS,
    TUNABLE_BACKENDS,
    parse_allreduce,
    parse_backends,
    parse_counts,
)
from mlxcluster.tune.files import default_output, usage, winner_files
from mlxcluster.tune.measure import Plan
from mlxcluster.tune.result import TuneResult, to_dict
from mlxcluster.tune.run import run_tune, tune_sizes
from mlxcluster.tune.select import Choice


def pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def render_choice(choice: Choice) -> str:
    rows = []
    for s in choice.scores:
        mark = "*" if s.candidate == choice.winner else ("=" if s.candidate in choice.tied else "")
        rows.append([f"{mark} {s.candidate.label}".strip(), f"{s.busbw_gbps:.3g}",
                     f"{s.tcp_gbps:.3g}" if s.tcp_gbps else "-", pct(s.of_tcp),
                     f"{s.p50_s * 1e3:.2f}", f"{s.p90_s * 1e3:.2f}",
                     " ".join(f"{v:.3g}" for v in s.samples)])
    for c, why in choice.failed.items():
        rows.append([f"✗ {c.label}", "-", "-", "-", "-", "-", why[:60]])
    table = tabulate(rows, headers=["candidate", "busbw GB/s", "raw TCP GB/s", "% of TCP",
                                    "p50 ms", "p90 ms", "busbw per round"],
                     disable_numparse=True,
                     colalign=("left", "right", "right", "right", "right", "right", "left"))
    return f"{choice.op} {format_bytes(choice.bytes)}:\n{table}\n{verdict(choice)}"


def verdict(choice: Choice) -> str:
    """One line: the pick, its margin and how sure it is."""
    w = choice.winner
    if choice.confidence == "tie":
        others = ", ".join(c.label for c in choice.tied if c != w)
        best = "" if w == choice.best else f" (best median: {choice.best.label})"
        line = f"tie within noise: {w.label} = {others}{best}; chose {w.label}: the simplest"
    else:
        line = f"winner: {w.label} (confidence {choice.confidence}"
        line += ", one round: no noise estimate)" if choice.confidence == "low" else ")"
    closest = choice.runner_up
    if closest:
        line += f"; next: {closest.text()}"
    return line


def render(result: TuneResult) -> str:
    m = result.measurements
    lines = [f"tune: {len(result.hosts)} hosts ({', '.join(result.hosts)}), "
             f"{len(result.candidates)} candidates, {m.rounds} round(s) in {result.duration_s:.0f} s "
             f"(stopped: {m.stopped_by}; * winner, = tied within noise)", ""]
    for choice in result.choices:
        lines += [render_choice(choice), ""]
    for c, why in m.failed.items():  # the table cuts the reason short: here in full
        lines.append(f"failed, not run again, cannot win: {c.label}: {why}")
    for n, err in m.tcp_errors.items():
        lines.append(f"raw TCP x{n}: {err}")
    if result.decision:
        lines.append(f"decision (all_sum {format_bytes(result.decision.bytes)}): {verdict(result.decision)}")
    else:
        lines.append("no candidate passed: nothing chosen")
    return "\n".join(lines)


@click.command("tune")
@inventory_option()
@click.option("--backend", "backends", default=",".join(TUNABLE_BACKENDS), show_default=True,
              help="Backends to tune, comma-separated (ring, mpi).")
@click.option("--connections", default=",".join(map(str, RING_CONNECTIONS)), show_default=True,
              help="ring: the --connections-per-ip values to try.")
@click.option("--tcp-links", default=",".join(map(str, MPI_TCP_LINKS)), show_default=True,
              help="mpi: the btl_tcp_links values to try.")
@click.option("--mpi-allreduce", default=",".join(MPI_ALLREDUCE), show_default=True,
              help="mpi: Open MPI's allreduce to try: default (its decision rules), ring "
                   "(its ring algorithm, at --tcp-links 1 and 4).")
@click.option("--sizes", default="32M", show_default=True,
              help="LO:HI bytes (powers of two between); 32M is what nn.average_gradients sends.")
@click.option("--budget", "budget_s", type=Duration(1, 24 * 3600), default="5m", show_default=True,
              help="Time for all rounds (90, 90s, 5m, 2h); at least one round always runs.")
@click.option("--rounds", "max_rounds", type=click.IntRange(1, 50), default=5, show_default=True,
              help="At most this many rounds of every candidate.")
@click.option("--iters", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Timed iterations per size in each run (after one warm-up).")
@click.option("--phase-timeout", "timeout_s", type=Duration(1, 3600), default="2m", show_default=True,
              help="Per-phase deadline of each smoke run (a hung candidate fails).")
@click.option("--python", help="Python on the hosts (default: the inventory's).")
@click.option("-o", "--output", default=None,
              help="Hostfile to write with the winner (and OUTPUT.args beside it); "
                   "default hostfile-ring.json / hostfile-mpi.txt; '-' writes nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (docs/tune.md).")
def command(inventory_path, backends, connections, tcp_links, mpi_allreduce, sizes, budget_s, max_rounds, iters,
            timeout_s, python, output, as_json):
    """Measure ring/MPI connection settings and write the fastest."""
    names = parse_backends(backends)
    ring_connections = parse_counts(connections, "--connections")
    mpi_tcp_links = parse_counts(tcp_links, "--tcp-links")
    allreduce = parse_allreduce(mpi_allreduce)
    lo, hi = parse_size_range(sizes)
    inventory = load_chosen_inventory(inventory_path)
    if python:
        inventory = replace(inventory, python=python,
                            hosts=tuple(replace(h, python=python) for h in inventory.hosts))
    hosts = hosts_from_inventory(inventory)
    require_local_pythons(hosts)
    # One ssh login per host for every candidate and stream (jobs.connections), until the command ends.
    hosts = click.get_current_context().with_resource(shared_hosts(hosts))
    plan = Plan(tune_sizes(lo, hi), budget_s, iters=iters, max_rounds=max_rounds, timeout_s=timeout_s)
    progress = None if as_json else (lambda text: click.echo(f"tune {text}", err=True))
    result = run_tune(hosts, names, plan, on_progress=progress, ring_connections=ring_connections,
                      mpi_tcp_links=mpi_tcp_links, mpi_allreduce=allreduce)
    winner = result.winner
    if winner and output != "-":
        path = output or default_output(winner)
        texts = winner_files(inventory, winner, path)
        write_files(texts)
        result.files = list(texts)
    if as_json:
        click.echo(json.dumps(to_dict(result), indent=2))
    else:
        click.echo(render(result))
        if result.files:
            click.echo(f"wrote {' and '.join(result.files)}; run with:\n  "
                       f"{usage(winner, result.files[0], inventory.python)}")
    click.get_current_context().exit(EXIT_OK if winner else EXIT_FAILED)
