"""mlx.launch without its busy loop (mlxcluster/jobs/quiet_launch.py): the
real mlx.launch, run through the shim, on real ranks; the fallback to the
plain script where mlx is not laid out as the shim expects."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from mlxcluster.jobs import process, quiet_launch
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.jobs.plan import free_port_block, mlx_launch_path
from tests.cpu_support import cpu_seconds_until_exit

MLX_LAUNCH = mlx_launch_path()
HERE = tuple(local_hosts(2, sys.executable))


def test_the_installed_mlx_launch_is_the_one_the_shim_was_written_for():
    """If a new mlx changes its launcher, this says so (the shim would then
    run the plain script: correct, but busy again)."""
    import mlx._distributed_utils.launch as launch

    assert quiet_launch.patchable(launch)
    assert not quiet_launch.patchable(os)  # a module without the launcher's loops


def test_patient_select_never_reports_a_writable_fd_and_waits_at_most_wake_s(monkeypatch):
    asked = []
    monkeypatch.setattr(select, "select", lambda r, w, x, t: asked.append((r, w, x, t)) or (r[:1], w, []))
    assert quiet_launch.patient_select([3, 4], [5], [], 1.0) == ([3], [], [])
    assert quiet_launch.patient_select([], [5], [], None) == ([], [], [])
    assert quiet_launch.patient_select([3], [], [], 0) == ([3], [], [])  # a poll stays a poll
    assert asked == [([3, 4], [], [], quiet_launch.WAKE_S), ([], [], [], quiet_launch.WAKE_S),
                     ([3], [], [], 0)]


def test_mlx_launch_of_ranks_all_here_runs_through_the_shim_with_its_own_python():
    """Every rank on this machine (--local): the shim. A rank on another host:
    mlx.launch as it is (measured faster there). mpirun: as it is."""
    here = tuple(local_hosts(2, sys.executable))
    launch = [MLX_LAUNCH, "--hostfile", "h.json", "--", "prog.py"]
    argv = process.launcher_argv(launch, here)
    python = Path(MLX_LAUNCH).read_text().splitlines()[0][2:].strip()
    assert argv[0] == python and argv[1] == "-c"
    assert argv[3:] == launch
    elsewhere = replace(here[1], name="mac2", ssh="mac2", ips=("10.0.0.2",))
    assert not elsewhere.is_local
    assert process.launcher_argv(launch, (here[0], elsewhere)) == launch
    assert process.launcher_argv(["/usr/bin/mpirun", "-np", "2"], here) == ["/usr/bin/mpirun", "-np", "2"]


def test_a_launcher_script_without_a_python_line_runs_as_it_is(tmp_path):
    script = tmp_path / "mlx.launch"
    script.write_text("#!/bin/sh\nexec true\n")
    assert quiet_launch.command(str(script), ["-n", "2"]) == [str(script), "-n", "2"]
    assert quiet_launch.command(str(tmp_path / "missing"), []) == [str(tmp_path / "missing")]


def test_where_mlx_is_not_as_expected_the_plain_script_runs(tmp_path):
    """A python whose mlx has no _distributed_utils.launch (an older or newer
    layout): the shim execs the script itself, with its arguments."""
    shadow = tmp_path / "shadow" / "mlx"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    script = tmp_path / "mlx.launch"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('plain', sys.argv[1:])\n")
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    out = subprocess.run(quiet_launch.command(str(script), ["--x", "1"]), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "plain ['--x', '1']\n"


SLEEPER = """
import sys, time
import mlx.core as mx
g = mx.distributed.init(strict=True, backend="any")
total = mx.distributed.all_sum(mx.array([1.0])).item()
time.sleep(3)
print(f"rank {g.rank()} of {g.size()}: {total:.0f}", flush=True)
sys.exit(5 if g.rank() == 1 and len(sys.argv) > 1 else 0)
"""


def launcher_cpu_seconds(argv: list[str], cwd: Path) -> tuple[float, int, str]:
    """Run a launcher command as the jobs layer starts it; its CPU seconds
    (user + system, sampled until it ends), exit code and output."""
    running = process.start(argv, merge_stderr=True)
    cpu = cpu_seconds_until_exit(running.proc)
    running.proc.wait(timeout=60)
    running.join(timeout=10)
    return cpu, running.proc.returncode, "\n".join(line for _, line in running.rest())


def test_the_launcher_waits_instead_of_spinning_and_still_reports_every_rank(tmp_path):
    """Two local ranks that sleep 3 s: through the shim the launcher uses a
    fraction of a CPU-second (the plain mlx.launch loops for the whole job:
    0.84 of a core, and the ranks' steps took 2x as long beside it,
    bench/launcher_cpu.py --local 2); every rank's line arrives, and a
    failing rank is still reported."""
    prog = tmp_path / "sleeper.py"
    prog.write_text(SLEEPER)
    base = [MLX_LAUNCH, "-n", "2", "--backend", "ring", "--python", sys.executable,
            "--starting-port", str(free_port_block(2)), "--"]
    quiet_cpu, code, out = launcher_cpu_seconds(process.launcher_argv([*base, str(prog)], HERE), tmp_path)
    assert code == 0, out
    assert "rank 0 of 2: 2" in out and "rank 1 of 2: 2" in out
    assert quiet_cpu < 0.5, quiet_cpu
    base[-2] = str(free_port_block(2))
    _, failed, failed_out = launcher_cpu_seconds(process.launcher_argv([*base, str(prog), "fail"], HERE),
                                                 tmp_path)
    # mlx.launch itself exits 0 when a rank fails (the jobs layer reads this line)
    assert "Node with rank 1 exited with code 5" in failed_out, failed_out
