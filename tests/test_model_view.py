"""A view here of a model only the hosts hold (transfer/view.py, launch/on_hosts.py):
`serve` and `train` with --download-on read it in place of the model. Made from a
Hugging Face snapshot (links to blobs) through the agent's real `heads`, over a link
that runs bash here as a local rank's does: the files but the weights whole, each
weight file its header and a sparse tail, read by every reader here as the model
(the split check's, mlx-lm's lazy build, the trainer's stage plan), never sent; a
wrong name for --download-on is exit 2 before anything starts. On the lab:
tests/lab/test_download_on_lab.py."""

from __future__ import annotations

import hashlib
import struct
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import InputError
from mlxcluster.jobs.plan import free_port_block
from mlxcluster.launch.job_source import JobSource
from mlxcluster.launch.session import LaunchFlags
from mlxcluster.launch.sync import sync_model
from mlxcluster.launch.trainer import (
    parse_trainer_args,
    training_request,
    with_model_on_hosts,
    with_stage_split,
)
from mlxcluster.serve.serving import ServeSpec, serving_request
from mlxcluster.ssh.runner import ProcessRunner
from mlxcluster.transfer.link import ProcessLink, TransferError
from mlxcluster.transfer.manifest import VIEW_MARK, DataFile, Manifest, folder_manifest
from mlxcluster.transfer.view import WHOLE_LIMIT, ViewPlan, make_view
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder
from tests.hub_cache_support import cache_model


def here_link() -> ProcessLink:
    """This machine as a host: commands run by bash, as for a local rank."""
    return ProcessLink("here", sys.executable, ProcessRunner(lambda command: ["bash", "-c", command]))


def snapshot_of(model: Path, cache: Path) -> Path:
    """``model``'s files as a Hugging Face snapshot in ``cache`` (links to blobs)."""
    return cache_model(cache, "mlx-community/Tiny-4bit",
                       {p.relative_to(model).as_posix(): p.read_bytes()
                        for p in model.rglob("*") if p.is_file()})


def listed_here(folder: Path) -> Manifest:
    """What a host's `listed` gives for ``folder``: every file, links followed, hashed."""
    return Manifest(str(folder), tuple(
        DataFile(p.relative_to(folder).as_posix(), p.stat().st_size,
                 hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*")) if p.is_file()))


def header_length(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A tiny Llama of 4 blocks, saved by mlx-lm one tensor a file with its index."""
    return make_llama_folder(tmp_path_factory.mktemp("view") / "llama4",
                             {**LLAMA3_CONFIG, "num_hidden_layers": 4}, shard=True)


@pytest.fixture(scope="module")
def viewed(sharded, tmp_path_factory):
    """(the snapshot on the 'host', the view of it here)."""
    root = tmp_path_factory.mktemp("viewed")
    snapshot = snapshot_of(sharded, root / "hub")
    return snapshot, make_view(here_link(), listed_here(snapshot), root / "view" / "model")


def test_the_view_holds_the_files_whole_and_of_each_weight_file_its_header(viewed):
    snapshot, view = viewed
    names = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*"))
    weights = [n for n in names if n.endswith(".safetensors")]
    assert len(weights) > 4 and "model.safetensors.index.json" in names
    assert view.plan == ViewPlan(tuple(n for n in names if n not in weights), tuple(weights), ())
    assert sorted(p.relative_to(view.path).as_posix() for p in view.path.rglob("*")
                  if p.name != VIEW_MARK) == names
    for name in view.plan.whole:
        assert (view.path / name).read_bytes() == (snapshot / name).read_bytes()
        assert not (view.path / name).is_symlink()
    headers = 0
    for name in weights:
        ours, theirs = view.path / name, (snapshot / name).resolve()
        length = header_length(theirs)
        headers += length
        # the real size (mx.load checks offsets against it), the header's bytes, then zeros
        assert ours.stat().st_size == theirs.stat().st_size
        assert ours.read_bytes()[:length] == theirs.read_bytes()[:length]
        assert ours.read_bytes()[length:] == bytes(theirs.stat().st_size - length)
        # sparse: on disk, the header's blocks alone, none of the tensors'
        assert ours.stat().st_blocks * 512 <= length + 4096
    assert view.fetched == headers + sum((snapshot / n).stat().st_size for n in view.plan.whole)
    assert view.model_bytes == sum((snapshot / n).stat().st_size for n in names)
    assert (view.path / VIEW_MARK).read_text() == f"{snapshot}\n"


def test_every_reader_here_reads_the_view_as_the_model(viewed, sharded):
    """The split check's folder, mlx-lm's lazy build (fit/family.py: mx.load refuses a
    file shorter than its header's offsets) and the trainer's stage bytes."""
    from mlxcluster.fit.family import PIPELINE, TENSOR, family_support
    from mlxcluster.fit.model_folder import read_model_folder
    from mlxcluster.fit.stage_files import files_left_out
    from reference_train.stages import folder_bytes

    _, view = viewed
    ours, theirs = read_model_folder(view.path), read_model_folder(sharded)
    assert (ours.config, ours.tensors, ours.has_index) == (theirs.config, theirs.tensors, True)
    assert folder_bytes(view.path) == folder_bytes(sharded)
    assert files_left_out(view.path, (2, 2)) == files_left_out(sharded, (2, 2))
    for mode in (TENSOR, PIPELINE):
        got = family_support(view.path, "llama", 2, mode)
        assert got.unknown is None and got.split_error is None, got
        assert got == family_support(sharded, "llama", 2, mode)


def test_trains_plan_reads_the_view_and_the_ranks_get_the_hosts_folder(viewed, sharded):
    """train --download-on: the ranks' --init_from is the folder on the hosts; the
    pipeline's split is planned from the view here, as from the model itself; the
    launch sends no model (every host has it whole)."""
    snapshot, view = viewed
    flags = ("--config", "tiny", "--fine_tune", "lora", "--pipeline", "2")
    args = with_model_on_hosts(parse_trainer_args((*flags, "--init_from", "mlx-community/Tiny-4bit")),
                               str(snapshot), str(view.path))
    assert args.config.init_from == str(snapshot) and args.argv()[-2:] == ("--init_from", str(snapshot))
    assert args.config_here.init_from == str(view.path)
    planned = with_stage_split(args)
    alone = with_stage_split(parse_trainer_args((*flags, "--init_from", str(sharded))))
    assert planned.pipeline.split == alone.pipeline.split == (2, 2)
    assert planned.model_view == str(view.path) and planned.config.init_from == str(snapshot)
    request = training_request(planned, LaunchFlags(JobSource()), detached=False, send_folders=True)
    assert request.models == ()
    sent = training_request(alone, LaunchFlags(JobSource()), detached=False, send_folders=True)
    assert sent.models == (str(sharded),)


def test_serve_judges_the_view_and_gives_the_ranks_the_hosts_folder(viewed):
    snapshot, view = viewed
    spec = ServeSpec(str(snapshot), pipeline=True)
    request = serving_request(spec, LaunchFlags(JobSource()), send_model=True, view=str(view.path))
    assert request.models == ()
    assert request.check.keywords["model_dir"] == str(view.path)
    assert request.check.keywords["on_hosts"] == str(snapshot)
    assert serving_request(spec, LaunchFlags(JobSource()), send_model=True).models == (str(snapshot),)


def test_a_view_is_never_sent(viewed):
    """Its weight files are headers and zeros: every model send lists its folder by
    folder_manifest, which refuses it (exit 2), before any host is asked."""
    from mlxcluster.jobs.job import job_local

    _, view = viewed
    with pytest.raises(InputError, match="is a view of a model only the hosts hold"):
        folder_manifest(view.path)
    job = job_local(2, "ring", sys.executable)  # two hosts no one can reach: none is asked
    remote = replace(job, hosts=tuple(replace(h, name=f"mac{i}", ssh=f"192.0.2.{i}")
                                      for i, h in enumerate(job.hosts)))
    with pytest.raises(InputError, match="is a view"):
        sync_model(remote, str(view.path), {}, lambda event: pytest.fail(f"said {event}"))


def test_large_files_that_are_no_weights_are_left_out_of_the_plan():
    manifest = Manifest("/m", (DataFile("config.json", 900, "a"), DataFile("model.gguf", WHOLE_LIMIT + 1, "b"),
                               DataFile("model.safetensors", 10**10, "c"),
                               DataFile("tokenizer/tokenizer.json", WHOLE_LIMIT, "d")))
    assert ViewPlan.of(manifest) == ViewPlan(("config.json", "tokenizer/tokenizer.json"),
                                             ("model.safetensors",), ("model.gguf",))


def test_a_weight_file_that_is_no_safetensors_is_said_by_the_host(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)  # a length past the file's end
    with pytest.raises(TransferError, match=r"here: heads .*model.safetensors is not a safetensors "
                                            r"file"):
        make_view(here_link(), listed_here(folder), tmp_path / "view")


@pytest.mark.parametrize("command, said", [
    (["serve", "models/mine", "--download-on", "somehost"],
     "--download-on takes a Hugging Face id, and models/mine is a folder here"),
    (["serve", "./mine", "--download-on", "somehost"],
     "--download-on takes a Hugging Face id (ORG/NAME[@REVISION]), not ./mine"),
    (["serve", "mlx-community/Tiny-4bit", "--download-on", "mac9"],
     "--download-on mac9: no such host in this job"),
    (["train", "--download-on", "somehost", "--", "--steps", "1"],
     "--download-on HOST downloads the trainer's --init_from, and none is given"),
    (["train", "--download-on", "mac9", "--", "--init_from", "models/mine"],
     "and models/mine is a folder here"),
])
def test_what_a_host_cannot_download_is_exit_2_before_anything_starts(tmp_path, monkeypatch,
                                                                       command, said):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    where = ["--local", "2", "--port", str(free_port_block(1))] if command[0] == "serve" \
        else ["--local", "2"]
    result = CliRunner().invoke(cli, [command[0], *where, *command[1:]])
    assert result.exit_code == 2, result.output
    assert said in result.output and "fix: " in result.output, result.output
    assert "Traceback" not in result.output and "Hugging Face cache" not in result.output
