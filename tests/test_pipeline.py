"""Pipeline-parallel training, `python -m reference_train.train --pipeline N`
(stages.py, pipeline.py, stage_load.py, pipeline_setup.py, pipeline_outputs.py):
the split and its refusals, each rank loading only its blocks (one process's weights,
adapters drawn alike), and on real ranks of the ring backend a pipeline step's
gradients, then every logged loss of full, LoRA, QLoRA and DoRA runs, equal to one
process's; resume exact; OUT/model and OUT/adapters opened by the real mlx-lm."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from reference_train import kernels, lora, stages
from reference_train.config import build_config, model_args
from reference_train.corpus import offline_corpus
from reference_train.data import ShardedBatches, load_meta, open_split
from reference_train.errors import DataError
from reference_train.hf_io import load_folder, model_from_folder, model_from_weights
from reference_train.model import Llama, loss_fn
from reference_train.pipeline import PipelineStep
from reference_train.pipeline_outputs import other_layout
from reference_train.prepare import main as prepare_main
from reference_train.stage_load import held_bytes, load_stage, model_bytes, new_stage
from reference_train.train import main as train_main

from . import adapter_support as support
from .chat_support import make_chat_folder, write_jsonl
from .conftest import require
from .hf_support import LLAMA3_CONFIG, make_llama_folder
from .train_support import (
    PARITY,
    TINY,
    FakeGroup,
    one_process,
    pipelined,
    read_metrics,
    run_trainer,
    train_losses,
    trainer_env,
)

# train.py's tiny config: 2 blocks, tied embeddings; a few steps, nothing else.
LORA = ["--fine_tune", "lora", "--lora_rank", "4", "--lora_layers", "-1"]
BFLOAT16_PARITY = 1e-3  # as tests/test_train_precision.py across rank counts; measured ~1e-4


# ---------------------------------------------------------------- the split


def sizes(blocks, embedding=20, head=20, tied=False) -> stages.ModelBytes:
    return stages.ModelBytes(embedding, tuple(blocks), head, tied)


def test_stages_are_balanced_by_bytes_embedding_and_head_included():
    plans = stages.plan_stages(sizes([10, 10, 10, 10]), 2)
    assert [p.blocks for p in plans] == [range(0, 2), range(2, 4)]
    assert [p.bytes for p in plans] == [40, 40]
    assert (plans[0].embedding, plans[0].head, plans[1].embedding, plans[1].head) == \
        (True, False, False, True)
    # a heavy head pushes blocks to the first stage; a tied one adds the matrix's copy
    heavy = stages.plan_stages(sizes([10] * 6, head=40), 2)
    assert [len(p.blocks) for p in heavy] == [4, 2] and [p.bytes for p in heavy] == [60, 60]
    tied = stages.plan_stages(sizes([10] * 6, embedding=30, head=1, tied=True), 3)
    assert [len(p.blocks) for p in tied] == [1, 4, 1] and [p.bytes for p in tied] == [40, 40, 41]
    assert tied[2].embedding and not tied[1].embedding
    assert [len(p.blocks) for p in stages.plan_stages(sizes([5, 1, 1, 1, 1, 5], 0, 0), 3)] == [1, 4, 1]


def test_an_explicit_split_and_the_refusals():
    plans = stages.plan_stages(sizes([10] * 4), 2, stages.parse_split("1, 3"))
    assert [p.blocks for p in plans] == [range(0, 1), range(1, 4)] and plans[1].bytes == 50
    refusals = [
        (lambda: stages.plan_stages(sizes([10] * 4), 5), "--pipeline 5: the model has 4 blocks"),
        (lambda: stages.plan_stages(sizes([10] * 4), 2, [1, 2]), "adds up to 3 blocks, but the model has 4"),
        (lambda: stages.plan_stages(sizes([10] * 4), 3, [2, 2]), "names 2 stages, but --pipeline is 3"),
        (lambda: stages.parse_split("2,x"), "expected whole numbers of blocks per stage"),
        (lambda: stages.parse_split("4,0"), "each at least 1"),
        (lambda: stages.check_world(2, 1, "none"), "--pipeline 2 needs 2 ranks, one per stage"),
        (lambda: stages.check_world(2, 3, "mpi"), "this run has 3"),
        (lambda: stages.check_world(2, 4, "ring"), "the ring backend cannot split a group"),
        (lambda: stages.check_world(2, 4, "jaccl"), "the jaccl backend cannot split a group"),
    ]
    for refused, message in refusals:
        with pytest.raises(DataError, match=message.replace("(", r"\(")):
            refused()
    stages.check_world(4, 4, "ring")
    stages.check_world(2, 4, "mpi")  # 2 copies of the pipeline: MPI's groups split
    assert stages.bubble_fraction(2, 4) == pytest.approx(1 / 5) and stages.bubble_fraction(1, 8) == 0
    assert [stages.default_micro_batches(n, 8) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 8]


def test_the_trainer_refuses_before_anything_trains(llama, llama_data, tmp_path, capsys):
    """Each refusal exits 2 with the problem and its fix, no traceback, nothing written."""
    common = [*TINY, "--init_from", str(llama), "--data", str(llama_data), *LORA,
              "--out", str(tmp_path / "out")]
    for flags, message in [(["--pipeline", "3"], "--pipeline 3: the model has 2 blocks"),
                           (["--pipeline", "2", "--pipeline_split", "1,2"], "adds up to 3 blocks"),
                           (["--pipeline", "2", "--pipeline_split", "2"],
                            "names 1 stages, but --pipeline is 2"),
                           (["--pipeline", "2", "--micro_batches", "3"],
                            "--micro_batches 3 does not divide global_batch 8"),
                           (["--pipeline", "2", "--grad_accum", "2"], "give --micro_batches"),
                           (["--pipeline_split", "1,1"], "give --pipeline N"),
                           (["--pipeline", "2", "--pipeline_schedule", "zigzag"],
                            "pipeline_schedule zigzag: must be one of 1f1b, gpipe"),
                           (["--pipeline", "2"], "--pipeline 2 needs 2 ranks")]:
        assert train_main([*flags, *common]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (flags, err)
    assert not (tmp_path / "out").exists()


def test_a_data_parallel_resume_of_a_pipeline_is_refused_naming_it(tmp_path):
    """A --out's checkpoints name the run that wrote them (pipeline_outputs.other_layout):
    a pipeline's pieces re-split over another --pipeline (tests/test_resplit.py), but a
    data-parallel run does not resume them, nor a pipeline a data-parallel run's."""
    checkpoints = tmp_path / "checkpoints"
    for piece in ("stage_1_of_2", "stage_2_of_2"):
        (checkpoints / piece / "step_000002").mkdir(parents=True)
        (checkpoints / piece / "step_000002" / "state.json").write_text("{}")
    assert other_layout(checkpoints, "--pipeline 2") is None
    assert other_layout(checkpoints, "--pipeline 4") is None  # re-split, not refused
    refusal = other_layout(checkpoints, "data-parallel")
    assert "holds the checkpoints of --pipeline 2, and this run asks for data-parallel" in refusal
    assert "resume with a --pipeline (any number of stages" in refusal
    (checkpoints / "step_000002").mkdir()
    (checkpoints / "step_000002" / "state.json").write_text("{}")
    refusal = other_layout(checkpoints, "--pipeline 4")
    assert "holds the checkpoints of a data-parallel run (no --pipeline), and this run asks " \
           "for --pipeline 4" in refusal and "resume with no --pipeline" in refusal


# ---------------------------------------------------------------- each rank loads its blocks


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A 4-block Llama saved one tensor a file (an index of shards), and its 4-bit twin
    (saved so too)."""
    config = {**LLAMA3_CONFIG, "num_hidden_layers": 4}
    base = tmp_path_factory.mktemp("deep")
    return (make_llama_folder(base / "f32", config, shard=True),
            make_llama_folder(base / "q4", config, quantize=True, shard=True))


def adapters(model):
    return lora.apply_lora(model, 3, 4, 20.0, 0.0, list(lora.KEYS))


@pytest.mark.parametrize("which", ["full", "qlora"])
def test_each_stage_holds_one_process_weights_and_only_its_own(deep, which):
    folder = deep[0] if which == "full" else deep[1]
    fine_tune, adapt = ("full", None) if which == "full" else ("lora", adapters)
    mx.random.seed(3)
    whole = model_from_weights(*load_folder(folder)[:2], load_folder(folder)[2], folder)
    if adapt:
        adapt(whole)
    expected = dict(tree_flatten(whole.parameters()))
    plans = stages.plan_stages(stages.folder_bytes(folder), 4)
    assert [len(p.blocks) for p in plans] == [1, 1, 1, 1]
    seen = set()
    for plan in plans:
        mx.clear_cache()
        mx.reset_peak_memory()  # the peak from here: what is held now, and what loading adds
        before = mx.get_active_memory()
        mx.random.seed(3)
        stage = load_stage(folder, plan, fine_tune, adapt)
        if which == "full":  # the planned bytes are what it holds; no other tensor was read
            assert held_bytes(stage) == plan.bytes
            assert mx.get_peak_memory() - before <= 2 * plan.bytes
        held = dict(tree_flatten(stage.parameters()))
        assert {n.split(".")[1] for n in held if n.startswith("layers.")} == {str(plan.index)}
        for name, value in held.items():  # LoRA's adapters drawn as one process draws them
            assert mx.array_equal(value, expected[name]).item(), name
        seen |= set(held)
        trainable = {n for n, _ in tree_flatten(stage.trainable_parameters())}
        if which == "qlora":  # adapters on the last 3 blocks only
            assert all(n.endswith(("lora_a", "lora_b")) for n in trainable)
            assert bool(trainable) == (plan.index > 0)
        del stage
    assert seen == set(expected)
    if which == "full":  # the plan counts every byte once (untied)
        assert sum(p.bytes for p in plans) == sum(v.nbytes for v in expected.values())


def stage_copy(folder: Path, plan, to: Path) -> Path:
    """What mlxcluster train sends a pipeline host of `plan`'s stage: every file of
    `folder` but the weight files holding none of the stage's tensors."""
    to.mkdir(parents=True)
    needed = stages.stage_files(stages.index_map(folder), plan)
    for f in folder.iterdir():
        if not f.name.endswith(".safetensors") or f.name in needed:
            (to / f.name).write_bytes(f.read_bytes())
    return to


def test_each_stage_needs_only_the_files_of_its_tensors(deep):
    """By the index: a stage's blocks' files, the embedding's for the first stage, the
    final norm's and head's for the last (untied); nothing of the other stages."""
    folder = deep[0]
    index = stages.index_map(folder)
    plans = stages.plan_stages(stages.folder_bytes(folder), 2, [1, 3])
    first, last = (stages.stage_files(index, plan) for plan in plans)
    assert first == {f for n, f in index.items()
                     if n.startswith(("model.embed_tokens.", "model.layers.0."))}
    assert last == {f for n, f in index.items()
                    if n.startswith(("model.norm.", "lm_head.", "model.layers.1.",
                                     "model.layers.2.", "model.layers.3."))}
    assert first | last == set(index.values()) and not first & last
    tied = stages.StagePlan(1, 2, range(1, 4), embedding=True, head=True, bytes=0)
    assert "model.embed_tokens.weight" in {n for n, f in index.items()
                                           if f in stages.stage_files(index, tied)}
    assert stages.index_map(deep[0].parent / "nowhere") is None  # no index: every file


@pytest.mark.parametrize("which", ["full", "qlora"])
def test_a_stage_loads_from_a_copy_holding_only_its_files(deep, which, tmp_path):
    """Each stage built from a folder holding only its files (the others absent, as on
    a pipeline host) holds what it holds from the whole folder: one process's weights
    and adapters (QLoRA's skeleton quantized alike, another stage's layers by the
    index's names); a whole-model load of that copy is still refused, and so is a
    stage whose own file is absent, naming the file, the tensors and the fix."""
    folder = deep[0] if which == "full" else deep[1]
    fine_tune, adapt = ("full", None) if which == "full" else ("lora", adapters)
    split = [1, 3]
    plans = stages.plan_stages(stages.folder_bytes(folder), 2, split)
    mx.random.seed(3)
    whole = model_from_weights(*load_folder(folder)[:2], load_folder(folder)[2], folder)
    if adapt:
        adapt(whole)
    expected = dict(tree_flatten(whole.parameters()))
    for plan in plans:
        part = stage_copy(folder, plan, tmp_path / f"stage{plan.index}")
        assert len(list(part.glob("*.safetensors"))) < len(set(stages.index_map(folder).values()))
        # the ranks plan from the copy with the split given: the same blocks, its own bytes
        partial = stages.plan_stages(stages.folder_bytes(part, partial=True), 2, split)
        assert [p.blocks for p in partial] == [p.blocks for p in plans]
        assert partial[plan.index].bytes == plan.bytes
        mx.random.seed(3)
        held = dict(tree_flatten(load_stage(part, plan, fine_tune, adapt).parameters()))
        assert held and set(held) <= set(expected)
        assert any(n.startswith("layers.3.") for n in held) == (plan.index == 1)
        for name, value in held.items():
            assert mx.array_equal(value, expected[name]).item(), name
        with pytest.raises(DataError, match="model.safetensors.index.json lists .*, not in "):
            load_folder(part)  # one process needs every file: strict as before
        with pytest.raises(DataError, match="not in "):
            stages.folder_bytes(part)  # balancing needs every file's header
    part = tmp_path / "stage0"
    own = sorted(stages.stage_files(stages.index_map(folder), plans[0]))[0]
    (part / own).unlink()
    with pytest.raises(DataError) as refused:
        load_stage(part, plans[0], fine_tune, adapt)
    said = str(refused.value)
    assert "puts tensors this stage holds (" in said and f") in {own}, not in {part}" in said
    assert "let `mlxcluster train` send each host its stage's files" in refused.value.hint


def test_a_rank_with_a_partial_copy_and_no_split_is_refused(deep, llama_data, tmp_path, capsys):
    """Without --pipeline_split the stages are balanced by every file's bytes: a copy
    lacking some is exit 2 naming the files and the fix, before anything trains."""
    plan = stages.plan_stages(stages.folder_bytes(deep[0]), 2, [1, 3])[0]
    part = stage_copy(deep[0], plan, tmp_path / "part")
    code = train_main([*TINY, "--init_from", str(part), "--data", str(llama_data), *LORA,
                       "--pipeline", "2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "lacks model-" in err and "give --pipeline_split" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- real ranks


def test_neighbours_sending_to_each_other_at_once_do_not_wait_for_each_other_and_sends_start_at_once():
    proc = run_trainer([], ranks=2, module="tests.pipeline_exchange")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 received 64 MiB" in proc.stdout and "rank 1 received 64 MiB" in proc.stdout
    # and a send starts at once, not at the sender's next evaluation
    paused = float(re.search(r"rank 0 paused until ([\d.]+)", proc.stdout).group(1))
    received = float(re.search(r"rank 1 received the small send at ([\d.]+)", proc.stdout).group(1))
    assert received < paused, proc.stdout


class RecordingLink:
    """An Exchange for one stage alone: receives are random arrays, and it records, in
    order, each input gradient sent back and each evaluation of the weights' gradients
    (the evaluations of as many arrays as the stage differentiates)."""

    def __init__(self, weights: int):
        self.weights, self.events, self.waited = weights, [], 0.0

    def receive(self, shape, dtype, source):
        return mx.random.normal(shape).astype(dtype)

    def wait_for(self, received):
        mx.eval(received)
        return received

    def send(self, value, to):
        mx.eval(value)
        self.events.append(("sent back", to))

    def evaluate(self, *arrays):
        mx.eval(*arrays)
        if len(arrays) >= self.weights:
            self.events.append(("weights", len(arrays)))


def test_the_last_stage_sends_an_input_gradient_before_summing_the_backward_befores_weights():
    """The last stage of two sends micro-batch m's input gradient before it computes
    micro-batch m - 1's weights' gradients (one backward late), so the first stage's
    last backward starts sooner. (The gradients stay one process's:
    test_a_pipeline_steps_gradients_are_one_process, on real ranks.)"""
    args = model_args(build_config(["--config", "tiny"]), 64)
    mx.random.seed(0)
    stage = new_stage(args, stages.plan_stages(model_bytes(args), 2)[1])
    step = PipelineStep(stage, FakeGroup(1, 2), micro_batches=4)
    step.link = link = RecordingLink(len(step.differentiated))
    x, y = (mx.random.randint(0, 64, (4, 16)) for _ in range(2))
    loss, grads = step.gradients(x, y)
    assert loss.item() > 0 and set(grads) == set(step.differentiated)
    events = link.events
    backs = [i for i, e in enumerate(events) if e[0] == "sent back"]
    weights = [i for i, e in enumerate(events) if e[0] == "weights"]
    assert len(backs) == 4 and len(weights) == 4, events
    for m in range(4):  # before micro-batch m's input gradient went back: m - 1 sums
        assert sum(w < backs[m] for w in weights) == max(m - 1, 0), events


def test_the_schedules():
    """1F1B: N - 1 - s forwards first, then one of each; every pass once, each backward
    after its forward; at most N - s micro-batches held (GPipe: all M)."""
    assert stages.schedule("1f1b", 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                         ("F", 3), ("B", 2), ("B", 3)]
    assert stages.schedule("gpipe", 1, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    for n, m in [(2, 4), (4, 8), (4, 2), (3, 3)]:
        for s in range(n):
            order = stages.schedule("1f1b", s, n, m)
            assert sorted(order) == sorted(stages.schedule("gpipe", s, n, m))
            assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
            assert [i for kind, i in order if kind == "B"] == list(range(m))
            assert stages.held_at_once(order) == min(n - s, m)
            assert stages.held_at_once(stages.schedule("gpipe", s, n, m)) == m
    with pytest.raises(DataError, match="--pipeline_schedule zigzag: must be one of 1f1b, gpipe"):
        stages.schedule("zigzag", 0, 2, 2)


def one_process_gradients(flags: list[str]):
    """The loss and gradients of global batch 0, as one process computes them."""
    cfg = build_config(flags)
    kernels.use(cfg.kernels)
    meta = load_meta(cfg.data)
    batch = ShardedBatches(open_split(cfg.data, "train", cfg.block_size), cfg.global_batch,
                           FakeGroup(0, 1), cfg.seed).batch(0)
    mx.random.seed(cfg.seed)
    if cfg.init_from:
        model = model_from_folder(cfg.init_from, meta, Path(cfg.data), cfg.fine_tune)
    else:
        model = Llama(model_args(cfg, meta["vocab_size"]))
    loss, grads = nn.value_and_grad(model, loss_fn)(model, *(mx.array(a) for a in batch))
    return loss, dict(tree_flatten(grads))


@pytest.fixture(scope="module")
def rows_data(tmp_path_factory):
    """Prompt/completion rows, prompts masked: a loss over the trained targets only."""
    base = tmp_path_factory.mktemp("rows")
    tokenizer = make_chat_folder(base / "tokenizer", "qwen25")
    rows = [{"prompt": s[:40], "completion": s[40:120]} for s in offline_corpus(40)]
    src = write_jsonl(base / "rows.jsonl", rows)
    assert prepare_main(["--out", str(base / "data"), "--jsonl", str(src), "--tokenizer",
                         str(tokenizer), "--mask_prompt"]) == 0
    return base / "data"


def test_a_pipeline_steps_gradients_are_one_process(rows_data, tmp_path):
    """The trainer's own stages and step (train.Trainer) on 2 ranks (ring), 4
    micro-batches: every gradient, each on the stage that updates it, and the loss:
    the tiny config from scratch on masked rows (each micro-batch's share of the
    global batch's trained targets), its tied matrix's two uses summed."""
    flags = [*TINY, "--data", str(rows_data), "--block_size", "160"]
    proc = run_trainer(["--grads_out", str(tmp_path), "--pipeline", "2", "--micro_batches", "4",
                        "--out", str(tmp_path / "out"), *flags], ranks=2,
                       module="tests.pipeline_grads")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss, expected = one_process_gradients(flags)
    assert loss.item() > 1  # trained targets in the batch
    saved = [mx.load(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    for got in saved:
        assert abs(got.pop("@loss").item() - loss.item()) <= 1e-6 * loss.item()
    names = [set(s) for s in saved]
    assert not names[0] & names[1] and names[0] | names[1] == set(expected)
    assert "tok_embeddings.weight" in names[0] and "norm.weight" in names[1]
    worst = 0.0
    for got in saved:
        for name, g in got.items():
            want = expected[name]
            worst = max(worst, mx.abs(g - want).max().item() / mx.abs(want).max().item())
    assert 0 < worst < 1e-5, worst


COMPILED_EAGER = 1e-6  # relative: the compiled step against the eager one (measured ~1e-7)


@pytest.mark.parametrize("fine_tune", ["full", "lora_dropout"])
def test_the_pipeline_step_runs_compiled_and_gives_the_eager_steps_gradients(
        fine_tune, request, tmp_path):
    """On 2 ranks (ring), 4 micro-batches, 3 global batches: each stage's pass (one
    micro-batch's forward and backward) is built in Python once, then replayed
    compiled for all 12 micro-batches (an eager step builds it 12 times); and the
    loss and every gradient are the eager step's within 1e-6. Full fine-tuning from
    scratch on masked rows (the tied matrix's two uses), and LoRA on a Llama folder
    with dropout (mlx's random state carried through the compiled pass)."""
    if fine_tune == "full":
        flags = [*TINY, "--data", str(request.getfixturevalue("rows_data")), "--block_size",
                 "160"]
    else:
        flags = [*TINY, "--init_from", str(request.getfixturevalue("llama")), "--data",
                 str(request.getfixturevalue("llama_data")), *LORA, "--lora_dropout", "0.1"]
    proc = run_trainer(["--report", str(tmp_path), "--batches", "3", "--pipeline", "2",
                        "--micro_batches", "4", "--out", str(tmp_path / "out"), *flags],
                       ranks=2, module="tests.pipeline_compiled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["micro_batches_run"] == 12
        assert report["traced_compiled"] == 1, report  # traced once, then replayed
        assert report["traced_eager"] == 12, report
        assert report["loss"] > 1
        assert report["worst_loss"] <= COMPILED_EAGER, report
        assert report["worst_grad"] <= COMPILED_EAGER, report


def parity(tmp_path, flags, ranks, extra=(), tolerance=PARITY, expected=None, steps=3):
    """Every logged loss of `--pipeline ranks` against one process's (`expected`, or run
    here): (the pipeline's output, its --out, one process's --out)."""
    if expected is None:
        expected = one_process(tmp_path / "one", flags)
    piped = pipelined(tmp_path / "pp", flags, ranks, *extra)
    got = train_losses(tmp_path / "pp")
    assert list(got) == list(expected) == list(range(1, steps + 1))
    worst = max(abs(got[s] - expected[s]) / expected[s] for s in expected)
    assert worst < tolerance, (worst, expected, got)
    return piped


# The tiny config from scratch with 4 blocks: tied embeddings, whose copy on the
# last stage is kept equal to the first stage's after each update; 4 steps,
# validated at 2 and 4 (through the stages).
FULL = [*TINY, "--n_layers", "4", "--steps", "4", "--eval_every", "2", "--log_every", "1"]


@pytest.fixture(scope="module")
def full_one(llama_data, tmp_path_factory):
    """One process's run of FULL: its --out."""
    out = tmp_path_factory.mktemp("one") / "out"
    one_process(out, [*FULL, "--data", str(llama_data)])
    return out


def val_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in read_metrics(out) if "val_loss" in r}


def test_full_fine_tuning_on_2_stages_resumes_exactly_and_mlx_lm_loads_its_model(
        llama_data, full_one, tmp_path):
    """Losses and validation losses one process's; OUT/model in a shard per stage that
    mlx-lm loads with one process's logits; stopped at step 2 and resumed, the losses
    of the uninterrupted pipeline to the bit; another --pipeline refused."""
    from mlx_lm.utils import load

    flags = [*FULL, "--data", str(llama_data)]
    piped = parity(tmp_path, flags, 2, ["--micro_batches", "4", "--checkpoint_every", "2"],
                   expected=train_losses(full_one), steps=4)
    assert "rank 1: stage 2 of 2: blocks 2-3 of 4, a copy of the tied embedding, the final " \
           "norm and head" in piped.stdout
    assert "1f1b: bubble 20%, at most 2 micro-batches' activations held" in piped.stdout
    assert "in 2 shards, model-00001-of-00002.safetensors onwards" in piped.stdout
    want_val, got_val = val_losses(full_one), val_losses(tmp_path / "pp")
    assert list(got_val) == [2, 4]
    assert all(abs(got_val[s] - want_val[s]) <= PARITY * want_val[s] for s in want_val)
    pieces = sorted(p.name for p in (tmp_path / "pp" / "checkpoints").iterdir())
    assert pieces == ["stage_1_of_2", "stage_2_of_2"]
    # OUT/model: each stage's shard, the index naming both; mlx-lm computes one process's logits
    model_dir = tmp_path / "pp" / "model"
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors",
                                                 "model-00002-of-00002.safetensors"}
    ids = mx.array([[1, 2, 3, 4, 5]])
    theirs = load(str(model_dir))[0](ids)
    ours = load(str(full_one / "model"))[0](ids)
    assert mx.abs(theirs - ours).max().item() < 1e-4
    # stopped after step 2, then resumed: the uninterrupted pipeline's losses, bit for bit
    split = tmp_path / "split"
    pipelined(split, [*flags, "--stop_after", "2", "--checkpoint_every", "2"], 2,
              "--micro_batches", "4")
    resumed = pipelined(split, [*flags, "--resume"], 2, "--micro_batches", "4")
    assert "at step 2" in resumed.stdout
    assert train_losses(split) == train_losses(tmp_path / "pp")
    # no pipeline on these checkpoints: refused, nothing trained (another number of
    # stages re-splits them: tests/test_resplit.py)
    refused = run_trainer([*flags, "--resume", "--out", str(split)])
    assert refused.returncode == 2 and "holds the checkpoints of --pipeline 2, and this run " \
        "asks for data-parallel" in refused.stderr and "Traceback" not in refused.stderr
    assert train_losses(split) == train_losses(tmp_path / "pp")


def test_the_compiled_pipelines_losses_are_the_eager_ones(llama_data, tmp_path):
    """The trainer's --pipeline 2 run compiled (the default: each micro-batch's pass,
    the clipping and the optimizer's step) and with --compile false: every logged
    loss and validation loss within 1e-6, the updates and the tied matrix's copy
    included."""
    flags = [*FULL, "--data", str(llama_data)]
    pipelined(tmp_path / "compiled", flags, 2, "--micro_batches", "4", "--compile", "true")
    pipelined(tmp_path / "eager", flags, 2, "--micro_batches", "4", "--compile", "false")
    for losses in (train_losses, val_losses):
        compiled, eager = losses(tmp_path / "compiled"), losses(tmp_path / "eager")
        assert list(compiled) == list(eager) and len(eager) >= 2
        worst = max(abs(compiled[s] - eager[s]) / eager[s] for s in eager)
        assert worst <= COMPILED_EAGER, (worst, compiled, eager)


def test_full_fine_tuning_losses_on_4_stages(llama_data, full_one, tmp_path):
    """4 ranks, one block each, GPipe (1F1B: the 2-stage tests; the backwards in the
    same order, the same sums)."""
    parity(tmp_path, [*FULL, "--data", str(llama_data)], 4,
           ["--micro_batches", "8", "--pipeline_schedule", "gpipe"],
           expected=train_losses(full_one), steps=4)


def adapters_open_in_mlx_lm(folder: Path, adapters: Path, one: Path) -> None:
    """OUT/adapters, gathered from the stages, opened by mlx-lm with our logits and
    one process's adapters."""
    from mlx_lm.utils import load

    ids = support.prompt_ids(folder)
    ours = support.our_adapted_model(folder, adapters)(ids)
    theirs, _ = load(str(folder), adapter_path=str(adapters))
    assert mx.abs(theirs(ids) - ours).max().item() < 1e-4
    a, b = (mx.load(str(p / "adapters.safetensors")) for p in (adapters, one))
    assert sorted(a) == sorted(b)
    assert max(mx.abs(a[k] - b[k]).max().item() for k in a) < 1e-4


def test_lora_on_2_stages_with_grad_checkpoint(llama, llama_data, tmp_path):
    piped = parity(tmp_path, [*TINY, "--init_from", str(llama), "--data", str(llama_data), *LORA,
                              "--grad_checkpoint", "true"], 2)
    assert "gathered from 2 stages" in piped.stdout
    adapters_open_in_mlx_lm(llama, tmp_path / "pp" / "adapters", tmp_path / "one" / "adapters")


def test_qlora_losses_on_2_stages(llama, tmp_path, llama_data):
    """The frozen 4-bit base split too: each stage quantized as the folder is."""
    folder = support.quantized_llama(tmp_path / "q4", llama)
    parity(tmp_path, [*TINY, "--init_from", str(folder), "--data", str(llama_data), *LORA], 2)


def test_dora_on_2_stages(llama, llama_data, tmp_path):
    """DoRA's adapters and magnitudes on each stage's blocks; OUT/adapters mlx-lm's DoRA."""
    from mlx_lm.utils import load

    parity(tmp_path, [*TINY, "--init_from", str(llama), "--data", str(llama_data), *LORA,
                      "--fine_tune", "dora"], 2)
    adapters = tmp_path / "pp" / "adapters"
    assert json.loads((adapters / "adapter_config.json").read_text())["fine_tune_type"] == "dora"
    theirs, _ = load(str(llama), adapter_path=str(adapters))
    assert type(theirs.layers[1].self_attn.q_proj).__name__ == "DoRALinear"
    adapters_open_in_mlx_lm(llama, adapters, tmp_path / "one" / "adapters")


def test_bfloat16_losses_on_2_stages(llama_data, tmp_path):
    """Each stage's passes on its bfloat16 copy, the tied matrix's copy included."""
    parity(tmp_path, [*TINY, "--data", str(llama_data), "--dtype", "bfloat16"], 2,
           tolerance=BFLOAT16_PARITY)


def test_two_copies_of_a_2_stage_pipeline_over_mpi(llama_data, full_one, tmp_path):
    """4 MPI ranks, --pipeline 2: Group.split makes 2 copies of the pipeline, each
    reading half the global batch, each stage's gradients averaged over its copies:
    every logged loss one process's."""
    from mlxcluster.facts.mpi import find_libmpi, find_mpirun, libmpi_env

    mpirun = find_mpirun(sys.executable)
    require(mpirun is not None, "no mpirun beside the test python or on PATH")
    env = {**trainer_env(), **libmpi_env(find_libmpi(mpirun=mpirun))}
    passed = [a for k in ("MLX_MPI_LIBNAME", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH",
                          "PYTHONPATH", "LD_PRELOAD", "OPENBLAS_NUM_THREADS") if k in env
              for a in ("-x", k)]
    out = tmp_path / "mpi"
    proc = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", *passed,
                           sys.executable, "-m", "reference_train.train", *FULL, "--data",
                           str(llama_data), "--pipeline", "2", "--progress", "false",
                           "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gradients all-reduced in float32 over the 2 copies" in proc.stdout
    expected, got = train_losses(full_one), train_losses(out)
    assert list(got) == list(expected)
    assert max(abs(got[s] - expected[s]) / expected[s] for s in expected) < PARITY
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["stage_1_of_2",
                                                                       "stage_2_of_2"]
