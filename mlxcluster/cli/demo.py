"""`mlxcluster demo`: run every stage on local ranks and print what happened."""

from __future__ import annotations

import shlex

import click

from mlxcluster.demo import Step, StepResult, run_demo, write_demo_report
from mlxcluster.errors import MlxclusterError


def _start(step: Step, argv: list[str]) -> None:
    shown = ["mlxcluster", *argv[3:]]  # argv = [python, -m, mlxcluster, ...]
    click.secho(f"\n== {step.name}: {shlex.join(shown)}", bold=True)


def _line(line: str) -> None:
    click.echo(f"   {line}")


def _done(step: StepResult) -> None:
    mark = "[✓]" if step.ok else "[✗]"
    click.secho(f"{mark} {step.name} ({step.seconds:.1f} s): {step.detail}",
                fg="green" if step.ok else "red")


@click.command("demo")
@click.option("--ranks", default=2, show_default=True, type=click.IntRange(2, 8),
              help="Local ranks (127.0.0.1 repeated).")
@click.option("--steps", default=100, show_default=True, type=click.IntRange(1, 100000),
              help="Training steps of the reference trainer.")
@click.option("--config", default="demo", show_default=True,
              help="Trainer config: tiny, demo, blog or a YAML path.")
@click.option("--workdir", type=click.Path(file_okay=False), default="runs/demo", show_default=True)
@click.option("-q", "--quiet", is_flag=True, help="Only the one-line result of each step.")
def command(ranks: int, steps: int, config: str, workdir: str, quiet: bool) -> None:
    """Run doctor, hostfile, smoke (ring, MPI) and a short training run on this machine,
    then write WORKDIR/report.html (docs/report.md) and print its path."""
    click.echo(f"mlxcluster demo: a {ranks}-rank cluster on this machine (127.0.0.1 x {ranks})")
    results = run_demo(ranks, workdir, steps, config, on_start=_start, on_step=_done,
                       on_output=None if quiet else _line)
    click.secho("\nsummary", bold=True)
    for r in results:
        click.echo(f"  {'[✓]' if r.ok else '[✗]'} {r.name:<14} {r.seconds:6.1f} s  {r.detail}")
    try:
        page, missing = write_demo_report(workdir), None
    except MlxclusterError as err:  # nothing left to report (every step failed): say so below
        page, missing = None, err.message
    failed = [r.name for r in results if not r.ok]
    if failed:
        click.secho(f"demo: {len(failed)} of {len(results)} steps failed: {', '.join(failed)}", fg="red")
    else:
        click.secho(f"demo: all {len(results)} steps passed", fg="green")
    # Last, so that it is what the terminal shows: the page to open or attach.
    click.echo(f"report: {page}" if page else f"no report: {missing}")
    if failed:
        click.get_current_context().exit(1)
