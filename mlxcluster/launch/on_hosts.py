"""A model only the hosts hold: `serve ID --download-on HOST` and `train
--download-on HOST -- --init_from ID`.

HOST downloads the id and every other host of the job takes it from HOST
(``pull_downloaded_on``, as `pull --download-on` does): the folder is then
on every host at one path, each copy sha256 checked, and nothing of it
crossed this machine's link. serve and train still read the model here
before anything is launched (the split check and each rank's memory, a
pipeline's stages), so HOST sends a view of it (transfer/view.py): its
config, tokenizer and index whole, of each weight file its header. The
view lives in a folder of the run's own, removed when the run ends; the
ranks are given the hosts' folder, and the launch sends no model (every
host has it whole; a view is never sent: ``folder_manifest`` refuses it).

    model: labhost1 downloads mlx-community/Tiny-4bit into its own Hugging Face cache
    ...
    model: this machine reads a view of it: 4 file(s) whole and 21 weight file(s)' header, 21.0 KB of
        15.0 MB, at /tmp/mlxcluster-view-.../model; the ranks open /.../snapshots/0123... on every host,
        nothing is sent from here
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.jobs.events import Aside, Note, OnEvent
from mlxcluster.jobs.hosts import host_link
from mlxcluster.launch.job_source import JobSource, choose_job
from mlxcluster.launch.pull import download_host, id_to_download, pull_downloaded_on
from mlxcluster.launch.sync import human_bytes
from mlxcluster.transfer.view import make_view


@dataclass(frozen=True)
class HeldOnHosts:
    """A model on every host of a job, and a view of it here."""

    folder: str  # the same path on every host: what the ranks open
    view: str  # here: what serve's and train's checks read in its place


@contextmanager
def held_on_hosts(source: JobSource, name: str, host_name: str, env: dict[str, str],
                  on_event: OnEvent) -> Iterator[HeldOnHosts]:
    """The Hugging Face id ``name`` downloaded on ``host_name`` and on every
    host of the job ``source`` names (``pull_downloaded_on``), and a view of
    it here for as long as the context lasts. InputError (exit 2) when
    ``name`` is no id or names a folder here, or the host is not in the job."""
    id_to_download(name)  # said before any host is asked
    # The launch session chooses the job again and says what it picked up then.
    job, _ = choose_job(source, lambda event: None if isinstance(event, Aside) else on_event(event))
    pulled = pull_downloaded_on(job, name, host_name, env, on_event)
    assert pulled.manifest is not None  # pull_downloaded_on's: its files as the host hashed them
    link = host_link(download_host(job, host_name), env)
    with tempfile.TemporaryDirectory(prefix="mlxcluster-view-") as run_own:
        view = make_view(link, pulled.manifest, Path(run_own) / "model")
        plan = view.plan
        left_out = f", {len(plan.left_out)} other large file(s) left out" if plan.left_out else ""
        on_event(Note(f"model: this machine reads a view of it: {len(plan.whole)} file(s) whole "
                      f"and {len(plan.headers)} weight file(s)' header{left_out}, "
                      f"{human_bytes(view.fetched)} of {human_bytes(view.model_bytes)}, at "
                      f"{view.path}; the ranks open {pulled.folder} on every host, nothing is "
                      "sent from here"))
        yield HeldOnHosts(pulled.folder, str(view.path))
