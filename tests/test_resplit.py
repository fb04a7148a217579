"""A pipeline's checkpoints resumed over another --pipeline (reference_train/resplit.py)
and mirrored on the next stage's host (reference_train/mirror.py): which layout, step
and source ranks a resume takes from made-up holdings; who mirrors to whom on a
HostLayout; the mirror's files sent over real ring ranks, byte for byte; and on real
ranks, --pipeline 4 stopped and resumed as --pipeline 2 then 3, every logged loss one
process's (full fine-tuning and DoRA), and a stage's lost folder refused by name."""

from __future__ import annotations

import json
import re
import shutil

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest

from reference_train.checkpoint import save_checkpoint
from reference_train.mirror import describe_mirrors, mirrored_stages
from reference_train.resplit import Piece, choose_checkpoint, scan_pieces
from reference_train.resume import HostLayout, ResumeError

from .hf_support import LLAMA3_CONFIG, make_llama_folder
from .train_support import (
    PARITY,
    TINY,
    one_process,
    pipelined,
    read_metrics,
    run_trainer,
    train_losses,
)

# ---------------------------------------------------------------- the choice


def layout_pieces(count: int, step: int, split=None, hosts=(), digest="d") -> list[Piece]:
    """Every stage's piece of step `step` of --pipeline `count` (one block each unless
    `split`)."""
    split = split or [1] * count
    starts = [sum(split[:k]) for k in range(count)]
    return [Piece(count, k, step, (starts[k], starts[k] + split[k]), f"{digest}{k}",
                  tuple(hosts)) for k in range(count)]


def only(pieces: list[Piece], *stages: int) -> list[Piece]:
    return [p for p in pieces if p.stage in stages]


FOUR = [(0, 1), (1, 2), (2, 3), (3, 4)]
TWO = [(0, 2), (2, 4)]


def test_every_stage_on_its_own_rank_is_todays_resume():
    four = layout_pieces(4, 6) + layout_pieces(4, 4)
    choice = choose_checkpoint([only(four, k) for k in range(4)], 4, FOUR)
    assert (choice.count, choice.step, choice.same, choice.sources) == (4, 6, True, (0, 1, 2, 3))


def test_another_number_of_stages_re_splits_from_the_lowest_holders():
    # one --out seen by both ranks: each holds what the writer found
    held = layout_pieces(4, 4) + layout_pieces(4, 2)
    choice = choose_checkpoint([held, held], 2, TWO)
    assert (choice.count, choice.step, choice.same, choice.sources) == (4, 4, False, (0, 0, 0, 0))
    assert choice.blocks == tuple(FOUR) and choice.notes == ()
    # more stages than the checkpoints': 2 -> 3
    held = layout_pieces(2, 6, [2, 2])
    choice = choose_checkpoint([held] * 3, 3, [(0, 1), (1, 3), (3, 4)])
    assert (choice.count, choice.step, choice.sources) == (2, 6, (0, 0))


def test_a_lost_hosts_piece_is_taken_from_its_mirror():
    """--pipeline 4 over hosts a-d, each stage mirrored on the next host; c is lost and
    the run goes on as --pipeline 3 on a, b, d: stage 3's piece is on d (its mirror)."""
    pieces = layout_pieces(4, 4, hosts="abcd")
    own_and_mirror = {"a": (0, 3), "b": (1, 0), "d": (3, 2)}
    holdings = [only(pieces, *own_and_mirror[h]) for h in "abd"]
    choice = choose_checkpoint(holdings, 3, [(0, 1), (1, 3), (3, 4)])
    assert (choice.count, choice.step, choice.same, choice.sources) == (4, 4, False, (0, 1, 2, 0))
    # the same 4 stages, c's disk replaced: its piece is read from d, not today's resume
    holdings = [only(pieces, 0, 3), only(pieces, 1, 0), [], only(pieces, 3, 2)]
    choice = choose_checkpoint(holdings, 4, FOUR)
    assert (choice.count, choice.same, choice.sources) == (4, False, (0, 1, 3, 0))


def test_a_stage_no_rank_holds_is_refused_naming_it_and_its_host():
    pieces = layout_pieces(4, 4, hosts="abcd")
    holdings = [only(pieces, 0), only(pieces, 1), only(pieces, 3)]  # c's disk, unmirrored
    with pytest.raises(ResumeError) as refused:
        choose_checkpoint(holdings, 3, [(0, 1), (1, 3), (3, 4)])
    message = str(refused.value)
    assert "stage 3 of 4's checkpoint is on no rank's disk: step 4 of --pipeline 4 is held " \
           "for stages 1, 2, 4 only (stage 3 ran on c, whose disk holds it, and its mirror is " \
           "on d's when that is a disk of its own)" in message
    assert "Nothing was trained" in message and "bring that host back" in message
    # older checkpoints without the hosts: said without them
    plain = layout_pieces(4, 4)
    with pytest.raises(ResumeError, match="stages 2-3 of 4's checkpoint are on no rank's disk"):
        choose_checkpoint([only(plain, 0, 3)], 1 + 1, TWO)


def test_the_newest_whole_step_wins_and_a_newer_partial_one_is_said():
    newer = only(layout_pieces(2, 8, [2, 2]), 0)  # stage 2 stopped before writing step 8
    older = layout_pieces(4, 6)
    choice = choose_checkpoint([newer + older] * 2, 2, TWO)
    assert (choice.count, choice.step) == (4, 6)
    assert choice.notes == ("step 8 of --pipeline 2 passed over (stage 2 of 2 held by no "
                            "rank): resuming from step 6",)
    # a tie goes to this run's own layout
    tie = layout_pieces(2, 6, [2, 2]) + layout_pieces(4, 6)
    assert choose_checkpoint([only(tie, 0) + tie[2:], only(tie, 1) + tie[2:]], 2, TWO).same
    assert choose_checkpoint([tie, tie], 4, FOUR).count == 4


def test_the_same_stages_split_otherwise_are_refused():
    held = layout_pieces(2, 4, [1, 3])
    with pytest.raises(ResumeError, match="holds blocks 0-0, 1-3, this run's stages 0-1, 2-3: "
                                          "the same number of stages with another "
                                          "--pipeline_split does not re-split"):
        choose_checkpoint([held, held], 2, TWO)


def test_holders_of_different_contents_are_refused_and_nothing_is_none():
    a, b = layout_pieces(2, 4, [2, 2], digest="x"), layout_pieces(2, 4, [2, 2], digest="y")
    with pytest.raises(ResumeError, match="the ranks hold different checkpoints of stage 1 of 2"):
        choose_checkpoint([a, b], 4, FOUR)
    assert choose_checkpoint([[], []], 2, TWO) is None


def test_a_disk_is_scanned_for_whole_pieces_below_resume_before(tmp_path):
    """scan_pieces: every stage folder's whole steps (a damaged one passed over), only
    those below --resume_before, or exactly the step asked for."""
    model = nn.Linear(2, 2)
    optimizer = optim.AdamW(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    for k in range(2):
        for step in (2, 4, 6):
            state = {"pipeline": {"stages": 2, "stage": k, "blocks": [2 * k, 2 * k + 2],
                                  "hosts": ["a", "b"]}}
            save_checkpoint(tmp_path / f"stage_{k + 1}_of_2", step, model, optimizer, state,
                            keep=0)
    (tmp_path / "stage_2_of_2" / "step_000006" / "model.safetensors").write_bytes(b"damaged")
    found = {(p.stage, p.step) for p in scan_pieces(tmp_path)}
    assert found == {(0, 2), (0, 4), (0, 6), (1, 2), (1, 4)}
    assert {(p.stage, p.step) for p in scan_pieces(tmp_path, before=6)} == \
        {(0, 2), (0, 4), (1, 2), (1, 4)}
    assert {(p.stage, p.step) for p in scan_pieces(tmp_path, only=2)} == {(0, 2), (1, 2)}
    piece = scan_pieces(tmp_path, only=2)[1]
    assert piece.blocks == (2, 4) and piece.hosts == ("a", "b") and len(piece.digest) == 64


# ---------------------------------------------------------------- the mirror


def test_who_mirrors_on_whose_host():
    apart = HostLayout(["a", "b", "c"], 0)  # each host its own disk
    assert mirrored_stages(apart, 3, 1) == [True, True, True]
    assert describe_mirrors(apart, [True, True, True]) == [
        "stage 1's checkpoints are mirrored on b (stage 2's host)",
        "stage 2's checkpoints are mirrored on c (stage 3's host)",
        "stage 3's checkpoints are mirrored on a (stage 1's host)"]
    assert mirrored_stages(HostLayout(["a", "a"], 0), 2, 1) == [False, False]  # one machine
    # a and b see one --out (storage.py found their tokens), c its own disk
    shared = HostLayout(["a", "b", "c"], 0, storage=[0, 0, 2])
    assert mirrored_stages(shared, 3, 1) == [False, True, True]
    assert mirrored_stages(HostLayout(list("abcd"), 0), 2, 2) == [False, False]  # replicas
    assert mirrored_stages(HostLayout(["a"], 0), 1, 1) == [False]


def test_a_mirror_arrives_byte_for_byte_installed_and_pruned(tmp_path):
    """Two ring ranks, each with a folder standing for its own disk: each stage's
    checkpoints, sent in many chunks each way at once, land on the other's disk
    under the stage's folder name, whole (hashes) and pruned to --keep_checkpoints."""
    proc = run_trainer([str(tmp_path), "2", "4", "6"], ranks=2,
                       module="tests.mirror_exchange")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank, other in ((0, 1), (1, 0)):
        own = tmp_path / f"rank_{other}" / "checkpoints" / f"stage_{other + 1}_of_2"
        copy = tmp_path / f"rank_{rank}" / "checkpoints" / f"stage_{other + 1}_of_2"
        assert sorted(p.name for p in copy.iterdir()) == ["latest", "step_000004", "step_000006"]
        assert (copy / "latest").read_text() == "step_000006\n"
        for step in ("step_000004", "step_000006"):
            for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
                assert (copy / step / name).read_bytes() == (own / step / name).read_bytes()
            assert (own / step / "model.safetensors").stat().st_size > 300  # several chunks


def test_a_mirror_without_room_is_not_kept_and_the_run_goes_on(tmp_path):
    """Rank 1's disk reads as full: stage 1's piece is received all the same (the
    sender never waits) and not kept there, said with the room and what it costs;
    stage 2's piece still reaches rank 0, and both ranks go on to the next step."""
    proc = run_trainer([str(tmp_path), "2", "4"], ranks=2,
                       module="tests.mirror_exchange", extra_env={"MIRROR_NO_ROOM_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (2, 4):
        assert f"rank 1 step {step}: stage 1's mirrored checkpoint step_00000{step} not kept: " \
               in proc.stdout and "has 0 bytes free, the piece is" in proc.stdout, proc.stdout
    assert "without this copy --elastic cannot go on if stage 1's host is lost" in proc.stdout
    assert "rank 0 step" not in proc.stdout
    assert not (tmp_path / "rank_1" / "checkpoints" / "stage_1_of_2").exists() or \
        not any((tmp_path / "rank_1" / "checkpoints" / "stage_1_of_2").glob("step_*"))
    copy = tmp_path / "rank_0" / "checkpoints" / "stage_2_of_2"
    assert (copy / "latest").read_text() == "step_000004\n"
    assert "rank 0 mirrored steps [2, 4]" in proc.stdout and "rank 1 mirrored" in proc.stdout


# ---------------------------------------------------------------- on real ranks


# The tiny config from scratch with 4 blocks (tied embeddings), 8 steps, a checkpoint
# every 2: stopped after 4 on --pipeline 4, resumed on 2 to step 6, then on 3 to the end.
EIGHT = [*TINY, "--n_layers", "4", "--steps", "8", "--log_every", "1",
         "--checkpoint_every", "2"]
DORA = ["--fine_tune", "dora", "--lora_rank", "4", "--lora_layers", "-1"]


@pytest.fixture(scope="module")
def deep_llama(llama, tmp_path_factory):
    """The tiny Llama with 4 blocks (DoRA adapts a model folder), `llama`'s tokenizer."""
    folder = make_llama_folder(tmp_path_factory.mktemp("deep") / "llama",
                               {**LLAMA3_CONFIG, "num_hidden_layers": 4})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama / name, folder / name)
    return folder


def within(got: dict[int, float], want: dict[int, float]) -> float:
    assert list(got) == list(want)
    return max(abs(got[s] - want[s]) / want[s] for s in want)


@pytest.mark.parametrize("tuning", ["full", "dora"])
def test_four_stages_resumed_on_fewer_give_one_process_losses(llama_data, deep_llama, tmp_path,
                                                             tuning):
    """Full fine-tuning: 4 stages stopped after step 4, resumed on 2 to step 6, then on 3
    to the end (first with a stage's folder lost: refused); DoRA: 4, then 2 to the end.
    Every logged loss one process's."""
    flags = [*EIGHT, "--data", str(llama_data),
             *(["--init_from", str(deep_llama), *DORA] if tuning == "dora" else [])]
    expected = one_process(tmp_path / "one", flags)
    out = tmp_path / "pp"
    first = pipelined(out, [*flags, "--stop_after", "4", "--resume", "auto"], 4)
    assert f"no checkpoint in {out}; starting from step 0" in first.stdout
    assert "mirrored" not in first.stdout  # local ranks share one --out: no mirror
    if tuning == "dora":  # the adapters one process's too
        two = pipelined(out, [*flags, "--resume", "auto"], 2)
        assert "rank 1: resumed step 4 re-split from --pipeline 4 (stages 3-4 of 4's pieces) " \
               "into stage 2 of 2" in two.stdout
        assert within(train_losses(out), expected) < PARITY
        ours, theirs = (mx.load(str(o / "adapters" / "adapters.safetensors"))
                        for o in (out, tmp_path / "one"))
        assert sorted(ours) == sorted(theirs)
        assert max(mx.abs(ours[k] - theirs[k]).max().item() for k in ours) < 1e-4
        return
    lost = tmp_path / "lost"
    shutil.copytree(out, lost)
    shutil.rmtree(lost / "checkpoints" / "stage_3_of_4")
    before = read_metrics(lost)
    refused = run_trainer(["--pipeline", "2", *flags, "--resume", "auto", "--out", str(lost)],
                          ranks=2)
    # mlx.launch exits 0 whatever its ranks do; the first rank out says the trainer's 2
    assert re.search(r"Node with rank \d exited with code 2", refused.stderr), refused.stderr
    assert "Traceback" not in refused.stderr
    assert "stage 3 of 4's checkpoint is on no rank's disk: step 4 of --pipeline 4 is held " \
           "for stages 1, 2, 4 only" in refused.stderr
    assert read_metrics(lost) == before
    assert not (lost / "checkpoints" / "stage_1_of_2").exists()
    two = pipelined(out, [*flags, "--stop_after", "6", "--resume", "auto"], 2)
    assert "re-splitting step 4 of --pipeline 4's checkpoints over --pipeline 2: stage 1's " \
           "piece from rank 0 on" in two.stdout
    assert "rank 0: resumed step 4 re-split from --pipeline 4 (stages 1-2 of 4's pieces) into " \
           "stage 1 of 2" in two.stdout
    # the last stage's copy of the tied embedding: old stage 1's matrix
    assert "rank 1: resumed step 4 re-split from --pipeline 4 (stages 1, 3, 4 of 4's pieces) " \
           "into stage 2 of 2" in two.stdout
    three = pipelined(out, [*flags, "--resume", "auto"], 3)
    assert "rank 2: resumed step 6 re-split from --pipeline 2 (stages 1-2 of 2's pieces) into " \
           "stage 3 of 3" in three.stdout
    assert within(train_losses(out), expected) < PARITY
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == sorted(f"stage_{k}_of_{n}" for n in (2, 3, 4) for k in range(1, n + 1))
    state = json.loads((out / "checkpoints" / "stage_3_of_3" / "step_000008" / "state.json")
                       .read_text())
    assert state["pipeline"]["stages"] == 3 and len(state["pipeline"]["hosts"]) == 3
