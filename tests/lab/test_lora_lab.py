"""QLoRA of a 4-bit mlx-lm folder over three lab hosts by `mlxcluster train`,
every host on its own disk (as Macs are): the model folder and the data are
on this machine's disk only and `train` sends them; the run stops half way
and is resumed; its losses equal one uninterrupted process's; the adapters
land here too (rank 0 sends them in the record) and mlx-lm opens them on
the 4-bit folder.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import mlx.core as mx
import pytest

from reference_train import prepare
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder, train_tokenizer
from tests.lab.jobs import training_setup
from tests.lab.test_resume_lab import on_host
from tests.train_support import run_trainer, train_losses

pytestmark = pytest.mark.lab

STEPS = 4
ARGS = ["--config", "tiny", "--fine_tune", "lora", "--lora_rank", "4", "--lora_layers", "-1",
        "--steps", str(STEPS), "--global_batch", "6", "--block_size", "32", "--eval_every", "0",
        "--sample_tokens", "0", "--log_every", "1", "--checkpoint_every", "2"]


def test_qlora_over_three_own_disks_resumes_exactly_and_lands_here(lab3, tmp_path):
    from mlx_lm.utils import load

    here = lab3.disk / f"qlora-{uuid.uuid4().hex[:8]}"  # this machine's own disk
    model = make_llama_folder(here / "tiny-4bit", LLAMA3_CONFIG, tokenizer=train_tokenizer(),
                              quantize=True)
    data = here / "data"
    assert prepare.main(["--out", str(data), "--tokenizer", str(model), "--stories", "100"]) == 0
    # The reference: one process, uninterrupted.
    alone = tmp_path / "alone"
    proc = run_trainer([*ARGS, "--init_from", str(model), "--data", str(data), "--out", str(alone)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = train_losses(alone)

    out = lab3.disk / f"qlora-out-{uuid.uuid4().hex[:8]}"
    inventory, env = training_setup(lab3, tmp_path)

    def train(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
             "--stall-timeout", "60s", "--timeout", "100", "--", *ARGS, "--init_from",
             str(model), "--data", str(data), "--out", str(out), *more],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)

    first = train("--stop_after", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for h in lab3.hosts:  # both folders sent to every host, checked there
        assert f"model: {h.name}: {model} missing: sending" in first.stdout, first.stdout[-3000:]
        assert f"data: {h.name}: {data} missing: sending" in first.stdout
    assert "the base frozen and quantized" in first.stdout, first.stdout[-3000:]
    second = train("--resume", "auto")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    got = train_losses(out)  # the record kept here, across both launches
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst < 1e-4, (got, want)

    copies = [on_host(lab3, i, out / "adapters") for i in range(3)]
    mine = (out / "adapters" / "adapters.safetensors").read_bytes()  # sent by rank 0's host
    assert all((c / "adapters.safetensors").read_bytes() == mine for c in copies)
    assert (out / "adapter_config.json").exists() is False
    theirs, _ = load(str(model), adapter_path=str(out / "adapters"))
    reference, _ = load(str(model), adapter_path=str(alone / "adapters"))
    ids = mx.array([[5, 17, 42, 7]])
    assert mx.abs(theirs(ids) - reference(ids)).max().item() < 1e-3
