"""inventory/example.yaml, as it is but for the lab's addresses, read by every
command it documents on three lab hosts: doctor, hostfile generate, smoke
(ring and MPI), run and train. Every field of it takes effect:

- studio-2's ``port: 2222``: its port 22 is firewalled, so every command
  (our own ssh and paramiko calls, mlx.launch's and mpirun's ssh) must use
  the inventory's port;
- ``user:`` (cluster and host): in the hostfiles generate writes;
- mini-1's own ``env:``: its rank, and only its rank, sees the value;
- studio-2's two data IPs: the second on a second link (eth1).

The lab logs in as root (users me and admin do not exist there), and the
example's hosts' names are the lab's addresses and Host aliases."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests import waits
from tests.lab import SECOND_SSH_PORT
from tests.lab.jobs import REPO, bracketed, data_here, left_on_hosts

pytestmark = pytest.mark.lab

EXAMPLE = REPO / "inventory" / "example.yaml"

PRINTS_ITS_ENV = """
import os
import mlx.core as mx
g = mx.distributed.init(strict=True, backend="any")
total = mx.distributed.all_sum(mx.array([1.0])).item()
print(f"rank {g.rank()} sum {total:g} MLX_IBV_DEVICES={os.environ.get('MLX_IBV_DEVICES')} "
      f"MLX_METAL_FAST_SYNCH={os.environ.get('MLX_METAL_FAST_SYNCH')}")
"""


def lab_example(lab, path: Path) -> Path:
    """example.yaml with the lab's python, ssh config, user and addresses put in."""
    h1, h2, h3 = lab.hosts
    text = EXAMPLE.read_text()
    for old, new in (("user: me", "user: root"), ("user: admin", "user: root"),
                     ("/opt/venv/bin/python", str(lab.python)), ("~/.ssh/config", str(lab.ssh_config)),
                     ("studio-1.local", h1.ip), ("192.168.1.21", h1.ip),
                     ("192.168.1.22", h2.ip), ("10.0.0.2", h2.second_ip),
                     ("ssh: mini-1", f"ssh: {h3.name}"), ("192.168.1.23", h3.ip)):
        assert old in text, old  # the example still has what this test replaces
        text = text.replace(old, new)
    assert f"port: {SECOND_SSH_PORT}" in text  # the port the lab's sshd also listens on
    path.write_text(text)
    return path


def mlxcluster(lab, tmp_path, *args) -> waits.subprocess.CompletedProcess:
    env = lab.env()
    env["PYTHONPATH"] = str(REPO)
    env.pop("LD_PRELOAD", None)
    return waits.run([sys.executable, "-m", "mlxcluster", *args], env=env, cwd=tmp_path)


def test_the_example_inventory_works_with_every_command_it_documents(make_lab, tmp_path, lab_data):
    lab = make_lab(3)
    lab.add_second_link()
    studio2 = lab.hosts[1]
    inventory = lab_example(lab, tmp_path / "example.yaml")
    lab.drop_port(studio2, 22)  # studio-2 answers on its inventory port only
    assert lab.ssh(studio2, "true", timeout=30).returncode != 0
    inv = str(inventory)
    said, run_ids = {}, []

    doctor = mlxcluster(lab, tmp_path, "doctor", "-i", inv)
    said["doctor"] = doctor
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]

    for backend in ("ring", "mpi"):
        out = tmp_path / f"{backend}.hosts"
        generated = mlxcluster(lab, tmp_path, "hostfile", "generate", "-i", inv, "--backend", backend,
                               "-o", str(out))
        assert generated.returncode == 0, generated.stdout + generated.stderr
        text = out.read_text()
        targets = ([h["ssh"] for h in json.loads(text)["hosts"]] if backend == "ring"
                   else [line.split()[0] for line in text.splitlines()])
        assert targets == [f"root@{lab.hosts[0].ip}", f"root@{studio2.ip}",
                           f"root@{lab.hosts[2].name}"], text

        smoke = mlxcluster(lab, tmp_path, "smoke", "-i", inv, "--backend", backend)
        said[f"smoke {backend}"] = smoke
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-2000:]

        script = tmp_path / f"env_{backend}.py"
        script.write_text(PRINTS_ITS_ENV)
        run = mlxcluster(lab, tmp_path, "run", "-i", inv, "--backend", backend, "--no-preflight",
                         "--", "python", str(script))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        found = sorted(re.findall(r"rank (\d) sum 3 MLX_IBV_DEVICES=(\S+) MLX_METAL_FAST_SYNCH=(\S+)",
                                  run.stdout))
        assert found == [("0", "None", "0"), ("1", "None", "0"), ("2", "/Users/me/ibv.json", "0")], \
            run.stdout[-3000:]
        run_ids.append(re.search(r"run (mlxrun-[0-9a-f]+):", run.stdout).group(1))

    # With its preflight (doctor's checks and the host probe), which stops a launch it refuses.
    train = mlxcluster(lab, tmp_path, "train", "-i", inv, "--backend", "ring", "--config", "tiny",
                       "--", "--steps", "2", "--global_batch", "6",
                       "--data", str(data_here(lab, lab_data)), "--out", str(lab.disk / "example-run"),
                       "--sample_tokens", "0")
    said["train"] = train
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-2000:]
    assert "train finished on 3 rank(s)" in train.stdout
    for name, proc in said.items():
        assert "Traceback" not in proc.stderr, (name, proc.stderr[-2000:])
    lab.heal(studio2)  # the lab's own ssh (port 22) looks at every host
    for run_id in run_ids:
        assert left_on_hosts(lab, bracketed(run_id)) == {}
