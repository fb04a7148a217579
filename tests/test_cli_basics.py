"""The CLI entry points and the demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import reference_train
from mlxcluster import __version__
from mlxcluster.cli import main
from mlxcluster.errors import InventoryError


def test_version_and_help():
    runner = CliRunner()
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0 and "demo" in result.output


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "mlxcluster", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_a_command_imports_only_its_own_modules_and_help_lists_every_one():
    """`mlxcluster run` starts without importing tune, demo or the smoke
    worker (their imports took most of a short run's start-up); --help
    still lists every command."""
    probe = ("import sys; from mlxcluster.cli import main; main.get_command(None, 'run'); "
             "print(sorted(m for m in sys.modules if m.startswith('mlxcluster.cli.')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    loaded = proc.stdout.strip()
    assert "'mlxcluster.cli.run'" in loaded, proc.stderr
    for other in ("tune", "demo", "smoke", "topology", "discover", "hostfile"):
        assert f"'mlxcluster.cli.{other}'" not in loaded, loaded
    listed = CliRunner().invoke(main, ["--help"]).output
    for name in ("demo", "discover", "doctor", "hostfile", "report", "run", "smoke", "topology",
                 "train", "tune"):
        assert f"\n  {name} " in listed, listed


def test_library_errors_become_message_and_exit_code_without_traceback():

    @main.command("explode-for-test")
    def explode():
        raise InventoryError("inv.yaml", ["inv.yaml:3: 'python' is missing"])

    try:
        result = CliRunner().invoke(main, ["explode-for-test"])
    finally:
        main.commands.pop("explode-for-test")
    assert result.exit_code == 2
    assert "inv.yaml:3: 'python' is missing" in result.output
    assert "fix:" in result.output and "Traceback" not in result.output


def test_demo_runs_every_stage_for_real(tmp_path, monkeypatch):
    """The README's `make demo`: doctor, hostfiles, smoke on ring and MPI and a
    short training run, each through the real command on local ranks."""
    monkeypatch.chdir(tmp_path)  # its steps run here: a smoke's hang report goes to ./runs/
    result = CliRunner().invoke(main, ["demo", "--ranks", "2", "--steps", "6", "--config", "tiny",
                                       "--workdir", str(tmp_path), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = result.output.split("summary", 1)[1]
    for step in ("doctor", "hostfile ring", "hostfile mpi", "smoke ring", "smoke mpi", "train"):
        assert f"[✓] {step} " in summary, summary
    assert "6 steps, loss" in summary and "demo: all 6 steps passed" in summary
    # It ends with the HTML page of all of it (docs/report.md).
    assert result.output.rstrip().splitlines()[-1] == f"report: {tmp_path / 'report.html'}"
    page = (tmp_path / "report.html").read_text()
    for section in ('id="checks"', 'id="facts"', 'id="smoke"', 'id="train-1"'):
        assert section in page
    assert json.loads((tmp_path / "smoke-ring.json").read_text())["ok"]
    hostfile = json.loads((tmp_path / "hostfile-ring.json").read_text())
    assert [h["ssh"] for h in hostfile["hosts"]] == ["127.0.0.1", "127.0.0.1"]
    assert (tmp_path / "hostfile-mpi.txt").read_text() == "127.0.0.1 slots=1\n127.0.0.1 slots=1\n"
    metrics = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2, 3, 4, 5, 6]


def test_demo_reports_a_failing_step(tmp_path, monkeypatch):
    """A step that fails is shown as failed and the demo exits 1 (never pretends)."""
    monkeypatch.chdir(tmp_path)  # its steps run here: a smoke's hang report goes to ./runs/
    # A config that loads alone but does not fit the run: 7 sequences do not
    # divide between 2 ranks (the train step refuses it before launch, exit 2).
    config = tmp_path / "odd.yaml"
    tiny = (Path(reference_train.__file__).parent / "configs" / "tiny.yaml").read_text()
    assert "global_batch: 8 " in tiny
    config.write_text(tiny.replace("global_batch: 8 ", "global_batch: 7 "))
    result = CliRunner().invoke(main, ["demo", "--ranks", "2", "--steps", "1", "--config",
                                       str(config), "--workdir", str(tmp_path / "work"), "--quiet"])
    assert result.exit_code == 1, result.output
    assert "[✗] train" in result.output and "[✓] smoke mpi" in result.output


def test_nan_is_refused_for_every_duration_flag():
    """click's FloatRange accepts 'nan', and a NaN deadline never expires."""
    runner = CliRunner()
    for args in (["smoke", "--local", "2", "--phase-timeout", "nan"],
                 ["doctor", "--local", "--connect-timeout", "nan"],
                 ["train", "--local", "2", "--timeout", "nan"],
                 ["discover", "--timeout", "nan"],
                 ["discover", "--connect-timeout", "NaN"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        # Seconds says "not a number of seconds"; Duration (train) "not a duration".
        assert "is not a number of seconds" in result.output or \
            "is not a duration" in result.output, (args, result.output)
