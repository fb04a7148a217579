"""A Hugging Face model downloaded by a host itself (`pull --download-on HOST`),
and what it holds, listed and hashed there.

The Mac with the better internet downloads; the others then take the model
from it over the hosts' own link (transfer/fanout.py), and no byte of it
crosses this machine's. The host runs huggingface_hub as mlx-lm does there:
its own cache (``HF_HOME`` / ``HF_HUB_CACHE`` from the inventory's env for
that host, else its default), this machine's ``HF_HUB_OFFLINE`` honoured.
The token (``HF_TOKEN`` here) goes on the command's stdin, never on its
command line (which ``ps`` shows on the host) nor in a message.

    download(link, "mlx-community/Qwen3-4B-4bit", None, env=..., offline=False, token=None)
    -> "/Users/me/.cache/huggingface/hub/models--mlx-community--Qwen3-4B-4bit/snapshots/ab12..."
"""

from __future__ import annotations

import io
import json
import shlex

from mlxcluster.errors import InputError
from mlxcluster.transfer.link import NoAnswer, ProcessLink, TransferError
from mlxcluster.transfer.manifest import DataFile, Manifest
from mlxcluster.transfer.send import agent_command, last_line

DOWNLOAD_S = 6 * 3600.0  # a download that has not ended by then is given up (and said)
LIST_S = 3600.0  # hashing a 70 GB model at ~0.5 GB/s takes minutes, not an hour

# Exit codes of the script below, each said as its own problem.
NO_HUB, NOT_CACHED, NOT_ON_HUB = 3, 4, 5

# Runs on the host with its python, site-packages on (huggingface_hub is there with
# mlx-lm). HF_HUB_OFFLINE and HF_TOKEN are set before huggingface_hub is imported:
# it reads them once, at import.
DOWNLOAD_SCRIPT = r"""
import json, os, sys
asked = json.loads(sys.stdin.readline() or "{}")
if asked.get("token"):
    os.environ["HF_TOKEN"] = asked["token"]
if asked.get("offline"):
    os.environ["HF_HUB_OFFLINE"] = "1"
try:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
except ImportError:
    print("huggingface_hub is not installed for " + sys.executable, file=sys.stderr)
    sys.exit(3)
try:
    folder = snapshot_download(asked["repo"], revision=asked.get("revision") or None)
except LocalEntryNotFoundError:
    from huggingface_hub import constants
    why = "HF_HUB_OFFLINE is set: the hub is not asked" if constants.HF_HUB_OFFLINE else \
        "the hub could not be reached"
    print("not in its Hugging Face cache (%s), and %s" % (constants.HF_HUB_CACHE, why), file=sys.stderr)
    sys.exit(4)
except (RepositoryNotFoundError, RevisionNotFoundError) as err:
    print(str(err).splitlines()[0], file=sys.stderr)
    sys.exit(5)
except Exception as err:
    print("%s: %s" % (type(err).__name__, str(err).splitlines()[0] if str(err) else ""), file=sys.stderr)
    sys.exit(1)
print(json.dumps({"folder": folder}))
"""


def download(link: ProcessLink, repo_id: str, revision: str | None, *, env: dict[str, str],
             offline: bool, token: str | None, timeout: float = DOWNLOAD_S) -> str:
    """The snapshot folder of ``repo_id`` on ``link``'s host, downloaded there
    into its own cache when missing. InputError when the host cannot have it
    (not cached offline, no such model, no huggingface_hub there); TransferError
    when the download fails or outlasts ``timeout``."""
    asked = f"{repo_id}@{revision}" if revision else repo_id
    words = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
    command = shlex.join([*words, link.python, "-c", DOWNLOAD_SCRIPT])
    request = json.dumps({"repo": repo_id, "revision": revision, "offline": offline,
                          "token": token}).encode() + b"\n"
    try:
        result = link.run(command, timeout=timeout, stdin=io.BytesIO(request))
    except NoAnswer:
        raise TransferError(f"{link.name} did not finish downloading {asked} within {timeout:.0f} s",
                            "pull again: what huggingface_hub downloaded there is kept") from None
    said = last_line(result.stderr) or f"exit code {result.exit_status}"
    if result.exit_status == NO_HUB:
        raise InputError(f"--download-on {link.name}: {said}",
                         "install mlx-lm there (mlxcluster doctor --fix --imports mlx_lm), "
                         "or pull without --download-on")
    if result.exit_status == NOT_CACHED:
        raise InputError(f"--download-on {link.name}: {asked} is {said}",
                         "let that host reach huggingface.co (without HF_HUB_OFFLINE), or pull "
                         "without --download-on")
    if result.exit_status == NOT_ON_HUB:
        raise InputError(f"--download-on {link.name}: {asked}: {said}",
                         "check the id's spelling and revision; for a private model set HF_TOKEN")
    if result.exit_status != 0:
        raise TransferError(f"{link.name} could not download {asked}: {said}",
                            "check that host's network and the room on its disk, then pull again "
                            "(what arrived is kept)")
    try:
        return str(json.loads(result.stdout.strip().splitlines()[-1])["folder"])
    except (ValueError, KeyError, IndexError):
        raise TransferError(f"{link.name} downloaded {asked} but did not say where: "
                            f"{result.stdout.strip()[-200:] or said}") from None


def listed(link: ProcessLink, folder: str, timeout: float = LIST_S) -> Manifest:
    """What ``folder`` on ``link``'s host holds, hashed there (links
    followed): the manifest the other hosts' copies are checked against."""
    try:
        result = link.run(agent_command(link.python, "list", {"dir": folder}), timeout=timeout)
    except NoAnswer:
        raise TransferError(f"{link.name} did not finish hashing {folder} within {timeout:.0f} s") from None
    if result.exit_status != 0:
        raise TransferError(f"{link.name} could not list {folder}: "
                            f"{last_line(result.stderr) or f'exit code {result.exit_status}'}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    return Manifest(folder, tuple(DataFile(f["name"], int(f["bytes"]), f["sha256"])
                                  for f in answer["files"]))
