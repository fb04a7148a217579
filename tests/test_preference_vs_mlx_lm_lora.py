"""The proof of issue 49's preference training: our DPO and ORPO runs give, at every logged
step, the loss, rewards, margin and accuracy that mlx-lm-lora's own training loop
(mlx_lm_lora.trainer.dpo_trainer.train_dpo, orpo_trainer.train_orpo, 5.10.2, run here for
real) gives on the same tiny model saved in mlx-lm's layout, the same pairs, the same
starting adapters and the same optimizer.

Both whole training loops run, each on its own: ours is `python -m reference_train.train`
(data-parallel step, one process), theirs train_dpo / train_orpo on mlx-lm's model of the
same folder. What is made the same: the pairs (tokenized by each side's own data set code),
the model's weights (the folder), the adapters' starting values (ours, drawn from --seed,
loaded into mlx-lm's LoRA layers), the optimizer (AdamW with our learning-rate schedule,
built by reference_train.train.make_optimizer's code), no gradient clipping (mlx-lm-lora has
none) and one global batch holding every pair (mlx-lm-lora's batches are drawn in its own
random order; with one batch there is no order to match). The reference model: theirs a
second copy of the folder's model (mlx-lm-lora's load_reference_model), ours the same model
with the adapters off (LoRA, DoRA) or a frozen copy (full fine-tuning).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten

from reference_train import fine_tune, lora
from reference_train.config import build_config
from reference_train.data import load_meta
from reference_train.data_parallel import make_model
from reference_train.train import schedule

from .preference_support import PAIRS, pairs, preference_folder, prepared
from .train_support import read_metrics, run_trainer

STEPS = 6
RTOL = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The float32 folder, and the same shape quantized to 4 bits (QLoRA)."""
    return {quantized: preference_folder(tmp_path_factory.mktemp("preference"), quantized)
            for quantized in (False, True)}


def our_args(folder: Path, data: Path, out: Path, objective: str, tune: str,
             loss_type: str) -> list[str]:
    block = load_meta(data)["splits"]["train"]["max_length"]
    lr = "1e-3" if tune == "full" else "2e-3"
    tune = "lora" if tune == "qlora" else tune
    return ["--init_from", str(folder), "--data", str(data), "--out", str(out),
            "--objective", objective, "--dpo_loss", loss_type, "--beta", "0.1",
            "--fine_tune", tune, "--lora_rank", "4", "--lora_layers", "-1",
            "--block_size", str(block), "--steps", str(STEPS), "--global_batch", str(PAIRS),
            "--log_every", "1", "--eval_every", "0", "--sample_tokens", "0", "--grad_clip", "0",
            "--lr", lr, "--min_lr", "1e-4", "--warmup_steps", "2", "--kernels", "mlx"]


class Reports:
    """mlx-lm-lora's training callback: its logged records."""

    def __init__(self):
        self.train: list[dict] = []

    def on_train_loss_report(self, info: dict) -> None:
        self.train.append(info)

    def on_val_loss_report(self, info: dict) -> None:
        pass


def their_run(folder: Path, cfg, start: dict[str, mx.array], objective: str, tune: str,
              loss_type: str, tmp_path: Path, monkeypatch) -> list[dict]:
    """mlx-lm-lora's own loop on mlx-lm's model of `folder`, from our starting adapters."""
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm_lora.trainer import datasets as their_data
    from mlx_lm_lora.trainer.dpo_trainer import DPOTrainingArgs, dpo_loss, train_dpo
    from mlx_lm_lora.trainer.orpo_trainer import ORPOTrainingArgs, orpo_loss, train_orpo

    # its loop sets the wired limit to a figure MLX gives on a Mac's GPU only
    device_info = mx.device_info
    monkeypatch.setattr(mx, "device_info",
                        lambda: {**device_info(), "max_recommended_working_set_size": 0})
    model, tokenizer = load(str(folder))
    if tune != "full":  # (QLoRA: the folder is quantized, mlx-lm's layers wrap QuantizedLinear)
        model.freeze()
        linear_to_lora_layers(model, len(model.layers),
                              {"rank": cfg.lora_rank, "scale": cfg.lora_scale, "dropout": 0.0,
                               "keys": list(fine_tune.KEYS)}, use_dora=tune == "dora")
        theirs = {lora.hf_adapter_name(k): v for k, v in start.items()}
        assert set(theirs) == set(dict(tree_flatten(model.trainable_parameters())))
        model.load_weights(list(theirs.items()), strict=False)
    mx.eval(model.parameters())
    optimizer = optim.AdamW(learning_rate=schedule(cfg), betas=[cfg.beta1, cfg.beta2],
                            weight_decay=cfg.weight_decay)
    reports = Reports()
    common = {"batch_size": PAIRS, "iters": STEPS, "steps_per_report": 1,
              "steps_per_eval": 10 * STEPS, "steps_per_save": 10 * STEPS,
              "max_seq_length": cfg.block_size + 1,
              "adapter_file": str(tmp_path / "their_adapters.safetensors")}
    rows = pairs()
    if objective == "dpo":
        reference, _ = load(str(folder))
        train_dpo(model, reference.freeze(), optimizer,
                  their_data.DPODataset(rows, tokenizer), None,
                  DPOTrainingArgs(**common, beta=cfg.beta, loss_type=loss_type),
                  loss_fn=dpo_loss, training_callback=reports, loss_type=loss_type)
    else:
        train_orpo(model, optimizer, their_data.ORPODataset(rows, tokenizer, system_key="system"),
                   None, loss=orpo_loss, args=ORPOTrainingArgs(**common, beta=cfg.beta),
                   training_callback=reports)
    return reports.train


CASES = [("dpo", "lora", "sigmoid"), ("orpo", "lora", "sigmoid"), ("dpo", "dora", "sigmoid"),
         ("dpo", "full", "sigmoid"), ("dpo", "qlora", "sigmoid"), ("dpo", "lora", "ipo"),
         ("dpo", "lora", "hinge")]


@pytest.mark.parametrize("objective,tune,loss_type", CASES,
                         ids=["-".join(c) for c in CASES])
def test_every_logged_step_is_mlx_lm_loras(folders, tmp_path, monkeypatch, objective, tune,
                                           loss_type):
    folder = folders[tune == "qlora"]
    data = prepared(folder, tmp_path, objective)
    out = tmp_path / "ours"
    args = our_args(folder, data, out, objective, tune, loss_type)
    cfg = build_config(args)
    start = ({} if tune == "full" else
             dict(tree_flatten(make_model(cfg, load_meta(data), data).trainable_parameters())))
    proc = run_trainer(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [r for r in read_metrics(out) if "loss" in r]
    theirs = their_run(folder, cfg, start, objective, tune, loss_type, tmp_path, monkeypatch)
    assert [r["step"] for r in ours] == [r["iteration"] for r in theirs] == list(range(1, STEPS + 1))
    worst = 0.0
    for mine, their in zip(ours, theirs, strict=True):
        pairs_of = {"loss": "train_loss", "chosen_reward": "train_chosen_reward",
                    "rejected_reward": "train_rejected_reward", "reward_margin": "train_margins",
                    "accuracy": "train_accuracies"}
        for key, their_key in pairs_of.items():
            assert mine[key] == pytest.approx(float(their[their_key]), rel=RTOL, abs=RTOL), \
                (mine["step"], key, mine[key], their[their_key])
            worst = max(worst, abs(mine[key] - float(their[their_key]))
                        / max(abs(float(their[their_key])), 1e-6))
    print(f"largest relative difference from mlx-lm-lora's: {worst:.2e}")
    # the run learned: the loss fell, and the chosen answers pulled ahead
    assert ours[-1]["loss"] < ours[0]["loss"]
    assert ours[-1]["reward_margin"] > 0 and ours[-1]["accuracy"] == 1.0
