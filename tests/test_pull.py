"""`mlxcluster pull MODEL` on this machine: a folder, or a Hugging Face id found
in huggingface_hub's real cache layout (HF_HUB_OFFLINE=1: no network), by
branch or commit; what is neither is refused with exit 2, naming it. Sent to
other hosts: tests/lab/test_data_sync_lab.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcluster.errors import InputError
from tests.hub_cache_support import COMMIT, cache_model
from tests.waits import SERVE_UP_S

REPO = Path(__file__).resolve().parents[1]


def pull(args: list[str], cache: Path, cwd: Path, offline: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    env["HF_HUB_OFFLINE"] = "1" if offline else "0"
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # a hub that is not there, on any machine
    return subprocess.run([sys.executable, "-m", "mlxcluster", "pull", *args, "--local"], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_an_id_in_the_cache_is_its_snapshot_folder_by_branch_or_commit(tmp_path):
    snapshot = cache_model(tmp_path / "hub", "mlx-community/Tiny-4bit",
                           {"config.json": b"{}", "model.safetensors": b"\0" * 64,
                            "tokenizer/tokenizer.json": b"{}"})
    for name in ("mlx-community/Tiny-4bit", f"mlx-community/Tiny-4bit@{COMMIT}",
                 "mlx-community/Tiny-4bit@main"):
        done = pull([name], tmp_path / "hub", tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == f"{name} is at {snapshot} here (no other host)"


def test_a_folder_is_itself(tmp_path):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    done = pull(["models/mine"], tmp_path / "hub", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"models/mine is at {tmp_path}/models/mine here")


@pytest.mark.parametrize("name, offline, said", [
    ("mlx-community/Other-4bit", True, "mlx-community/Other-4bit is not in the Hugging Face cache "
                                       "here ({hub}), and HF_HUB_OFFLINE is set: the hub is not asked"),
    ("mlx-community/Tiny-4bit@v9", True, "mlx-community/Tiny-4bit@v9 is not in the Hugging Face cache"),
    ("models/Tiny-4bit", True, "models/Tiny-4bit: no such folder here, nor a Hugging Face id"),
    ("./Tiny-4bit", True, "./Tiny-4bit: no such folder here, nor a Hugging Face id"),
    # online, the hub not reached (HF_ENDPOINT: a port where nothing listens): said as such
    ("mlx-community/Other-4bit", False, "and the hub could not be reached"),
])
def test_what_is_neither_a_folder_nor_a_cached_id_is_exit_2_naming_it(tmp_path, name, offline, said):
    cache_model(tmp_path / "hub", "mlx-community/Tiny-4bit", {"config.json": b"{}"})
    (tmp_path / "models").mkdir()
    done = pull([name], tmp_path / "hub", tmp_path, offline=offline)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said.format(hub=tmp_path / "hub") in done.stderr and "Traceback" not in done.stderr
    assert "fix: " in done.stderr


def test_train_takes_an_id_for_init_from_and_gives_the_ranks_its_folder(tmp_path):
    """`train -- --init_from ORG/NAME`: the launch resolves the id as pull
    does and hands every rank (and every host's copy) the cache's folder."""
    snapshot = cache_model(tmp_path / "hub", "mlx-community/Tiny-4bit", {"config.json": b"{}"})
    code = ("from mlxcluster.launch.trainer import parse_trainer_args, with_model_folder\n"
            "args = with_model_folder(parse_trainer_args(('--config', 'tiny', '--init_from', "
            "'mlx-community/Tiny-4bit')))\n"
            "print(args.config.init_from); print(' '.join(args.argv()))\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    folder, argv = done.stdout.splitlines()
    assert folder == str(snapshot) and argv.endswith(f"--init_from {snapshot}"), done.stdout


def test_serve_takes_an_id_and_serves_the_cached_folder(llama, tmp_path):
    """`HF_HUB_OFFLINE=1 mlxcluster serve ORG/NAME --local 2`: the model found
    in the hub cache is served, and answers as one process of it does."""
    from tests.serve_support import Serving, chat_model, chat_text, generated_alone

    here = chat_model(llama, tmp_path / "tiny-chat")
    snapshot = cache_model(tmp_path / "hub", "mlx-community/Tiny-chat",
                           {p.relative_to(here).as_posix(): p.read_bytes()
                            for p in here.rglob("*") if p.is_file()})
    from mlxcluster.jobs.plan import free_port_block

    port = free_port_block(1)
    serving = Serving(["--local", "2", "--no-preflight", "--port", str(port), "mlx-community/Tiny-chat"],
                      env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
                      cwd=tmp_path)
    try:
        # named by its id, not by the snapshot folder's commit hash
        serving.wait_for(r"serving mlx-community/Tiny-chat at http://", SERVE_UP_S)
        assert chat_text(port) == generated_alone(snapshot)
    finally:
        code = serving.stop()
    assert code == 0, serving.output()
    assert str(snapshot) in serving.output()


def test_a_host_downloads_into_its_own_cache_and_lists_it_hashed_links_followed(tmp_path):
    """transfer/hub.py on a host reached by bash (this machine, as a local
    rank is): the id resolved by the host's huggingface_hub in the cache its
    env names, offline; the listing hashes the snapshot's files through their
    links. HF_TOKEN goes on stdin: never on a command line, which `ps` shows."""
    from mlxcluster.ssh.runner import ProcessRunner
    from mlxcluster.transfer.hub import download, listed
    from mlxcluster.transfer.link import ProcessLink

    files = {"config.json": b"{}", "model.safetensors": os.urandom(4096),
             "tokenizer/tokenizer.json": b'{"v": 1}'}
    snapshot = cache_model(tmp_path / "hub", "mlx-community/Tiny-4bit", files)
    commands: list[str] = []
    link = ProcessLink("here", sys.executable, ProcessRunner(
        lambda command: commands.append(command) or ["bash", "-c", command],
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "elsewhere")}))
    folder = download(link, "mlx-community/Tiny-4bit", None, env={"HF_HUB_CACHE": str(tmp_path / "hub")},
                      offline=True, token="hf_not_on_the_command_line")
    assert folder == str(snapshot)
    assert not any("hf_not_on_the_command_line" in c for c in commands)
    manifest = listed(link, folder)
    assert manifest.folder == folder
    assert {f.name: f.sha256 for f in manifest.files} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

    with pytest.raises(InputError, match=r"--download-on here: mlx-community/Other is not in its "
                                         r"Hugging Face cache .*HF_HUB_OFFLINE is set"):
        download(link, "mlx-community/Other", None, env={"HF_HUB_CACHE": str(tmp_path / "hub")},
                 offline=True, token=None)
