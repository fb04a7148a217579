"""``mlxcluster report``: one self-contained HTML page from saved results.

    mlxcluster report captures/ -o report.html
    mlxcluster report captures/ --smoke smoke.json --run runs/t -o report.html
    mlxcluster report captures/ -i cluster.yaml -o report.html   # the inventory checks too
    mlxcluster report --run runs/t -o train.html                 # a training run alone

DIR is a ``doctor --collect`` folder (replayed, as ``doctor --from DIR``, with
``-i`` and ``--backend`` as there);
``--smoke`` a file written by ``smoke --json``; ``--run`` (repeatable) the
``--out`` folder of a training run (its metrics.jsonl). docs/report.md says
what each section of the page means.
"""

from __future__ import annotations

import shlex
import sys

import click

from mlxcluster.cli.params import inventory_option
from mlxcluster.doctor.doctor import BACKENDS
from mlxcluster.inventory.inventory import load_inventory
from mlxcluster.outputs import check_output_path
from mlxcluster.report import build_page, report_from_folder, write_page


def html_option(what: str):
    """The ``--html FILE`` option the commands share."""
    return click.option("--html", "html_path", type=click.Path(dir_okay=False),
                        help=f"Also write {what} as one self-contained HTML page (docs/report.md).")


def check_html_path(path: str | None) -> None:
    """Before any work: the page can be written there."""
    if path:
        check_output_path(path, what="the HTML page to ")


def shown_command() -> str:
    """The command line as typed, for the page's footer."""
    return shlex.join(["mlxcluster", *sys.argv[1:]])


def emit_page(report, path: str, *, err: bool = False) -> None:
    """Build and write the page; say where (on stderr for --json output)."""
    report.command = report.command or shown_command()
    write_page(build_page(report), path)
    click.echo(f"wrote {path}", err=err)


@click.command("report")
@click.argument("folder", required=False, type=click.Path(exists=True, file_okay=False))
@inventory_option("The inventory the folder was collected with (as doctor --from -i): its "
                  "checks are run too. Only when given.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="The backend you will launch with, as doctor --backend.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
@click.option("--smoke", "smoke_json", type=click.Path(exists=True, dir_okay=False),
              help="A 'mlxcluster smoke --json' output file to add.")
@click.option("--run", "runs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A training run folder (its metrics.jsonl) to add; repeatable.")
def command(folder, inventory_path, backend, output, smoke_json, runs):
    """Build one self-contained HTML page from a 'doctor --collect' folder
    (and/or a smoke --json file and training runs)."""
    check_output_path(output, what="the HTML page to ",
                      inputs={"--smoke": smoke_json, "-i/--inventory": inventory_path})
    inventory = load_inventory(inventory_path) if inventory_path else None
    report = report_from_folder(folder, inventory=inventory, backend=backend, smoke=smoke_json, runs=tuple(runs),
                                command=shown_command())
    emit_page(report, output)
