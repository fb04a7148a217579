"""The reference trainer end to end, on real mlx: parity across ranks, exact resume, memory.

Multi-rank runs use `mlx.launch -n N --backend ring` on this machine (no ssh),
with OpenBLAS preloaded when the system has it (mlxcluster.facts.blas).
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from reference_train.prepare import prepare_offline
from tests import waits

from .conftest import require
from .train_support import MLX_LAUNCH, read_metrics, run_trainer, train_losses

TINY = ["--config", "tiny", "--eval_every", "0", "--sample_tokens", "0"]


@pytest.fixture(scope="module")
def offline_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "offline"
    prepare_offline(out, n_stories=600)
    return out


def check(proc):
    assert "error" not in proc.stderr.lower(), proc.stderr[-2000:]
    return proc


def test_losses_match_step_by_step_on_1_2_and_4_ranks(offline_data, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    losses = {}
    for ranks in (1, 2, 4):
        out = tmp_path / f"r{ranks}"
        proc = check(run_trainer([*TINY, "--steps", "6", "--data", str(offline_data),
                                  "--out", str(out)], ranks=ranks))
        assert f"ranks {ranks} | global batch 8 = {ranks} ranks" in proc.stdout
        losses[ranks] = train_losses(out)
        assert sorted(losses[ranks]) == [1, 2, 3, 4, 5, 6]
        assert all(r["ranks"] == ranks and len(r["peak_mem_mb"]) == ranks
                   for r in read_metrics(out) if "loss" in r)
    for ranks in (2, 4):
        for step, loss in losses[1].items():
            assert abs(losses[ranks][step] - loss) < 1e-4, (ranks, step, losses)
    assert losses[1][6] < losses[1][1]  # and it learns


def test_gradient_accumulation_matches_one_big_batch(offline_data, tmp_path):
    runs = {}
    for accum in (1, 4):
        out = tmp_path / f"a{accum}"
        proc = check(run_trainer([*TINY, "--steps", "4", "--grad_accum", str(accum),
                                  "--data", str(offline_data), "--out", str(out),
                                  "--sample_tokens", "20", "--eval_every", "2"]))
        runs[accum] = train_losses(out)
    for step, loss in runs[1].items():
        assert abs(runs[4][step] - loss) < 1e-4, runs
    # the end of a run: validation entries, loss curve, text sample
    assert [r["step"] for r in read_metrics(out) if "val_loss" in r] == [2, 4]
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sample.txt").read_text().startswith("Once upon a time")
    assert "sample: 'Once upon a time" in proc.stdout


def test_resume_continues_exactly(offline_data, tmp_path):
    common = [*TINY, "--steps", "10", "--data", str(offline_data)]
    check(run_trainer([*common, "--out", str(tmp_path / "straight")]))
    check(run_trainer([*common, "--out", str(tmp_path / "split"), "--stop_after", "5"]))
    assert max(train_losses(tmp_path / "split")) == 5
    # `--resume` alone means auto (test_resume_on_another_rank_count passes auto).
    proc = check(run_trainer([*common, "--out", str(tmp_path / "split"), "--resume"]))
    assert "resumed from" in proc.stdout and "at step 5" in proc.stdout
    straight, split = train_losses(tmp_path / "straight"), train_losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 11))  # no step logged twice
    assert split == straight  # every loss, bit for bit
    a = mx.load(str(tmp_path / "straight/checkpoints/step_000010/model.safetensors"))
    b = mx.load(str(tmp_path / "split/checkpoints/step_000010/model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(np.array(a[name]), np.array(b[name])), name
    state = json.loads((tmp_path / "split/checkpoints/step_000010/state.json").read_text())
    assert state["data"] == {"epoch": 0, "step_in_epoch": 10, "seed": 0}


def test_resume_on_another_rank_count(offline_data, tmp_path):
    """The data position is a function of the step: 5 steps on 1 rank + 5 on 2 ranks
    give the losses of 10 steps on 1 rank."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    common = [*TINY, "--steps", "10", "--data", str(offline_data)]
    check(run_trainer([*common, "--out", str(tmp_path / "straight")]))
    check(run_trainer([*common, "--out", str(tmp_path / "mixed"), "--stop_after", "5"]))
    check(run_trainer([*common, "--out", str(tmp_path / "mixed"), "--resume", "auto"], ranks=2))
    straight, mixed = train_losses(tmp_path / "straight"), train_losses(tmp_path / "mixed")
    assert sorted(mixed) == list(range(1, 11))
    for step, loss in straight.items():
        assert abs(mixed[step] - loss) < 1e-4, (step, straight, mixed)


def test_batch_that_does_not_divide_is_refused_on_every_rank(offline_data, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    proc = run_trainer([*TINY, "--global_batch", "7", "--data", str(offline_data),
                        "--out", str(tmp_path / "o")], ranks=2)
    assert "error: global_batch 7 does not split evenly: ranks 2 x grad_accum 1 = 2" in proc.stderr
    assert "7 % 2 = 1" in proc.stderr
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def write_random_tokens(path, n_tokens):
    """A token directory of `n_tokens` random bytes: big, so that loading it all would show."""
    path.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 256, n_tokens, dtype=np.uint16).tofile(path / "train.bin")
    rng.integers(0, 256, 10_000, dtype=np.uint16).tofile(path / "val.bin")
    meta = {"format": "reference_train.tokens/1", "dtype": "uint16", "vocab_size": 257,
            "eos_id": 256, "tokenizer": {"kind": "byte"},
            "splits": {"train": {"file": "train.bin", "tokens": n_tokens, "documents": 1},
                       "val": {"file": "val.bin", "tokens": 10_000, "documents": 1}}}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_rank_memory_is_flat_in_ranks_and_dataset_size(tmp_path):
    """Peak memory per rank, two measures: mx.get_peak_memory() (MLX allocations) and
    the process's peak RSS (getrusage ru_maxrss: also counts numpy, the data pages
    and the distributed backend, which alone adds ~27 MiB RSS to every rank).

    Same model and global batch on 1 and 4 ranks: each of 4 ranks holds a quarter
    of the batch's activations, so its peak must not exceed the single rank's by
    more than 15%. And 60 MB of token data instead of 1 MB may not move a rank's
    peak RSS by more than 5%: a loader reading the whole file would add >= 60 MB.
    """
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    small = write_random_tokens(tmp_path / "small", 500_000)
    big = write_random_tokens(tmp_path / "big", 30_000_000)
    model = ["--config", "tiny", "--dim", "128", "--hidden_dim", "256", "--block_size", "128",
             "--global_batch", "16", "--steps", "3", "--eval_every", "0", "--sample_tokens", "0"]
    peaks = {}
    for name, data, ranks in (("1-small", small, 1), ("1-big", big, 1), ("4-big", big, 4)):
        out = tmp_path / name
        check(run_trainer([*model, "--data", str(data), "--out", str(out)], ranks=ranks))
        last = [r for r in read_metrics(out) if "loss" in r][-1]
        peaks[name] = (last["peak_mem_mb"], last["peak_rss_mb"])
    (mlx1,), (rss1,) = peaks["1-big"]
    mlx4, rss4 = peaks["4-big"]
    assert len(mlx4) == 4 and len(rss4) == 4
    assert max(mlx4) <= 1.15 * mlx1, peaks
    assert max(rss4) <= 1.15 * rss1, peaks
    (_,), (rss_small,) = peaks["1-small"]
    assert rss1 <= 1.05 * rss_small, peaks


def test_heartbeat_lines_only_when_a_launcher_asks(offline_data, tmp_path):
    """MLXCLUSTER_HEARTBEAT=1: one marker line per step, then 'done', on stderr (stdout
    carries rank 0's record lines: tests/test_record_interleave.py); without it, none."""
    import sys

    from reference_train.metrics import HEARTBEAT_MARK

    from .train_support import REPO, trainer_env

    args = [sys.executable, "-m", "reference_train.train", *TINY, "--steps", "3",
            "--data", str(offline_data)]
    watched = waits.run([*args, "--out", str(tmp_path / "hb")], cwd=REPO,
                             env={**trainer_env(), "MLXCLUSTER_HEARTBEAT": "1"})
    beats = [ln for ln in watched.stderr.splitlines() if ln.startswith(HEARTBEAT_MARK)]
    assert HEARTBEAT_MARK not in watched.stdout
    assert beats == [f"{HEARTBEAT_MARK} 0 1", f"{HEARTBEAT_MARK} 0 2", f"{HEARTBEAT_MARK} 0 3",
                     f"{HEARTBEAT_MARK} 0 done"], watched.stdout + watched.stderr
    plain = waits.run([*args, "--out", str(tmp_path / "plain")], cwd=REPO,
                           env={k: v for k, v in trainer_env().items()
                                if k != "MLXCLUSTER_HEARTBEAT"})
    assert plain.returncode == 0 and HEARTBEAT_MARK not in plain.stdout + plain.stderr


def test_a_rank_that_fails_alone_fails_the_run_though_mlx_launch_exits_0():
    """mlx.launch exits 0 when one of its ranks fails (it only warns); run_trainer
    gives that rank's code, so a test asserting a run's success cannot pass on it."""
    failed = run_trainer(["3"], ranks=2, module="tests.rank_exit")
    assert "Node with rank 1 exited with code 3" in failed.stderr, failed.stderr[-2000:]
    assert failed.returncode == 3
    assert run_trainer(["0"], ranks=2, module="tests.rank_exit").returncode == 0
