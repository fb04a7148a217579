"""The rank wrapper: runs a program unchanged, and dumps every thread's stack
on SIGUSR1 into the rank's file without stopping it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxcluster.jobs.rank_wrapper import rank_of, stacks_dir

REPO = Path(__file__).resolve().parents[1]

WAITER = """
import sys, threading, time
def wait_in_collective():
    print("ready", flush=True)
    time.sleep(60)
def helper():
    time.sleep(60)
threading.Thread(target=helper, name="helper", daemon=True).start()
wait_in_collective()
"""


def wrapped(args, tmp_path, rank="1", **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLX_RANK": rank,
           "MLXCLUSTER_STACKS_DIR": str(tmp_path / "stacks")}
    return [sys.executable, "-X", "mlxcluster_run=mlxtrain-test", "-m", "mlxcluster.jobs.rank_wrapper",
            *args], env


def test_sigusr1_dumps_every_thread_and_the_rank_runs_on(tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    argv, env = wrapped([str(script)], tmp_path)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        pid_line = (tmp_path / "stacks" / "rank1.pid").read_text().split()
        assert int(pid_line[0]) == proc.pid and pid_line[1]
        os.kill(proc.pid, signal.SIGUSR1)
        stacks = tmp_path / "stacks" / "rank1.stacks"
        deadline = time.monotonic() + 10
        while "wait_in_collective" not in stacks.read_text():
            assert time.monotonic() < deadline, stacks.read_text()
            time.sleep(0.05)
        text = stacks.read_text()
        assert "waiter.py" in text and "in helper" in text  # both threads
        assert "rank_wrapper.py" in text  # the main thread runs under the wrapper
        time.sleep(0.2)
        assert proc.poll() is None  # still running
    finally:
        proc.kill()
        proc.wait()


def test_module_runs_as_main_with_its_arguments_and_exit_code(tmp_path):
    pkg = tmp_path / "mod_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "prog.py").write_text(
        "import sys\nif __name__ == '__main__':\n"
        "    print('argv', sys.argv[1:], sys.argv[0].endswith('prog.py'))\n    sys.exit(7)\n")
    argv, env = wrapped(["-m", "mod_pkg.prog", "--steps", "3"], tmp_path)
    proc = subprocess.run(argv, env={**env, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == "argv ['--steps', '3'] True"


def test_script_sees_its_own_directory_first_on_sys_path(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 42\n")
    script = tmp_path / "uses_helper.py"
    script.write_text("import helper_mod, sys\nprint(helper_mod.VALUE, sys.argv)\n")
    argv, env = wrapped([str(script), "a"], tmp_path)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"42 {[str(script), 'a']}"


def test_without_a_program_it_says_how_to_call_it(tmp_path):
    argv, env = wrapped([], tmp_path)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "usage: python -m mlxcluster.jobs.rank_wrapper" in proc.stderr


@pytest.mark.parametrize("environ, want", [
    ({"MLX_RANK": "2"}, "2"), ({"OMPI_COMM_WORLD_RANK": "1"}, "1"), ({"PMIX_RANK": "0"}, "0"),
])
def test_rank_from_either_launcher(environ, want):
    assert rank_of(environ) == want


def test_no_rank_falls_back_to_the_pid_and_dir_to_the_run_id():
    assert rank_of({}) == f"pid{os.getpid()}"
    assert stacks_dir({}, "mlxtrain-ab") == "/tmp/mlxcluster-stacks/mlxtrain-ab"
    assert stacks_dir({"MLXCLUSTER_STACKS_DIR": "/x"}, "mlxtrain-ab") == "/x"


TALKER = """
import os, sys
print("out line")
print("err line", file=sys.stderr)
os.write(1, b"from C level\\nno newline at the end")
raise RuntimeError("boom")
"""


def test_tagged_output_prefixes_every_line_with_the_rank(tmp_path):
    """MLXCLUSTER_TAG_OUTPUT=1: Python's and C-level lines on both streams,
    a last partial line and the traceback all start with '[R] '."""
    script = tmp_path / "talker.py"
    script.write_text(TALKER)
    argv, env = wrapped([str(script)], tmp_path, rank="2")
    proc = subprocess.run(argv, env={**env, "MLXCLUSTER_TAG_OUTPUT": "1"}, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == ["[2] out line", "[2] from C level",
                                        "[2] no newline at the end"]
    err = proc.stderr.splitlines()
    assert err[0] == "[2] err line" and err[-2] == "[2] RuntimeError: boom"
    assert err[-1].startswith("[2] @@mlxcluster-exit 2 1 ")
    assert all(line.startswith("[2] ") for line in err), err


def test_untagged_output_is_unchanged(tmp_path):
    script = tmp_path / "talker.py"
    script.write_text(TALKER)
    argv, env = wrapped([str(script)], tmp_path)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert sorted(proc.stdout.splitlines()) == ["from C level", "no newline at the end", "out line"]
    assert "[1]" not in proc.stdout + proc.stderr and proc.returncode == 1


@pytest.mark.parametrize("ending, code, said", [
    ("sys.exit(3)", 3, None), ("sys.exit('gave up')", 1, "gave up"),
    ("raise ValueError('bad')", 1, "ValueError: bad"), ("sys.exit(0)", 0, None),
])
def test_a_failing_program_ends_at_once_with_its_code(tmp_path, ending, code, said):
    """A failure skips interpreter shutdown (where MPI's finalize waited for
    the other ranks): an atexit handler that would take 20 s does not run;
    a success still runs it (here made short)."""
    script = tmp_path / "ends.py"
    slow = "20" if code else "0.1"
    script.write_text(f"import atexit, sys, time\natexit.register(time.sleep, {slow})\n"
                      f"print('before', flush=True)\n{ending}\n")
    argv, env = wrapped([str(script)], tmp_path)
    start = time.monotonic()
    proc = subprocess.run(argv, env={**env, "MLXCLUSTER_TAG_OUTPUT": "1"}, capture_output=True,
                          text=True, timeout=30)
    assert time.monotonic() - start < 10
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "[1] before\n"
    said_lines = proc.stderr.splitlines()
    if code:  # the last line names the rank, its code and when it failed (hidden by the launcher)
        mark = re.fullmatch(r"\[1\] @@mlxcluster-exit 1 (\d+) (\d+\.\d+)", said_lines.pop())
        assert mark and int(mark.group(1)) == code, proc.stderr
        assert abs(float(mark.group(2)) - time.time()) < 30
    assert "@@mlxcluster-exit" not in "\n".join(said_lines)
    if said:
        assert said_lines[-1] == f"[1] {said}"


@pytest.mark.parametrize("text, kept", [("\n", False), ("", False), ('[["127.0.0.1:5000"]]', True)])
def test_a_blank_mlx_hostfile_is_dropped_a_real_one_kept(tmp_path, text, kept):
    """mlx.launch writes a blank hostfile for one host (init() cannot parse it)."""
    from mlxcluster.jobs.rank_wrapper import drop_blank_hostfile

    path = tmp_path / "hostfile"
    path.write_text(text)
    environ = {"MLX_HOSTFILE": str(path), "MLX_RANK": "0"}
    drop_blank_hostfile(environ)
    assert ("MLX_HOSTFILE" in environ) is kept and environ["MLX_RANK"] == "0"
    missing = {"MLX_HOSTFILE": str(tmp_path / "gone")}
    drop_blank_hostfile(missing)
    assert "MLX_HOSTFILE" in missing  # not ours to judge: init() says what is wrong


HALF_A_LINE = """
import os, sys
os.write(2, b"[ring] Socket ")  # as MLX's C++ writes its errors: in pieces, from its own thread
sys.exit(3)
"""


@pytest.mark.parametrize("tagged", [True, False])
def test_the_exit_line_is_whole_when_another_thread_left_half_a_line(tmp_path, tagged):
    """Seen in CI: MLX's ring thread had written "[ring] Socket " when the
    failing rank wrote its exit line, which then ran on behind it, was not
    read as an exit line and was shown. It goes out as a line of its own."""
    script = tmp_path / "half.py"
    script.write_text(HALF_A_LINE)
    argv, env = wrapped([str(script)], tmp_path, rank="2")
    env = {**env, "MLXCLUSTER_TAG_OUTPUT": "1"} if tagged else env
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    tag = "[2] " if tagged else ""
    lines = proc.stderr.splitlines()
    marks = [ln for ln in lines if "@@mlxcluster-exit" in ln]
    assert len(marks) == 1 and re.fullmatch(rf"{re.escape(tag)}@@mlxcluster-exit 2 3 \d+\.\d+",
                                            marks[0]), lines
    assert len(lines) == 2 and f"{tag}[ring] Socket " in lines, lines
