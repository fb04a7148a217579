"""QLoRA over the lab's hosts by `mlxcluster train` (issue 29): a 4-bit mlx-lm folder and
masked chat data on this machine's disk only, sent by train to every host; only the adapters
train; the run stops half way on three hosts, resumes with --elastic, loses a host's link and
goes on with two: the losses of one uninterrupted process at every step; the hosts that ran
to the end write OUT/adapters, and the record brings the same adapters to --out here, which
the real mlx-lm opens on the 4-bit base.

The ranks run uncompiled and on MLX's own kernels (``--compile false --kernels mlx``): on
Linux's CPU, MLX compiles each fused graph with the C++ compiler into the host's
``$TMPDIR/mlx/<version>/cpu`` the first time it meets it, and every lab host starts with an
empty TMPDIR of its own, as a Mac just booted does. Measured here for this very run, one
process on a quiet machine: 69 s cold (54 kernels) against 2.6 s warm, and 2.4 s
uncompiled; three cold ranks on two cores outlast any short test. Compiled LoRA training and
its equality with uncompiled are tested in one process (tests/test_lora.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import mlx.core as mx
import pytest

from tests import waits
from tests.chat_support import make_chat_folder
from tests.hf_support import make_llama_folder
from tests.lab.jobs import lose_link_at_step, on_host, records, training_setup
from tests.learning_support import MODEL_CONFIG as CONFIG
from tests.learning_support import learning_data
from tests.train_support import read_metrics, run_trainer

pytestmark = pytest.mark.lab

STEPS = 40
LOSE_AT = 12  # the step after which labhost3's link goes down


def trainer_flags(model, data) -> list[str]:
    return ["--config", "tiny", "--steps", str(STEPS), "--global_batch", "12",
            "--block_size", "64", "--eval_every", "0", "--sample_tokens", "0",
            "--log_every", "1", "--checkpoint_every", "2", "--fine_tune", "lora",
            "--lora_layers", "-1", "--lr", "1e-2", "--compile", "false", "--kernels", "mlx",
            "--init_from", str(model), "--data", str(data)]


def losses(rows) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_qlora_stops_resumes_loses_a_host_and_mlx_lm_opens_the_adapters(lab3, tmp_path):
    from mlx_lm.utils import load

    here = lab3.disk / f"qlora-{uuid.uuid4().hex[:8]}"  # this machine's own disk
    model = here / "tiny-4bit"
    make_chat_folder(model, "llama3")
    make_llama_folder(model, CONFIG, seed=3, quantize=True)
    data = learning_data(model, here / "data", True, n=96)
    out = lab3.disk / f"qlora-out-{uuid.uuid4().hex[:8]}"
    inventory, env = training_setup(lab3, tmp_path)

    def train(ours: list[str], trainers: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
             "--stall-timeout", "10s", "--timeout", "240", *ours, "--",
             *trainer_flags(model, data), "--out", str(out), *trainers],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)

    first, _ = waits.communicate(train([], ["--stop_after", "2"]), "the first QLoRA run", paths=[out])
    for h in lab3.hosts:  # the 4-bit folder and the rows sent to every host
        # the first host sent from here, the others taking it from that host (fanout.py)
        assert re.search(rf"model: {h.name}: {re.escape(str(model))} missing: (sending|taking)", first), first[-3000:]
        assert f"data: {h.name}: {data} missing: sending" in first
    assert "the base frozen and quantized" in first and "step      2/40" in first, first[-3000:]
    assert "step      3/40" not in first

    victim = lab3.hosts[2]
    job = train(["--max-restarts", "1", "--elastic"], ["--resume", "auto"])
    second, _ = lose_link_at_step(lab3, job, out / "metrics.jsonl", LOSE_AT, victim)
    assert job.returncode == 0, second[-4000:]
    assert "at step 2" in second and f"model: {lab3.hosts[0].name}: {model} missing" \
        not in second  # already there
    assert f"dropped {victim.name} (unreachable over ssh): going on with 2 rank(s)" in second
    assert "grad_accum 1 -> 2: the global batch stays 12 = 2 ranks x 2 accum x 3" in second
    assert "train finished on 2 rank(s)" in second, second[-3000:]

    reference = tmp_path / "reference"
    proc = run_trainer([*trainer_flags(model, data), "--out", str(reference)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = losses(read_metrics(reference))
    got = losses(records(out / "metrics.jsonl"))  # the record, here
    assert sorted(got) == list(range(1, STEPS + 1)), got
    for step, loss in expected.items():
        assert abs(got[step] - loss) <= 1e-5 * abs(loss), (step, got[step], loss)

    log = (out / "train.log").read_text()
    assert (out / "adapters" / "adapters.safetensors").is_file(), (
        second[-3000:], [ln[:200] for ln in log.splitlines() if len(ln) > 300 or "@@" in ln],
        log[-3000:])
    adapters = (out / "adapters" / "adapters.safetensors").read_bytes()  # landed here
    for i in range(2):  # the hosts that ran to the end
        assert (on_host(lab3, i, out / "adapters" / "adapters.safetensors").read_bytes()
                == adapters), (i, second[-6000:], [r for r in records(
                    out / "metrics.jsonl") if "event" in r])
    assert not (out / "checkpoints").exists()  # checkpoints stay on the hosts
    mx.load(str(out / "adapters" / "adapters.safetensors"))
    lm, _ = load(str(model), adapter_path=str(out / "adapters"))
    assert lm(mx.array([[5, 17, 42]])).shape == (1, 3, CONFIG["vocab_size"])
    lab3.end_orphaned_sessions(victim)  # sshd's sessions the cut link left (test_dead_host_lab)
