"""What a run minimises: `--objective sft` (next-token cross-entropy), `dpo` or `orpo`
(preference pairs), computed as mlx-lm-lora 5.10.2 computes them.

    objective = make_objective(cfg, meta)      # refuses data of the other kind
    objective.attach(compute_model, adapters)  # the reference model, once, before compiling
    loss, metrics = objective.loss(model, *batch)
    record.update(objective.summarize(per_step))

The step function (data_parallel.py) differentiates ``loss`` (the loss, or with
metrics named the pair (loss, metrics)) and carries ``metrics``
(a vector, one value per name of ``objective.metrics``: this rank's means, whose mean
over the ranks is the global batch's) back to the loop, which gathers each step's over
the ranks at a logged step and hands them, step by step, to ``summarize`` for the record.
A pipeline (pipeline.py) computes the same from the last stage's logits: ``row_scores``
of each row's token log-probabilities, ``pair_values`` (each pair's loss and metrics, whose
means over pairs ``loss`` returns), and ``pair_sums``, a micro-batch's share of them.

DPO (mlx-lm-lora's trainer/dpo_trainer.py): for each pair, the log-probability of the
chosen and of the rejected answer (the sum over its tokens, the prompt and padding
masked; with --dpo_loss ipo the mean), under the model (policy) and the reference
model; ``z = (policy chosen - policy rejected) - (reference chosen - reference
rejected)``; the loss the mean over pairs of ``-log sigmoid(beta z)`` (sigmoid),
``relu(1 - beta z)`` (hinge), ``(z - 1 / (2 beta))^2`` (ipo) or ``-log sigmoid(beta z)
+ delta max(0, reference chosen - policy chosen)`` (dpop). mlx-lm-lora has no label
smoothing. The rewards are ``beta x`` the batch's mean of (policy - reference) of the
chosen and of the rejected answers; the margin their difference; the accuracy whether
the chosen reward is above the rejected one: 0 or 1 a step (mlx-lm-lora compares the
batch's two means), averaged over the logged steps. The reference model is the frozen
starting point: with LoRA / DoRA the same model with its adapters switched off
(lora.adapters_off: no second copy), with full fine-tuning a frozen copy of the
starting weights (in the compute dtype: one more model in memory).

ORPO (mlx-lm-lora's trainer/orpo_trainer.py): for each answer the mean log-probability
over its tokens (each clipped to [-1000, 0]); ``log odds = (c - r) - (log(1 - e^c) -
log(1 - e^r))``; the loss the mean over pairs of ``-c - beta log sigmoid(log odds)``;
the rewards ``beta c`` and ``beta r``, the accuracy the share of pairs whose chosen
reward is above the rejected one, the margin the mean difference. No reference model.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from . import lora
from .errors import DataError
from .model import Llama, loss_fn

PREFERENCE_METRICS = ("chosen_reward", "rejected_reward", "accuracy")


def token_logps(model: nn.Module, inputs: mx.array, targets: mx.array) -> mx.array:
    """log p(target) at every position (B, L), in float32, as mlx-lm-lora takes it:
    minus the cross-entropy of the logits."""
    return logits_logps(model(inputs), targets)


def logits_logps(logits: mx.array, targets: mx.array) -> mx.array:
    """token_logps from the logits (a pipeline's last stage has them, not the model)."""
    return -nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="none")


class SFT:
    """Next-token cross-entropy (model.loss_fn); no metrics of its own."""

    name = "sft"
    metrics: tuple[str, ...] = ()
    state: list = []
    needs_reference = False

    def attach(self, compute: nn.Module, adapters: bool) -> None:
        pass

    def loss(self, model: nn.Module, *batch: mx.array) -> mx.array:
        """The loss alone: an objective with no metrics returns no tuple (the step's
        compiled graph stays the one it always was)."""
        return loss_fn(model, *batch)

    def summarize(self, per_step: dict[str, np.ndarray]) -> dict[str, float]:
        return {}


@dataclass
class DPO:
    """mlx-lm-lora's DPO (module docstring)."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    delta: float = 50.0
    name = "dpo"
    metrics = PREFERENCE_METRICS[:2]

    def __post_init__(self):
        self.reference: nn.Module | None = None  # a frozen copy (full fine-tuning)
        self.adapters = False  # or the model itself, adapters off
        self.state: list = []

    def attach(self, compute: nn.Module, adapters: bool) -> None:
        """The reference model: `compute` with its adapters off, or a frozen copy of it."""
        self.adapters = adapters
        if adapters:
            return
        self.reference = Llama(compute.args)
        self.reference.load_weights(tree_flatten(compute.parameters()))
        self.reference.freeze()
        self.reference.eval()
        mx.eval(self.reference.parameters())
        self.state = [self.reference.state]

    needs_reference = True

    def row_scores(self, logps: mx.array, mask: mx.array) -> mx.array:
        """Each row's answer log-probability from its tokens' (summed; ipo: averaged over
        its tokens)."""
        total = (logps * mask).sum(-1)
        if self.loss_type == "ipo":
            return total / mx.maximum(mask.sum(-1), 1)
        return total

    def score(self, model: nn.Module, inputs, targets, mask) -> mx.array:
        return self.row_scores(token_logps(model, inputs, targets), mask)

    def reference_scores(self, model, chosen, rejected) -> tuple[mx.array, mx.array]:
        ref = self.reference if self.reference is not None else model
        with lora.adapters_off(model) if self.adapters else nullcontext():
            return (mx.stop_gradient(self.score(ref, *chosen)),
                    mx.stop_gradient(self.score(ref, *rejected)))

    def pair_values(self, policy_c, policy_r, ref_c, ref_r) -> tuple[mx.array, mx.array]:
        """(each pair's loss (P,), each pair's metrics (P, 2)): the step's loss and metrics
        are their means over the pairs, so a pipeline's micro-batch (a slice of the pairs)
        adds its sums scaled by 1 / P (pipeline.py)."""
        z = (policy_c - policy_r) - (ref_c - ref_r)
        beta = self.beta
        if self.loss_type == "sigmoid":
            losses = -nn.log_sigmoid(beta * z)
        elif self.loss_type == "hinge":
            losses = nn.relu(1 - beta * z)
        elif self.loss_type == "ipo":
            losses = (z - 1 / (2 * beta)) ** 2
        else:  # dpop
            penalty = mx.maximum(mx.zeros_like(policy_c), ref_c - policy_c)
            losses = -(nn.log_sigmoid(beta * z) - self.delta * penalty)
        return losses, beta * mx.stack([policy_c - ref_c, policy_r - ref_r], axis=-1)

    def loss(self, model: nn.Module, xc, yc, mc, xr, yr, mr) -> tuple[mx.array, mx.array]:
        chosen, rejected = (xc, yc, mc), (xr, yr, mr)
        policy_c, policy_r = self.score(model, *chosen), self.score(model, *rejected)
        ref_c, ref_r = self.reference_scores(model, chosen, rejected)
        losses, metrics = self.pair_values(policy_c, policy_r, ref_c, ref_r)
        return mx.mean(losses), mx.mean(metrics, axis=0)

    def summarize(self, per_step: dict[str, np.ndarray]) -> dict[str, float]:
        """The logged interval's means of the rewards, margin and accuracy, each step's
        accuracy from its global batch's two rewards (mlx-lm-lora's, one process)."""
        chosen, rejected = per_step["chosen_reward"], per_step["rejected_reward"]
        return preference_record(chosen, rejected, (chosen > rejected).astype(np.float64))


@dataclass
class ORPO:
    """mlx-lm-lora's ORPO (module docstring)."""

    beta: float = 0.1
    name = "orpo"
    metrics = PREFERENCE_METRICS
    state = []
    needs_reference = False

    def attach(self, compute: nn.Module, adapters: bool) -> None:
        pass  # no reference model

    def row_scores(self, logps: mx.array, mask: mx.array) -> mx.array:
        """Each row's mean answer log-probability from its tokens' (each clipped; 0 for a
        row with no answer token)."""
        logps = mx.clip(logps, -1000.0, 0.0)
        n = mask.sum(-1)
        mean = mx.where(n > 0, (logps * mask).sum(-1) / mx.where(n > 0, n, 1.0), 0.0)
        return mx.nan_to_num(mean, nan=0.0, posinf=0.0, neginf=-1000.0)

    def pair_values(self, c, r, ref_c=None, ref_r=None) -> tuple[mx.array, mx.array]:
        """(each pair's loss (P,), each pair's metrics (P, 3)), means over pairs as DPO's
        (no reference: `ref_c`, `ref_r` unused)."""
        log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
        losses = -c - self.beta * nn.log_sigmoid(log_odds)
        chosen, rejected = self.beta * c, self.beta * r
        return losses, mx.stack([chosen, rejected, (chosen > rejected).astype(mx.float32)],
                                axis=-1)

    def loss(self, model: nn.Module, xc, yc, mc, xr, yr, mr) -> tuple[mx.array, mx.array]:
        c = self.row_scores(token_logps(model, xc, yc), mc)
        r = self.row_scores(token_logps(model, xr, yr), mr)
        losses, metrics = self.pair_values(c, r)
        return mx.mean(losses), mx.mean(metrics, axis=0)

    def summarize(self, per_step: dict[str, np.ndarray]) -> dict[str, float]:
        chosen, rejected = per_step["chosen_reward"], per_step["rejected_reward"]
        return preference_record(chosen, rejected, per_step["accuracy"])


def log1mexp(x: mx.array) -> mx.array:
    """log(1 - e^x) for x <= 0, stably (mlx-lm-lora's _log1mexp)."""
    x = mx.minimum(x, -1e-7)
    return mx.where(x > -0.6931471805599453, mx.log(-mx.expm1(x)), mx.log1p(-mx.exp(x)))


def preference_record(chosen: np.ndarray, rejected: np.ndarray, accuracy: np.ndarray) -> dict:
    """What a logged record says of the interval's steps (their means)."""
    return {"chosen_reward": float(chosen.mean()), "rejected_reward": float(rejected.mean()),
            "reward_margin": float((chosen - rejected).mean()),
            "accuracy": float(accuracy.mean())}


def make_objective(cfg, meta: dict):
    """The run's objective (--objective), or a DataError when the data is not its kind
    (preference pairs for dpo and orpo, anything else for sft)."""
    pairs = bool(meta.get("preference"))
    if cfg.objective == "sft":
        if pairs:
            raise DataError(f"--data {cfg.data} holds preference pairs (prompt, chosen, "
                            "rejected), which --objective sft does not train on",
                            "give --objective dpo or orpo, or prepare supervised rows")
        return SFT()
    if not pairs:
        raise DataError(f"--objective {cfg.objective} trains on preference pairs, and --data "
                        f"{cfg.data or '(the offline corpus)'} holds none",
                        "prepare rows {\"prompt\", \"chosen\", \"rejected\"} with "
                        "`python -m reference_train.prepare --jsonl FILE --tokenizer MODEL_DIR`")
    if cfg.objective == "dpo":
        return DPO(beta=cfg.beta, loss_type=cfg.dpo_loss, delta=cfg.dpo_delta)
    return ORPO(beta=cfg.beta)


def pair_sums(objective, logps: mx.array, mask: mx.array, reference: mx.array | None,
              scale: mx.array) -> list[mx.array]:
    """A slice of the pairs' share of the step's loss and metrics (a pipeline's micro-batch,
    pipeline.py): [their losses summed x `scale`, their metrics summed x `scale`], `scale`
    being 1 / the step's pairs, so the micro-batches' shares add up to the means over every
    pair. `logps` (2P, L): the chosen rows, then the rejected; `reference` (2P,): the
    reference model's row scores in that order (DPO), or None. The metrics carry no gradient
    (the pass differentiates the loss only)."""
    scores = objective.row_scores(logps, mask)
    half = scores.shape[0] // 2
    refs = (None, None) if reference is None else (reference[:half], reference[half:])
    losses, metrics = objective.pair_values(scores[:half], scores[half:], *refs)
    return [losses.sum() * scale, mx.stop_gradient(metrics).sum(axis=0) * scale]
