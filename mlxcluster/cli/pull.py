"""`mlxcluster pull MODEL`: a model folder, or a Hugging Face id, on every host."""

from __future__ import annotations

import os

import click

from mlxcluster.cli.job_launch import EventView
from mlxcluster.cli.jobs import host_options
from mlxcluster.cli.params import LocalMeansHere
from mlxcluster.launch.job_source import JobSource, choose_job, one_source
from mlxcluster.launch.pull import pull, pull_downloaded_on


@click.command("pull", cls=LocalMeansHere)
@host_options
@click.option("--download-on", "download_on", metavar="HOST",
              help="That host downloads MODEL (a Hugging Face id) into its own cache, and the "
                   "others take it from there over the hosts' link; no copy here.")
@click.argument("model")
def command(hostfile, inventory_path, local, download_on, model):
    """Put MODEL on every host, at one path, and print that path. MODEL is a
    folder on this machine or a Hugging Face id (ORG/NAME, or
    ORG/NAME@REVISION), found in huggingface_hub's cache here or downloaded
    into it (HF_HUB_OFFLINE=1: the cache only; HF_TOKEN for a gated model).
    Each host is sent what it lacks, checked by sha256 there; a send cut off
    goes on where it stopped at the next pull. Exit 0; 2 when MODEL is
    neither (said), or a host has not the room; 255 when a host cannot be
    reached (named). With --download-on HOST, HOST downloads the id itself
    (the Mac with the better internet) and nothing of the model crosses this
    machine's link."""
    source = JobSource(hostfile, inventory_path, 1 if local else None)
    one_source("pull", source, example="-i cluster.yaml")
    view = EventView("pull")
    job, _ = choose_job(source, view)
    if download_on:
        pulled = pull_downloaded_on(job, model, download_on, dict(os.environ), view)
        where = f"on {', '.join(pulled.remote)} (downloaded on {pulled.downloaded_on}; not here)"
    else:
        pulled = pull(job, model, dict(os.environ), view)
        where = f"here and on {', '.join(pulled.remote)}" if pulled.remote else "here (no other host)"
    click.echo(f"{pulled.name} is at {pulled.folder} {where}")
