"""`train --data DIR`: every host's copy checked and, where it lacks or
differs, sent before the launch (mlxcluster.data_sync does the work; this
says it)."""

from __future__ import annotations

import click

from mlxcluster.data_sync import (
    check_copy,
    check_space,
    human_bytes,
    read_manifest,
    send,
)
from mlxcluster.jobs.hosts import for_each_host, remote_hosts


def sync_data(job, folder: str, env: dict[str, str]) -> None:
    """Check ``folder`` on every remote host of ``job``; send what is lacking
    or different, each file verified on arrival. Raises before anything is
    sent when a host cannot be asked or has not the room."""
    hosts = remote_hosts(job.hosts)
    if not hosts:
        return
    manifest = read_manifest(folder)
    size = human_bytes(manifest.total_bytes)
    copies = for_each_host(hosts, lambda h: check_copy(manifest, h, env))
    check_space(manifest, copies)
    for copy in copies:
        state = copy.summary(manifest)
        if state == "whole":
            click.echo(f"data: {copy.host.name} has {manifest.folder} ({size}, sha256 checked)")
            continue
        lacking = copy.lacking(manifest)
        need = sum(f.bytes for f in lacking)
        click.echo(f"data: {copy.host.name}: {manifest.folder} {state}: sending "
                   f"{len(lacking)} file(s), {human_bytes(need)}")
        with click.progressbar(length=max(need, 1), label=f"  to {copy.host.name}",
                               file=click.get_text_stream("stderr")) as bar:
            sent = send(manifest, copy, lambda n, bar=bar: bar.update(n - bar.pos), env=env)
        click.echo(f"data: {copy.host.name}: sent {human_bytes(sent.bytes)} in "
                   f"{sent.seconds:.1f} s ({human_bytes(sent.rate)}/s) by {sent.via}, "
                   "sha256 verified there")
