"""The CLI entry points and the demo."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

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


def test_demo_runs_real_ring_and_mpi_all_sum(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--ranks", "2", "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "[✓] all_sum ring" in result.output and "every rank got 3" in result.output
    assert "[✓] all_sum mpi" in result.output
