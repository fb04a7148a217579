"""Preference training runs as supervised training does (issue 49): the same losses,
rewards, margins and accuracies on 2 and 3 ranks and with accumulation as in one process; a
resumed run the same as an uninterrupted one; `mlxcluster train --local 2 -- --objective
dpo` through the launch path and its record; mlx-lm loads the adapters, and with them the
chosen answers are more likely than the rejected ones on the training prompts; a mismatch of
objective and data is refused before anything trains."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from reference_train.tokenizer import FolderTokenizer
from tests import waits

from .conftest import require
from .preference_support import CHOSEN, pairs, preference_folder, prepared
from .train_support import MLX_LAUNCH, PYTHON, pipelined, read_metrics, run_trainer, trainer_env

KEYS = ("loss", "chosen_reward", "rejected_reward", "reward_margin", "accuracy")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return preference_folder(tmp_path_factory.mktemp("preference"))


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    """The tiny Llama in 4 bits (QLoRA)."""
    return preference_folder(tmp_path_factory.mktemp("quantized"), quantize=True)


def common(folder: Path, data: Path, objective: str, steps: int = 6,
           fine_tune: str = "lora") -> list[str]:
    return ["--init_from", str(folder), "--data", str(data), "--objective", objective,
            "--fine_tune", fine_tune, "--lora_rank", "4", "--lora_layers", "-1",
            "--block_size", "80", "--steps", str(steps), "--global_batch", "8",
            "--log_every", "1", "--eval_every", "0", "--sample_tokens", "0", "--lr", "2e-3",
            "--warmup_steps", "2"]


def logged(out: Path) -> list[dict]:
    return [{k: r[k] for k in ("step", *KEYS)} for r in read_metrics(out) if "loss" in r]


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_two_ranks_and_accumulation_give_one_process_numbers(folder, tmp_path, objective):
    """16 pairs, 12 a step: 6 steps, each of another epoch's order; on 2 and 3 ranks and
    with 2 micro-batches every logged number within 1e-5 of one process's (DPO's accuracy
    from each step's global rewards, not per rank)."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    data = prepared(folder, tmp_path, objective)
    runs = {}
    for name, ranks, extra in (("one", 1, []), ("two", 2, []), ("three", 3, []),
                               ("accum", 1, ["--grad_accum", "2"])):
        out = tmp_path / name
        proc = run_trainer([*common(folder, data, objective), "--global_batch", "12", "--out",
                            str(out), *extra], ranks=ranks)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = logged(out)
    one = runs["one"]
    assert [r["step"] for r in one] == list(range(1, 7))
    for name in ("two", "three", "accum"):
        for mine, theirs in zip(runs[name], one, strict=True):
            for key in KEYS:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-5), \
                    (name, mine["step"], key, mine[key], theirs[key])
    assert one[-1]["loss"] < one[0]["loss"] and one[-1]["reward_margin"] > 0


def test_resume_auto_is_exact(folder, tmp_path):
    data = prepared(folder, tmp_path, "dpo")
    args = common(folder, data, "dpo")
    straight, split = tmp_path / "straight", tmp_path / "split"
    for out, extra in ((straight, []), (split, ["--stop_after", "3"]), (split, ["--resume", "auto"])):
        proc = run_trainer([*args, "--out", str(out), *extra])
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout
    assert logged(split) == logged(straight)  # every number, bit for bit
    a = mx.load(str(straight / "adapters/adapters.safetensors"))
    b = mx.load(str(split / "adapters/adapters.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(np.array(a[name]), np.array(b[name])), name
    # another objective does not resume from these checkpoints
    (tmp_path / "orpo").mkdir()
    data_orpo = prepared(folder, tmp_path / "orpo", "orpo")
    proc = run_trainer([*common(folder, data_orpo, "orpo"), "--out", str(split), "--resume",
                        "auto", "--steps", "8"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'objective': 'dpo'" in proc.stderr and "its --objective" in proc.stderr


def answer_logps(model, tokenizer, row: dict) -> tuple[float, float]:
    """log p(chosen answer | prompt), log p(rejected answer | prompt) under `model`, from
    the ids the chat template gives (the answers' tokens only)."""
    from mlx_lm_lora.trainer.datasets import DPODataset

    item = DPODataset([row], tokenizer)[0]
    out = []
    for key in ("chosen", "rejected"):
        ids = mx.array(item[key])[None]
        logits = model(ids[:, :-1]).astype(mx.float32)
        logps = -nn.losses.cross_entropy(logits, ids[:, 1:], reduction="none")[0]
        out.append(logps[item[f"{key}_prompt_length"] - 1:].sum().item())
    return out[0], out[1]


def test_mlx_lm_loads_the_adapters_and_prefers_the_chosen_answers(folder, tmp_path):
    from mlx_lm import load

    data = prepared(folder, tmp_path, "dpo")
    out = tmp_path / "run"
    proc = run_trainer([*common(folder, data, "dpo", steps=40), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapters = out / "adapters"
    base, tokenizer = load(str(folder))
    tuned, _ = load(str(folder), adapter_path=str(adapters))
    prefer_before, prefer_after = [], []
    for row in pairs():
        c0, r0 = answer_logps(base, tokenizer, row)
        c1, r1 = answer_logps(tuned, tokenizer, row)
        prefer_before.append(c0 > r0)
        prefer_after.append(c1 > r1)
        assert c1 - r1 > c0 - r0, row  # DPO widened every pair's preference
    assert all(prefer_after), prefer_after
    assert not all(prefer_before)  # the base model did not already prefer them all
    # the real `mlx_lm generate --adapter-path` opens them: greedy, on a training prompt
    # (its chat template applied), it answers with the chosen answer; the base does not
    said = {}
    for name, extra in (("tuned", ["--adapter-path", str(adapters)]), ("base", [])):
        gen = waits.run([PYTHON, "-m", "mlx_lm", "generate", "--model", str(folder), *extra,
                         "--prompt", pairs()[1]["prompt"], "--max-tokens", "12", "--temp", "0"],
                        cwd=tmp_path, env=trainer_env())
        assert gen.returncode == 0, gen.stderr[-3000:]
        said[name] = gen.stdout.split("==========\n")[1].rsplit("\n", 1)[0]
    assert said["tuned"].startswith(CHOSEN[:11]), said
    assert not said["base"].startswith(CHOSEN[:11]), said


def test_mlxcluster_train_runs_dpo_on_two_local_ranks(folder, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    data = prepared(folder, tmp_path, "dpo")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    out = tmp_path / "run"
    page = tmp_path / "report.html"
    proc = waits.run([sys.executable, "-m", "mlxcluster", "train", "--local", "2", "--html",
                      str(page), "--",
                      *common(folder, data, "dpo", steps=4), "--out", str(out)],
                     env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "train finished on 2 rank(s)" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and steps[0]["ranks"] == 2
    assert all(set(KEYS) <= set(r) for r in steps)
    assert steps[-1]["reward_margin"] > 0
    assert (out / "adapters" / "adapters.safetensors").is_file()  # sent back with the record
    html = page.read_text()  # the HTML report: the rewards, margin and accuracy, and their plot
    assert "preference, the last logged step: chosen reward" in html
    assert "preference: rewards, margin and accuracy" in html


def test_objective_and_data_must_match(folder, tmp_path):
    data = prepared(folder, tmp_path, "dpo")
    proc = run_trainer([*common(folder, data, "sft"), "--out", str(tmp_path / "a")])
    assert proc.returncode == 2
    assert "holds preference pairs (prompt, chosen, rejected), which --objective sft" in proc.stderr
    assert "Traceback" not in proc.stderr
    text = tmp_path / "text"
    from reference_train.prepare import prepare_offline

    prepare_offline(text, n_stories=50)
    proc = run_trainer(["--config", "tiny", "--data", str(text), "--objective", "orpo",
                        "--out", str(tmp_path / "b")])
    assert proc.returncode == 2
    assert "--objective orpo trains on preference pairs" in proc.stderr
    assert FolderTokenizer(folder).eos_id is not None


# ---------------------------------------------------------------- through --pipeline


def one_stage_pipeline(folder: Path, data: Path, objective: str, fine_tune: str,
                       loss_type: str, compile: bool):
    """(the model as one process trains it, its objective attached; a PipelineStep of one
    stage on the same model, in 4 micro-batches; the first 8 pairs): the pipeline's
    preference pass without a launch, so every loss, fine-tuning and --compile is cheap."""
    from reference_train.config import build_config
    from reference_train.data import load_meta, open_split
    from reference_train.data_parallel import make_model
    from reference_train.objectives import make_objective
    from reference_train.pipeline import PipelineStep, Stage
    from reference_train.pipeline_setup import frozen_copy, run_plans

    cfg = build_config(["--init_from", str(folder), "--data", str(data), "--objective",
                        objective, "--dpo_loss", loss_type, "--fine_tune", fine_tune,
                        "--lora_rank", "4", "--lora_layers", "-1", "--lora_dropout", "0",
                        "--block_size", "80", "--global_batch", "8", "--beta", "0.5"])
    meta = load_meta(data)
    model = make_model(cfg, meta, data)
    # the adapters start at zero (lora_b): moved, so that policy and reference differ
    model.update(tree_map(lambda p: p + 0.05, model.trainable_parameters()))
    mx.eval(model.parameters())
    reference_copy = None
    if objective == "dpo" and fine_tune == "full":  # the reference: the weights before the move
        reference_copy = frozen_copy(Stage(model, run_plans(cfg, meta)[0]))
        model.update(tree_map(lambda p: p * 1.01, model.trainable_parameters()))
    one = make_objective(cfg, meta)
    one.attach(model, fine_tune != "full")
    if reference_copy is not None:
        one.reference.update(reference_copy.parameters())
    stage = Stage(model, run_plans(cfg, meta)[0])
    step = PipelineStep(stage, mx.distributed.init(), 4, compile=compile,
                        objective=make_objective(cfg, meta), reference=reference_copy)
    batch = open_split(data, "train", 80).read(range(8))
    return model, one, step, batch


@pytest.mark.parametrize("objective,fine_tune,loss_type,compile", [
    ("dpo", "lora", "sigmoid", False), ("dpo", "lora", "hinge", False),
    ("dpo", "dora", "ipo", False), ("dpo", "lora", "dpop", True),
    ("dpo", "full", "sigmoid", False), ("dpo", "full", "sigmoid", True),
    ("orpo", "lora", "sigmoid", False), ("orpo", "dora", "sigmoid", False),
    ("dpo", "qlora", "sigmoid", False)])
def test_a_pipelines_micro_batches_add_up_to_one_process_loss_metrics_and_gradients(
        folder, quantized, tmp_path, objective, fine_tune, loss_type, compile):
    """Every --dpo_loss and ORPO, LoRA, DoRA, QLoRA and full fine-tuning, eager and
    compiled: a pipeline step's 4 micro-batches (chosen and rejected rows stacked, the
    reference pass first) give one process's loss, metrics and gradients within 1e-5."""
    base = quantized if fine_tune == "qlora" else folder
    data = prepared(base, tmp_path, objective)
    model, one, step, batch = one_stage_pipeline(
        base, data, objective, "lora" if fine_tune == "qlora" else fine_tune, loss_type, compile)
    (loss, metrics), grads = nn.value_and_grad(model, one.loss)(model, *map(mx.array, batch))
    want = dict(tree_flatten(grads))
    got_loss, got_metrics, got = step.pair_gradients(batch)
    assert abs(got_loss.item() - loss.item()) <= 1e-5 * max(1, abs(loss.item())), \
        (got_loss.item(), loss.item())
    assert np.allclose(np.array(got_metrics), np.array(metrics), rtol=1e-5, atol=1e-6), \
        (got_metrics, metrics)
    assert sorted(got) == sorted(want) and want
    for name in want:
        assert np.allclose(np.array(got[name]), np.array(want[name]), rtol=1e-4, atol=1e-6), name
    assert loss.item() > 0 and float(np.abs(np.array(metrics)).max()) > 0  # not all trivial
    if objective == "dpo" and loss_type == "sigmoid":  # the validation loss: forwards only
        model.eval()
        assert abs(step.loss(step.stage, batch).item() - one.loss(model, *map(mx.array, batch))[0].item()) \
            <= 1e-5


@pytest.mark.parametrize("objective,fine_tune,schedule", [
    ("dpo", "lora", "1f1b"), ("orpo", "lora", "gpipe"), ("dpo", "full", "1f1b")])
def test_two_stages_give_one_process_numbers_and_resume_exactly(
        folder, tmp_path, objective, fine_tune, schedule):
    """--pipeline 2 on real ring ranks, 4 micro-batches of 2 pairs (DPO with LoRA compiled,
    the others eager): every logged loss, reward, margin, accuracy and validation loss
    within 1e-5 of one process's (the test above: the other losses and fine-tunings,
    compiled); full fine-tuning's DPO (its
    reference a frozen copy of each stage's blocks) stopped after step 2 and resumed with
    --resume auto: the uninterrupted pipeline's numbers, bit for bit."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    data = prepared(folder, tmp_path, objective, n=24, val_every=3)  # 16 pairs, 8 to validate
    flags = [*common(folder, data, objective, steps=4, fine_tune=fine_tune),
             "--eval_every", "2", "--eval_batches", "1"]
    one = tmp_path / "one"
    proc = run_trainer([*flags, "--out", str(one)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    extra = ["--micro_batches", "4", "--pipeline_schedule", schedule]
    # DPO with LoRA compiled (each stage's pair pass and reference pass, on both sides of a
    # hop: the test above compiles them on one stage only); the others eager (pipelined)
    compiled = ["--compile", "true"] if (objective, fine_tune) == ("dpo", "lora") else []
    piped = pipelined(tmp_path / "pp", flags, 2, *extra, *compiled)
    assert "4 micro-batches of 2 pairs (chosen and rejected rows together)" in piped.stdout
    assert ("DPO's reference model" in piped.stdout) == (objective == "dpo")
    want, got = logged(one), logged(tmp_path / "pp")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for mine, theirs in zip(got, want, strict=True):
        for key in KEYS:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-5), \
                (mine["step"], key, mine[key], theirs[key])
    assert want[-1]["loss"] < want[0]["loss"] and want[-1]["reward_margin"] > 0
    validated = {r["step"]: r["val_loss"] for r in read_metrics(one) if "val_loss" in r}
    piped_val = {r["step"]: r["val_loss"] for r in read_metrics(tmp_path / "pp") if "val_loss" in r}
    assert list(piped_val) == list(validated) == [2, 4]
    assert all(piped_val[s] == pytest.approx(validated[s], rel=1e-5) for s in validated)
    if fine_tune != "full":
        return
    split = tmp_path / "split"
    pipelined(split, [*flags, "--stop_after", "2", "--checkpoint_every", "2"], 2, *extra)
    resumed = pipelined(split, [*flags, "--resume", "auto"], 2, *extra)
    assert "at step 2" in resumed.stdout
    assert logged(split) == got  # every number, bit for bit


def test_three_stages_resumed_on_two_give_one_process_numbers(tmp_path_factory, tmp_path):
    """What --elastic does after a lost host, at the trainer: DPO with full fine-tuning
    (its reference a frozen copy of each stage's own blocks) over --pipeline 3 stopped
    after step 2, resumed as --pipeline 2, each stage then holding blocks it did not:
    every logged loss, reward, margin and accuracy within 1e-5 of one process's (the new
    stages' references are the starting weights of their new blocks)."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    folder = preference_folder(tmp_path_factory.mktemp("three"), blocks=3)
    data = prepared(folder, tmp_path, "dpo")
    flags = [*common(folder, data, "dpo", steps=4, fine_tune="full"), "--checkpoint_every", "2"]
    one = tmp_path / "one"
    proc = run_trainer([*flags, "--out", str(one)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "pp"
    pipelined(out, [*flags, "--stop_after", "2"], 3, "--micro_batches", "2")
    two = pipelined(out, [*flags, "--resume", "auto"], 2, "--micro_batches", "2")
    assert "re-splitting step 2 of --pipeline 3's checkpoints over --pipeline 2" in two.stdout
    want, got = logged(one), logged(out)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for mine, theirs in zip(got, want, strict=True):
        for key in KEYS:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-5), \
                (mine["step"], key, mine[key], theirs[key])
    assert want[-1]["loss"] < want[0]["loss"]
