"""`mlxcluster serve --local 2`: the real mlx-lm server on two real ring
ranks of this machine, at one address; its answer is one process's greedy
answer; Ctrl-C leaves nothing running. Bad input: exit 2 before anything is
launched. (Over hosts on their own disks, with restarts: tests/lab/test_serve_lab.py.)"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.jobs.plan import free_port_block
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from tests import waits
from tests.interrupt_helpers import processes_with
from tests.serve_support import Serving, chat_model, chat_text, generated_alone
from tests.waits import SERVE_STOP_S, SERVE_UP_S


def test_serve_answers_as_one_process_and_ctrl_c_leaves_nothing(llama, tmp_path):
    model = chat_model(llama, tmp_path / "tiny-chat")
    port = free_port_block(1)
    serving = Serving(["--local", "2", "--no-preflight", "--port", str(port), "--probe-every", "2s",
                       str(model)], cwd=tmp_path)
    try:
        up = serving.wait_for(r"serving (\S+) at (http://\S+) \((\d) ranks, (\w+)\)", SERVE_UP_S)
        assert up.groups() == (model.name, f"http://127.0.0.1:{port}/v1", "2", "tensor")
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        answer = chat_text(port)
        assert answer and answer == generated_alone(model)
    finally:
        code = serving.stop()
    assert code == 0, serving.output()
    assert f"every rank of run {run_id} was stopped" in serving.output()
    assert processes_with(run_id) == []
    journal = (tmp_path / "runs" / run_id / "serve.log").read_text().splitlines()
    said = [line.split(" ", 2)[2] for line in journal]  # after the date and time
    assert said[0].startswith(f"launching 2 rank(s) on ring, run {run_id}: mlx-lm's server")
    assert said[1:] == [f"serving {model.name} at http://127.0.0.1:{port}/v1 (2 ranks, tensor)",
                        "stopped: interrupted (SIGINT): the job was stopped on every rank"], journal


def test_bad_input_is_refused_before_anything_is_launched(tmp_path, llama):
    runner = CliRunner()
    no_model = runner.invoke(cli, ["serve", "--local", "2", str(tmp_path)])
    assert no_model.exit_code == 2 and "no config.json" in no_model.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = runner.invoke(cli, ["serve", "--local", "2", "--port", str(port), str(llama)])
    assert busy.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.output
    assert "--port" in busy.output
    timed = runner.invoke(cli, ["serve", "--local", "2", "--timeout", "5m", str(llama)])
    assert timed.exit_code == 2 and "--timeout does not apply" in timed.output


def test_restarts_spent_is_exit_4_naming_the_rank(llama, tmp_path):
    port = free_port_block(1)
    serving = Serving(["--local", "2", "--no-preflight", "--port", str(port), "--max-restarts", "0",
                       str(llama)], cwd=tmp_path)
    try:
        serving.wait_for(r"serving \S+ at http://", SERVE_UP_S)
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        pid = int((Path(STACKS_ROOT) / run_id / "rank1.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        code = serving.proc.wait(timeout=SERVE_STOP_S)
    finally:
        serving.stop()
    assert code == 4, serving.output()
    assert re.search(r"the server stopped: rank 1 exited with code \S+ after 0 restart\(s\) "
                     r"\(--max-restarts 0\)", serving.output()), serving.output()
    assert processes_with(run_id) == []


def test_a_model_whose_heads_do_not_divide_is_refused_before_the_launch(llama):
    refused = CliRunner().invoke(cli, ["serve", "--local", "3", "--no-preflight", "--port",
                                       str(free_port_block(1)), str(llama)])
    assert refused.exit_code == 2, refused.output
    assert "3 ranks do not divide the 4 attention heads and 2 KV heads" in refused.output
    assert "launching" not in refused.output


def test_mlxcluster_stop_ends_serve_and_it_does_not_restart(llama, tmp_path):
    """`mlxcluster stop RUN_ID` from another terminal: the ranks end, and serve
    (--max-restarts 2) keeps that end: exit 143, no restart, nothing left, the
    stop mark gone (jobs/running.py), serve.log saying so."""
    model = chat_model(llama, tmp_path / "tiny-chat")
    port = free_port_block(1)
    serving = Serving(["--local", "2", "--no-preflight", "--port", str(port), "--max-restarts", "2",
                       str(model)], cwd=tmp_path)
    try:
        serving.wait_for(r"serving \S+ at http://\S+", SERVE_UP_S)
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        stopped = waits.run([sys.executable, "-m", "mlxcluster", "stop", "--local", run_id],
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                                 cwd=tmp_path)
        assert f"{run_id} stopped" in stopped.stdout, stopped
        code = serving.proc.wait(timeout=SERVE_STOP_S)
    finally:
        serving.stop()
    said = serving.output()
    assert code == 143, said
    assert f"serve stopped when asked ('mlxcluster stop {run_id}'): every rank ended" in said
    assert "restart 1/2" not in said and "launching" in said and said.count("launching") == 1
    assert processes_with(run_id) == []
    assert not Path(f"{STACKS_ROOT}/{run_id}.stopped").exists()
    journal = (tmp_path / "runs" / run_id / "serve.log").read_text().splitlines()
    assert journal[-1].endswith(f"stopped: asked ('mlxcluster stop {run_id}'): every rank ended")
