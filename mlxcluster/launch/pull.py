"""A model by its name on every host: `mlxcluster pull MODEL`.

A name is a folder on this machine, or a Hugging Face id ``ORG/NAME``,
optionally ``ORG/NAME@REVISION`` (a branch, a tag or a commit). An id is
resolved by huggingface_hub as mlx-lm resolves it: its cache here
(``HF_HUB_CACHE``, ``HF_HOME``), its token (``HF_TOKEN`` or
``huggingface-cli login``), ``HF_HUB_OFFLINE=1`` honoured (the cache only, no
network), its own progress bar while it downloads. The folder that names
(the cache's snapshot folder, for an id) is then sent to every remote host
at the same path, as serve and train send a model (launch/sync.py: each
file's sha256 checked there, only what a host lacks sent, a send cut off
resumed where it stopped).

    $ mlxcluster pull mlx-community/Qwen3-4B-4bit
    model: mac2: /Users/me/.cache/huggingface/hub/models--mlx-community--Qwen3-4B-4bit/snapshots/ab12.../ missing: sending 7 file(s), 2.3 GB
    ...
    mlx-community/Qwen3-4B-4bit is at /Users/me/.cache/huggingface/hub/... on mac1, mac2

With ``--download-on HOST`` (``pull_downloaded_on``) that host downloads the
id itself, into its own cache (the Mac with the better internet), and the
others take it from there over the hosts' own link: nothing of the model
crosses this machine's link, and this machine does not get a copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.errors import InputError, ToolMissing
from mlxcluster.jobs.events import Note, OnEvent
from mlxcluster.jobs.hosts import RankHost, for_each_host, host_link, remote_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.launch.sync import check_copy, check_space, human_bytes, sync_model, take_from
from mlxcluster.transfer.hub import download, listed
from mlxcluster.transfer.link import TransferError
from mlxcluster.transfer.manifest import Manifest

# Hugging Face's repository names: letters, digits, '-', '_', '.' (huggingface_hub's
# validate_repo_id), one '/' between the owner and the name.
HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class Pulled:
    """Where a model is now, on this machine and on every host of the job."""

    name: str  # as given
    folder: str  # the same path on every host
    remote: tuple[str, ...]  # the hosts it was checked or sent to (this machine's own copy aside)
    downloaded_on: str | None = None  # the host that downloaded it (--download-on): none here
    manifest: Manifest | None = None  # --download-on: its files, as that host hashed them


def resolve_model(name: str) -> Path:
    """The folder here that ``name`` names: itself when it is a folder, else
    the snapshot folder of the Hugging Face id (downloaded when it is not in
    the cache and the network may be used). InputError when neither."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    repo_id, _, revision = name.partition("@")
    if not is_hub_id(name) or ".." in repo_id:  # models/Qwen mistyped is no id
        raise InputError(f"{name}: no such folder here, nor a Hugging Face id (ORG/NAME[@REVISION])",
                         "give the model's folder on this machine, or an id such as "
                         "mlx-community/Qwen3-4B-4bit")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ToolMissing(f"{name} is a Hugging Face id, and huggingface_hub is not installed here",
                          "python -m pip install huggingface_hub (mlx-lm brings it: "
                          "pip install -e '.[serve]'), or give the model's folder") from None
    asked = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(snapshot_download(repo_id, revision=revision or None))
    except LocalEntryNotFoundError:  # not in the cache, and the hub not asked or not reached
        from huggingface_hub import constants

        why = ("HF_HUB_OFFLINE is set: the hub is not asked" if constants.HF_HUB_OFFLINE
               else "the hub could not be reached")
        raise InputError(f"{asked} is not in the Hugging Face cache here ({constants.HF_HUB_CACHE}), "
                         f"and {why}",
                         "download it once where the hub can be reached (without HF_HUB_OFFLINE), "
                         "or give the model's folder") from None
    except GatedRepoError:
        raise InputError(f"{asked} is gated: the hub wants your token and the model's terms accepted",
                         "accept them on huggingface.co, then set HF_TOKEN (or huggingface-cli "
                         "login)") from None
    except RevisionNotFoundError:
        raise InputError(f"{asked}: the hub has no revision {revision!r} of {repo_id}",
                         "give a branch, tag or commit the repository has (or none: main)") from None
    except RepositoryNotFoundError:
        raise InputError(f"{asked}: no such model on the hub (or it is private)",
                         "check the id's spelling; for a private one set HF_TOKEN") from None
    except (HfHubHTTPError, OSError) as err:
        raise InputError(f"{asked} could not be downloaded: {err}",
                         "check the network and the room on this machine's disk, then pull "
                         "again (what arrived is kept)") from None


def as_folder(name: str) -> str:
    """A Hugging Face id as its folder here (``resolve_model``: the cache, or
    downloaded into it); any other name as given, for the caller's own check
    to name what is wrong with it (serve's MODEL, train's --init_from)."""
    return str(resolve_model(name)) if is_hub_id(name) else name


def is_hub_id(name: str) -> bool:
    """``name`` names no path here and reads as ORG/NAME[@REVISION]: serve's
    MODEL and train's --init_from take it as a Hugging Face id."""
    path = Path(name).expanduser()
    return not path.exists() and bool(HF_ID.fullmatch(name.partition("@")[0])) \
        and not Path(name.split("/")[0]).expanduser().is_dir()


def pull(job: Job, name: str, env: dict[str, str], on_event: OnEvent) -> Pulled:
    """``name`` resolved to its folder here and that folder on every remote
    host of ``job``, at the same path."""
    folder = resolve_model(name)
    sync_model(job, str(folder), env, on_event, flag="the model")
    return Pulled(name, str(folder), tuple(dict.fromkeys(h.name for h in remote_hosts(job.hosts))))


def pull_downloaded_on(job: Job, name: str, host_name: str, env: dict[str, str],
                       on_event: OnEvent) -> Pulled:
    """The Hugging Face id ``name`` downloaded by ``host_name`` itself, then
    taken from it by every other host of ``job`` over the hosts' own link
    (its data IP), each file checked by the sha256 the downloader hashed."""
    hosts = list({h.name: h for h in job.hosts}.values())
    source = download_host(job, host_name)
    repo_id, revision = id_to_download(name)
    link = host_link(source, env)
    on_event(Note(f"model: {source.name} downloads {name} into its own Hugging Face cache"))
    folder = download(link, repo_id, revision, env=dict(source.env),
                      offline=env.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False"),
                      token=env.get("HF_TOKEN"))
    manifest = listed(link, folder)
    size = human_bytes(manifest.total_bytes)
    on_event(Note(f"model: {source.name} has {folder} ({len(manifest.files)} file(s), {size}, "
                  "hashed there)"))
    others = [h for h in hosts if h.name != source.name]
    copies = for_each_host([source, *others], lambda h: check_copy(manifest, h, env, what="the model"))
    here, rest = copies[0], copies[1:]
    check_space(manifest, rest, "model")
    lacking = []
    for copy in rest:
        if copy.summary(manifest) == "whole":
            on_event(Note(f"model: {copy.host.name} has {folder} ({size}, sha256 checked)"))
        else:
            lacking.append(copy)
    if lacking:
        on_event(Note(f"model: plan: {source.name} -> {', '.join(c.host.name for c in lacking)} over "
                      f"{source.ip} ({source.name}'s data IP), at once; nothing through this machine"))
        failed = take_from(manifest, here, source.ip, lacking, "model", folder, on_event,
                           then="not pulled there (this machine has no copy to send)")
        if failed:
            raise TransferError(f"{', '.join(c.host.name for c in failed)} could not take {name} "
                                f"from {source.name} (said above)",
                                "pull again: what arrived is kept; or pull without --download-on")
    return Pulled(name, folder, tuple(h.name for h in hosts), downloaded_on=source.name,
                  manifest=manifest)


def download_host(job: Job, host_name: str) -> RankHost:
    """The host of ``job`` named by --download-on; InputError (exit 2) naming
    the job's hosts when none is."""
    hosts = list({h.name: h for h in job.hosts}.values())
    source = next((h for h in hosts if h.name == host_name), None)
    if source is None:
        raise InputError(f"--download-on {host_name}: no such host in this job",
                         f"name one of {', '.join(h.name for h in hosts)}")
    return source


def id_to_download(name: str) -> tuple[str, str | None]:
    """``name`` as the (repository, revision) a host downloads (--download-on);
    InputError (exit 2) when it is no Hugging Face id, or names a folder here
    (a host cannot download that: it goes from here, without --download-on)."""
    repo_id, _, revision = name.partition("@")
    if not HF_ID.fullmatch(repo_id) or ".." in repo_id:
        raise InputError(f"--download-on takes a Hugging Face id (ORG/NAME[@REVISION]), not {name}",
                         "give an id such as mlx-community/Qwen3-4B-4bit, or leave out "
                         "--download-on to send the folder from here")
    if not is_hub_id(name):
        raise InputError(f"--download-on takes a Hugging Face id, and {name} is a folder here",
                         "leave out --download-on: the folder is sent from here to every host")
    return repo_id, revision or None

