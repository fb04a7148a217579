"""Hosts with nothing of this project: `mlxcluster train` and `run` send what
the ranks import (the rank wrapper, reference_train) to each host's own
~/.cache/mlxcluster/code/<version>/, and the ranks import it from there;
launched again, they send nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from tests import waits
from tests.lab.jobs import REPO, data_here, training_setup

pytestmark = pytest.mark.lab

# Uncompiled, on MLX's own kernels: every lab host starts with an empty MLX kernel cache,
# and compiling it takes a minute or more (tests/lab/test_lora_lab.py).
QUICK = ("--compile", "false", "--kernels", "mlx")
SCRIPT = """\
import os, socket
import mlxcluster.jobs.rank_wrapper as wrapper
import reference_train.config as config
print("rank", os.environ.get("MLX_RANK"), socket.gethostname(), wrapper.__file__, config.__file__)
"""


def code_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("code: ")]


def test_hosts_without_the_project_train_and_run_and_a_second_launch_sends_nothing(
        make_lab, lab_data, tmp_path):
    lab = make_lab(2, no_project=True)
    for h in lab.hosts:  # the checkout is not there, the python (with mlx) is
        assert not lab.host_exists(h, REPO / "mlxcluster" / "__init__.py")
        assert lab.ssh(h, f"{lab.python} -c 'import mlx.core'").returncode == 0
    inventory, env = training_setup(lab, tmp_path)
    env.pop("PYTHONPATH")  # nothing of the checkout on the way to the hosts either
    data = data_here(lab, lab_data)
    script = lab.disk / "prog.py"
    script.write_text(SCRIPT)

    def mlxcluster(*args: str) -> tuple[subprocess.CompletedProcess, float]:
        start = time.monotonic()
        proc = waits.run([sys.executable, "-m", "mlxcluster", *args], env=env, cwd=tmp_path)
        took = time.monotonic() - start
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc, took

    def train(*flags: str) -> tuple[subprocess.CompletedProcess, float]:
        out = lab.disk / f"run-{uuid.uuid4().hex[:8]}"
        return mlxcluster("train", "-i", str(inventory), "--config", "tiny", *flags, "--",
                          "--steps", "2", "--data", str(data), "--out", str(out),
                          "--sample_tokens", "0", *QUICK)

    def run() -> tuple[subprocess.CompletedProcess, float]:
        return mlxcluster("run", "-i", str(inventory), "--no-preflight", "--logs",
                          str(tmp_path / f"logs-{uuid.uuid4().hex[:6]}"), "--", "python", str(script))

    # First launch, with the preflight (its probe imports the trainer on every host from
    # the folder just sent): each host is sent every file, verified there.
    first, took_first = train()
    version = re.search(r"~/\.cache/mlxcluster/code/([0-9a-f]{64})", first.stdout).group(1)
    folder = f"~/.cache/mlxcluster/code/{version}"
    for h in lab.hosts:
        assert re.search(rf"^code: {h.name}: {folder} missing: sending \d+ file\(s\)",
                         first.stdout, re.M), first.stdout[-3000:]
        assert re.search(rf"^code: {h.name}: sent .* sha256 verified there", first.stdout, re.M)
        # in the host's own home: sent to each host, not seen by another one
        assert (lab.host_home(h) / ".cache/mlxcluster/code" / version /
                "reference_train/train.py").is_file()
    assert "[✓] smoke: all_sum over 2 ranks on ring = 2" in first.stdout
    assert "train finished on 2 rank(s)" in first.stdout

    # Then train and run again, without the preflight: every host has this version,
    # nothing of the code is sent; the ranks import it from their own folder.
    again, took_again = train("--no-preflight")
    ran, took_run = run()
    ran_again, took_run_again = run()
    for proc in (again, ran, ran_again):
        lines = code_lines(proc.stdout)
        assert len(lines) == 2 and not [line for line in lines if "sen" in line], proc.stdout
        for h in lab.hosts:
            assert re.search(rf"^code: {h.name} has {folder} \(\S+ \S+, sha256 checked\)$",
                             proc.stdout, re.M), proc.stdout
    assert "train finished on 2 rank(s)" in again.stdout
    cached = f"{lab.home}/.cache/mlxcluster/code/{version}"  # each host's own home, one path
    for proc in (ran, ran_again):
        for rank, h in enumerate(lab.hosts):
            assert (f"[{rank}] rank {rank} {h.name} {cached}/mlxcluster/jobs/rank_wrapper.py "
                    f"{cached}/reference_train/config.py") in proc.stdout, proc.stdout[-3000:]
    print(f"no project on the hosts: train with preflight (code sent) {took_first:.1f} s, "
          f"again {took_again:.1f} s; run {took_run:.1f} s, again {took_run_again:.1f} s")
