"""Issue 37 item 7, "From zero, two Macs": a new user's commands on two hosts
set up one by one (tests/lab/two_macs.py: each host its own ``~/.ssh``,
disk and HOME; labhost2 on mlx 0.32.3 without mlx-lm; this machine and
labhost1 on the venv's mlx and mlx-lm), typed with no -i in a folder holding
cluster.yaml:

1. ``mlxcluster doctor --imports mlx_lm`` fails (exit 1) naming labhost2,
   its mlx and its missing mlx-lm, and the fix. With two hosts on two mlx
   versions the versions tie (1 host each): X is this machine's version, as
   for every version fix (mlxcluster/doctor/fixes/version_choice.py).
2. ``mlxcluster doctor --imports mlx_lm --fix --yes`` installs this
   machine's mlx, then its mlx-lm, on labhost2 from wheels fetched here, the
   plan saying which rule chose each, and exits 0.
3. labhost2 imports mlx_lm with this machine's mlx and mlx-lm, and doctor is
   clean (exit 0).
4. ``mlxcluster serve MODEL`` (the model folder on this machine's disk
   only) preflights the two hosts, sends them the model and answers a chat
   request at 127.0.0.1 here with one process's greedy answer; Ctrl-C
   stops it, exit 0.

Needs the package index (pip download) here, as the fixes do.
"""

from __future__ import annotations

import re
import time
import uuid
from importlib import metadata

import pytest

from mlxcluster.jobs.plan import free_port_block
from tests.lab.jobs import assert_nothing_left
from tests.lab.mlx_overlay import OLD
from tests.lab.two_macs import DISTS
from tests.serve_support import Serving, chat_model, chat_text, generated_alone
from tests.waits import SERVE_UP_S

pytestmark = pytest.mark.lab


def test_two_macs_from_zero_doctor_then_fix_mlx_and_mlx_lm_on_the_second_then_serve(two_macs, llama):
    started = time.monotonic()
    mlx, cpu, lm = here = [metadata.version(d) for d in DISTS]  # this machine's, and labhost1's (the same venv)
    second, python = two_macs.second.name, two_macs.lab.python
    assert two_macs.versions(two_macs.first) == here
    assert two_macs.versions(two_macs.second) == [OLD, OLD, "-"]  # no mlx-lm
    assert mlx != OLD  # else there would be no tie to break

    checked = two_macs.mlxcluster("doctor", "--imports", "mlx_lm")
    out = checked.stdout
    assert checked.returncode == 1, out[-4000:] + checked.stderr[-2000:]
    assert "inventory: ./cluster.yaml (current directory)" in checked.stderr
    probed = two_macs.lab.default_python  # the python the inventory's runs, as the probe reports it
    assert f"    {second}: ✗ mlx {OLD} (others: {mlx}) with {probed}" in out, out[-4000:]
    assert (f"    fix: on {second}: {probed} -m pip install mlx=={mlx} (mlx {mlx}: this machine's version (a tie: 1 "
            "host each); or doctor --fix: the wheels fetched here and sent over SSH; doctor --fix --mlx-version V "
            "installs another)") in out
    assert f"    {second}: ✗ no mlx-lm in {python}" in out
    assert f"    fix: on {second}: {python} -m pip install mlx-lm=={lm} (mlx-lm {lm}: on 1 of 2 hosts; " \
           "or doctor --fix --imports mlx_lm" in out
    assert "✗ 2 check(s) failed: mlx-version, mlx-lm-version" in out, out[-1500:]
    checked_s = time.monotonic() - started

    fixed = two_macs.mlxcluster("doctor", "--imports", "mlx_lm", "--fix", "--yes")
    out = fixed.stdout
    assert fixed.returncode == 0, out[-5000:] + fixed.stderr[-2000:]
    where = f"in {python} (Linux x86_64, Python 3.11)"
    assert (f"  [mlx-version] {second}: mlx {OLD} -> mlx {mlx} {where}; "
            f"mlx {mlx}: this machine's version (a tie: 1 host each)\n") in out, out[-5000:]
    assert f"  [mlx-lm-version] {second}: no mlx-lm -> mlx-lm {lm} {where}; mlx-lm {lm}: on 1 of 2 hosts\n" in out
    assert f"  applied   [mlx-version] {second}:" in out and f"  applied   [mlx-lm-version] {second}:" in out
    assert "[✗] -> [✓] mlx importable, the same version everywhere  [mlx-version]" in out, out[-3000:]
    assert "[✗] -> [✓] mlx-lm installed, the same version everywhere (when the job runs it)  [mlx-lm-version]" in out
    fixed_s = time.monotonic() - started - checked_s

    imported = two_macs.imports_mlx_lm(two_macs.second)
    assert imported.returncode == 0 and imported.stdout.split() == [mlx, cpu, lm], imported.stdout + imported.stderr
    assert two_macs.versions(two_macs.first) == here  # labhost1 untouched

    again = two_macs.mlxcluster("doctor", "--imports", "mlx_lm")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert again.stdout.rstrip().endswith("✓ no issues found"), again.stdout[-3000:]  # the BLAS warning fixed too
    assert "[✓] mlx importable, the same version everywhere  [mlx-version]" in again.stdout
    assert "[✓] mlx-lm installed, the same version everywhere (when the job runs it)  [mlx-lm-version]" in again.stdout
    doctor_s = time.monotonic() - started

    # The third command: the model is on this machine's own disk only.
    model = chat_model(llama, two_macs.lab.disk / f"tiny-chat-{uuid.uuid4().hex[:8]}")
    port = free_port_block(1)
    serving = Serving(["--port", str(port), str(model)], env=two_macs.env, cwd=two_macs.folder)
    run_id = None
    try:
        up = serving.wait_for(r"serving (\S+) at (http://\S+) \((\d) ranks, (\w+)\)$", SERVE_UP_S)
        assert up.groups() == (model.name, f"http://127.0.0.1:{port}/v1", "2", "tensor")
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        assert "inventory: ./cluster.yaml (current directory)" in serving.output()
        for host in (two_macs.first, two_macs.second):  # sent to each host's own disk
            assert two_macs.lab.host_exists(host, model / "model.safetensors"), host
        alone = generated_alone(model)
        assert alone and chat_text(port) == alone
    finally:
        code = serving.stop()
    assert code == 0, serving.output()
    assert_nothing_left(two_macs.lab, {"run_id": run_id, "cleanup_problems": []})
    print(f"two Macs from zero: doctor {checked_s:.1f} s, --fix {fixed_s:.1f} s, "
          f"serve up in {time.monotonic() - started - doctor_s:.1f} s, all {time.monotonic() - started:.1f} s")
