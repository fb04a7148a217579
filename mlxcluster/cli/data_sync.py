"""`train --data DIR` and `run`'s script: every host's copy checked and,
where it lacks or differs, sent before the launch (mlxcluster.data_sync does
the work; this says it)."""

from __future__ import annotations

import click

from mlxcluster.data_sync import (
    Manifest,
    check_copy,
    check_space,
    file_manifest,
    folder_manifest,
    human_bytes,
    read_manifest,
    send,
)
from mlxcluster.jobs.hosts import for_each_host, remote_hosts


def sync_data(job, folder: str, env: dict[str, str]) -> None:
    """Check the trainer's data ``folder`` on every remote host of ``job``;
    send what is lacking or different, each file verified on arrival.
    Raises before anything is sent when a host cannot be asked or has not
    the room."""
    if remote_hosts(job.hosts):
        send_where_needed(job, read_manifest(folder), "data", env)


def sync_model(job, folder: str, env: dict[str, str]) -> None:
    """The trainer's --init_from folder on every remote host, as here."""
    if remote_hosts(job.hosts):
        send_where_needed(job, folder_manifest(folder), "model", env)


def sync_script(job, script: str, env: dict[str, str]) -> None:
    """`run`'s script file on every remote host, at its absolute path here."""
    if remote_hosts(job.hosts):
        send_where_needed(job, file_manifest(script), "script", env)


def send_where_needed(job, manifest: Manifest, what: str, env: dict[str, str]) -> None:
    flag = {"data": "--data", "model": "--init_from"}.get(what, "the " + what)
    copies = for_each_host(remote_hosts(job.hosts),
                           lambda h: check_copy(manifest, h, env, what=flag))
    check_space(manifest, copies, what)
    size = human_bytes(manifest.total_bytes)
    shown = manifest.folder if len(manifest.files) > 1 else \
        f"{manifest.folder}/{manifest.files[0].name}"
    for copy in copies:
        state = copy.summary(manifest)
        if state == "whole":
            click.echo(f"{what}: {copy.host.name} has {shown} ({size}, sha256 checked)")
            continue
        lacking = copy.lacking(manifest)
        need = sum(f.bytes for f in lacking)
        click.echo(f"{what}: {copy.host.name}: {shown} {state}: sending "
                   f"{len(lacking)} file(s), {human_bytes(need)}")
        with click.progressbar(length=max(need, 1), label=f"  to {copy.host.name}",
                               file=click.get_text_stream("stderr")) as bar:
            sent = send(manifest, copy, lambda n, bar=bar: bar.update(n - bar.pos), env=env)
        click.echo(f"{what}: {copy.host.name}: sent {human_bytes(sent.bytes)} in "
                   f"{sent.seconds:.1f} s ({human_bytes(sent.rate)}/s) by {sent.via}, "
                   "sha256 verified there")
