"""`mlxcluster stop RUN_ID`: stop a job on every host, after a last checkpoint."""

from __future__ import annotations

import click

from mlxcluster.cli.jobs import chosen_hosts, host_options, known_run_kinds
from mlxcluster.cli.params import Duration, LocalMeansHere
from mlxcluster.errors import InputError
from mlxcluster.jobs.cleanup import leftover_advice
from mlxcluster.jobs.running import check_run_id, list_running, stop_run


@click.command("stop", cls=LocalMeansHere)
@host_options
@click.option("--grace", type=Duration(1), default="60s", show_default=True,
              help="How long the ranks have to write a last checkpoint and end before they "
                   "are killed.")
@click.argument("run_id")
def command(hostfile, inventory_path, local, grace, run_id):
    """Stop RUN_ID (as `mlxcluster jobs` lists it) on every host: each rank
    is asked to stop (the reference trainer writes a checkpoint at its next
    logged step; another program ends), then whatever is left after --grace
    is killed. Exit 0 when the run is stopped, 2 when no such run runs there."""
    known_run_kinds()
    check_run_id(run_id)
    hosts = chosen_hosts("stop", hostfile, inventory_path, local)
    jobs, _ = list_running(hosts)
    found = next((j for j in jobs if j.run_id == run_id), None)
    if found is None:
        raise InputError(f"no run {run_id} runs on {', '.join(dict.fromkeys(h.name for h in hosts))}",
                         "mlxcluster jobs lists what runs there (with the same -i, --hostfile or --local)")
    click.echo(f"stopping {run_id} ({len(found.ranks)} rank(s) on {', '.join(found.hosts)}): "
               f"{found.command}")
    ended, unreached = stop_run(hosts, run_id, grace)
    if unreached:
        names = ", ".join(r.host for r in unreached)
        raise InputError(f"could not reach {names} to stop {run_id} there",
                         f"when it answers again: {leftover_advice(run_id)}")
    if ended:
        click.echo(f"{run_id} stopped: every rank ended when asked")
    else:
        click.echo(f"{run_id} stopped: ranks still there after {grace:.0f} s were killed "
                   "(no last checkpoint from them)")
