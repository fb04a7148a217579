"""Bad input to smoke, train and demo is refused with exit 2 and a message
naming the problem, before anything is launched (no traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.smoke.run import SmokeReport
from mlxcluster.smoke.stats import BenchRow
from tests.fakes import FakeSsh


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("sizes,needle", [("inf", "not a finite number"),
                                          ("1e400", "not a finite number"),
                                          ("1K:inf", "not a finite number"),
                                          ("99999999999999999999G", "above the limit of 16G")])
def test_smoke_sizes_out_of_range(sizes, needle):
    result = invoke("smoke", "--local", "2", "--sizes", sizes)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "smoke ring" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# ---- smoke --plot ---------------------------------------------------------------------

def no_run(*_args, **_kwargs):
    raise AssertionError("the smoke ran although its input was bad")


@pytest.mark.parametrize("name,needle", [("nodir/x.png", "directory"),
                                         ("out.txt", "cannot write .txt files"),
                                         ("/proc/mlxcluster-nope.png", "cannot write there")])
def test_smoke_plot_path_is_checked_before_running(name, needle, tmp_path, monkeypatch):
    """A plot path that cannot be written was found only after the whole run
    ('error: cannot write plot', or a ValueError traceback for .txt)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", no_run)
    result = invoke("smoke", "--local", "2", "--bench", "--plot", name)
    assert result.exit_code == 2, result.output
    assert needle in result.output and name in result.output
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind


def fake_passed_run(remove: Path):
    def run_backend(name, hosts, opts, timeout_s, **_kwargs):  # mpi_args, stall_root...: unused here
        shutil.rmtree(remove)  # the plot's directory goes away during the run
        return SmokeReport(name, "passed", checks=24, duration_s=1.0, bench=[
            BenchRow("all_sum", "float32", 1024, 2, 1e-4, 2e-4, 0.01, 0.01),
            BenchRow("all_sum", "float32", 2048, 2, 2e-4, 3e-4, 0.01, 0.01)])
    return run_backend


@pytest.mark.parametrize("as_json", [False, True])
def test_smoke_plot_failure_after_the_run_keeps_the_report(as_json, tmp_path, monkeypatch):
    """A plot that cannot be written after the run lost the table and the
    verdict; now they are printed, then the plot error, exit 1."""
    plots = tmp_path / "plots"
    plots.mkdir()
    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", fake_passed_run(plots))
    result = invoke("smoke", "--local", "2", "--backend", "ring", "--bench",
                    "--plot", str(plots / "bw.png"), *(["--json"] if as_json else []))
    assert result.exit_code == 1, result.output
    if as_json:
        data = json.loads(result.stdout)
        assert data["backends"][0]["status"] == "passed" and data["exit_code"] == 1
        assert "cannot write plot" in data["plot_error"]
    else:
        out = result.output
        assert "✓ ring" in out and "busbw GB/s" in out
        assert out.index("smoke passed") < out.index("error: cannot write plot")


def test_smoke_plot_written_in_the_format_of_its_extension(tmp_path, monkeypatch):
    keep = tmp_path / "other"
    keep.mkdir()
    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", fake_passed_run(keep))
    result = invoke("smoke", "--local", "2", "--backend", "ring", "--bench",
                    "--plot", str(tmp_path / "bw.svg"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bw.svg").read_text().lstrip().startswith("<?xml")


# ---- smoke --hostfile backend ----------------------------------------------------------

def jaccl_ring_hostfile(tmp_path: Path) -> Path:
    """What `hostfile generate --backend jaccl-ring` writes for two hosts."""
    path = tmp_path / "jr.json"
    path.write_text(json.dumps({"backend": "jaccl-ring", "envs": [], "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [None, "rdma_en1"]},
        {"ssh": "127.0.0.1", "ips": ["127.0.0.2"], "rdma": ["rdma_en2", None]}]}))
    return path


def test_smoke_refuses_a_hostfile_backend_it_does_not_test(tmp_path, monkeypatch):
    """A jaccl-ring hostfile silently ran every backend, starting with ring."""
    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", no_run)
    result = invoke("smoke", "--hostfile", str(jaccl_ring_hostfile(tmp_path)))
    assert result.exit_code == 2, result.output
    assert "for the jaccl-ring backend, which smoke does not test" in result.output
    assert "pass --backend" in result.output


def test_smoke_backend_flag_overrides_the_hostfile_backend(tmp_path, monkeypatch):
    ran = []

    def run_backend(name, hosts, opts, timeout_s, **_kwargs):
        ran.append(name)
        return SmokeReport(name, "passed", checks=1, duration_s=1.0)

    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", run_backend)
    result = invoke("smoke", "--hostfile", str(jaccl_ring_hostfile(tmp_path)), "--backend", "ring")
    assert (result.exit_code, ran) == (0, ["ring"]), result.output


# ---- a --python that does not exist here -----------------------------------------------

@pytest.mark.parametrize("command", ["smoke", "train"])
def test_local_runs_refuse_a_missing_python(command, monkeypatch, hosts_run_by):
    monkeypatch.setattr("mlxcluster.cli.smoke.run_backend", no_run)
    hosts_run_by(FakeSsh(default=None))  # no host is asked anything
    result = invoke(command, "--local", "2", "--python", "/nonexistent/python")
    assert result.exit_code == 2, result.output
    assert "python not found: /nonexistent/python" in result.output


# ---- train: the trainer's config and values, checked here before launch ----------------

@pytest.mark.parametrize("args,needle", [
    (["--config", "adir"], "config adir is a directory, not a YAML file"),
    (["--config", "tiny", "--", "--config", "adir"], "config adir is a directory"),
    (["--config", "bad.yaml"], "config bad.yaml is not valid YAML"),
    (["--config", "keys.yaml"], "not valid YAML: found unhashable key"),
    (["--config", "tiny", "--", "--lr", "nan"], "lr nan: must be a finite number"),
    (["--config", "tiny", "--", "--global_batch", "0"], "global_batch 0: must be at least 1"),
    (["--config", "tiny", "--", "--steps", "-5"], "steps -5: must be at least 1"),
])
def test_train_refuses_bad_trainer_config_before_launch(args, needle, tmp_path, monkeypatch, hosts_run_by):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "bad.yaml").write_text("steps: [1\n")
    (tmp_path / "keys.yaml").write_text("{[1]: 2}\n")
    hosts_run_by(FakeSsh(default=None))  # no host is asked anything
    monkeypatch.setattr("mlxcluster.launch.trainer.run_job", no_run)
    result = invoke("train", "--local", "2", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_train_config_named_like_a_folder_here_says_which(tmp_path, monkeypatch, hosts_run_by):
    """`train --config tiny` run in a directory holding a folder 'tiny'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    hosts_run_by(FakeSsh(default=None))  # no host is asked anything
    result = invoke("train", "--local", "2", "--config", "tiny")
    assert result.exit_code == 2, result.output
    assert "--config tiny is ambiguous" in result.output and "configs/tiny.yaml" in result.output


# ---- train -- --help --------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--local", "2", "--config", "tiny", "--", "--help"],
                                  ["--", "-h"]])
def test_train_passes_help_to_the_trainer(args, monkeypatch, hosts_run_by):
    """`train ... -- --help` printed the trainer's help, then 'error: trainer
    arguments rejected', exit 2."""
    hosts_run_by(FakeSsh(default=None))  # no host is asked anything
    monkeypatch.setattr("mlxcluster.launch.trainer.run_job", no_run)
    result = invoke("train", *args)
    assert result.exit_code == 0, result.output
    assert "usage: python -m reference_train.train" in result.output
    assert "--global_batch" in result.output and "error" not in result.output


# ---- train --out, for ranks on this machine -----------------------------------------------

@pytest.mark.parametrize("out,needle", [("afile", "--out afile exists and is not a directory"),
                                        ("afile/sub", "afile is not a directory"),
                                        ("/proc/mlxcluster-nope", "cannot be created")])
def test_train_local_out_checked_before_launch(out, needle, tmp_path, monkeypatch, hosts_run_by):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    hosts_run_by(FakeSsh(default=None))  # no host is asked anything
    monkeypatch.setattr("mlxcluster.launch.trainer.run_job", no_run)
    result = invoke("train", "--local", "2", "--config", "tiny", "--", "--out", out)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the probe left nothing


def test_train_local_out_that_can_be_made_passes_the_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launched = []
    monkeypatch.setattr("mlxcluster.launch.trainer.run_job",
                        lambda job, *a, **k: launched.append(job) or RunOutcome(0, seconds=0.1))
    result = invoke("train", "--local", "2", "--no-preflight", "--config", "tiny", "--",
                    "--out", "runs/new/deeper")
    assert result.exit_code == 0, result.output
    assert len(launched) == 1
    # the out check's probe left nothing; the run's record (its log) is kept here
    made = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert made == ["runs", "runs/new", "runs/new/deeper", "runs/new/deeper/train.log"]
    assert launched[0].env["MLXCLUSTER_RECORD"] == "1"


# ---- demo ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--workdir", "afile/sub"], "afile/sub cannot be used: Not a directory"),
    (["--workdir", "/proc/mlxdemo"], "--workdir /proc/mlxdemo cannot be used"),
    (["--config", "bogus"], "no config 'bogus'"),
    (["--config", "tiny", "--steps", "3", "--workdir", "afile/sub"], "Not a directory"),
])
def test_demo_input_checked_before_the_first_step(args, needle, tmp_path, monkeypatch):
    """A bad --workdir was a NotADirectoryError / FileNotFoundError traceback;
    --config bogus was found only at the last step, after doctor and both smokes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr("mlxcluster.demo._run_streaming", no_run)
    result = invoke("demo", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "== doctor" not in result.output
