"""`mlxcluster demo`: run every stage on local ranks and print what happened."""

from __future__ import annotations

import click

from mlxcluster.demo import StepResult, run_demo


def _render(step: StepResult) -> None:
    mark = {True: "[✓]", False: "[✗]", None: "[-]"}[step.ok]
    click.echo(f"{mark} {step.name:<18} {step.seconds:6.1f}s  {step.detail}")


@click.command("demo")
@click.option("--ranks", default=2, show_default=True, type=click.IntRange(1, 8),
              help="Local ranks (127.0.0.1 repeated).")
@click.option("--workdir", type=click.Path(file_okay=False), default="runs/demo", show_default=True)
def command(ranks: int, workdir: str) -> None:
    """Run doctor, hostfile, smoke and a short training run on this machine."""
    click.echo(f"mlxcluster demo: a {ranks}-rank cluster on this machine")
    results = run_demo(ranks, workdir, on_step=_render)
    failed = [r.name for r in results if r.ok is False]
    ran = sum(1 for r in results if r.ok is not None)
    if failed:
        click.echo(f"demo: {len(failed)} of {ran} steps failed: {', '.join(failed)}")
        raise SystemExit(1)
    click.echo(f"demo: all {ran} steps passed")
