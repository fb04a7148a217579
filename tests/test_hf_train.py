"""A Llama folder in, a model mlx-lm opens out: `--init_from`, `prepare --tokenizer DIR`,
OUT/model and `python -m reference_train.export`, against the real mlx-lm and tokenizers."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from reference_train import prepare
from reference_train.export import main as export_main
from reference_train.hf_io import hf_from_ours
from reference_train.model import Llama, ModelArgs, generate
from reference_train.tokenizer import FolderTokenizer
from tests import waits

from .conftest import require
from .hf_support import LLAMA3_CONFIG, make_llama_folder, mlx_lm_logits, train_tokenizer
from .train_support import MLX_LAUNCH, PYTHON, REPO, run_trainer, train_losses, trainer_env

COMMON = ["--config", "tiny", "--block_size", "32", "--eval_every", "0", "--sample_tokens", "0"]
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def two_rank_run(llama, llama_data, tmp_path_factory):
    """3 steps from the folder on 1 and on 2 ranks (mlx.launch, ring)."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    runs = {}
    for ranks in (1, 2):
        out = tmp_path_factory.mktemp(f"run{ranks}")
        proc = run_trainer([*COMMON, "--steps", "3", "--init_from", str(llama),
                            "--data", str(llama_data), "--out", str(out)],
                           ranks=ranks)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[ranks] = (out, proc)
    return runs


def test_prepare_records_the_folders_tokenizer(llama, llama_data):
    meta = json.loads((llama_data / "meta.json").read_text())
    tok = FolderTokenizer(llama)
    assert meta["tokenizer"] == {"kind": "folder", "name": "tiny-llama", "path": str(llama),
                                 "vocab_size": 300, "eos_id": tok.eos_id,
                                 "tokenizer_json_sha256": tok.sha256}
    assert (meta["vocab_size"], meta["eos_id"]) == (300, tok.tok.token_to_id("<|endoftext|>"))
    assert (llama_data / "tokenizer" / "tokenizer.json").read_bytes() == \
        (llama / "tokenizer.json").read_bytes()
    # the token files hold the folder tokenizer's ids for the corpus
    ids = np.fromfile(llama_data / "train.bin", dtype=np.uint16)
    first = tok.encode(prepare.offline_corpus(1)[0])
    assert ids[:len(first) + 1].tolist() == [*first, tok.eos_id]


def test_init_from_trains_the_same_on_1_and_2_ranks(llama, two_rank_run):
    losses = {}
    for ranks, (out, proc) in two_rank_run.items():
        assert f"params from {llama} |" in proc.stdout
        assert "model for mlx-lm: " in proc.stdout and "the float32 master weights" in proc.stdout
        losses[ranks] = train_losses(out)
    assert sorted(losses[2]) == [1, 2, 3]
    for step, loss in losses[1].items():
        assert abs(losses[2][step] - loss) < 1e-4, losses


def test_init_from_starts_from_the_folders_weights(llama, llama_data, tmp_path):
    """One step at a negligible learning rate: OUT/model's logits are the folder's."""
    out = tmp_path / "run"
    proc = run_trainer([*COMMON, "--steps", "1", "--lr", "1e-12", "--min_lr", "0",
                        "--warmup_steps", "0", "--init_from", str(llama), "--data",
                        str(llama_data), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokens = mx.array([FolderTokenizer(llama).encode(PROMPT)])
    diff = mx.abs(mlx_lm_logits(out / "model", tokens) - mlx_lm_logits(llama, tokens)).max()
    assert diff.item() < 1e-4


def our_model(checkpoint) -> Llama:
    state = json.loads((checkpoint / "state.json").read_text())
    model = Llama(ModelArgs(**state["model_args"]))
    model.load_weights(str(checkpoint / "model.safetensors"))
    return model


def test_mlx_lm_generates_from_out_model(llama, two_rank_run):
    out = two_rank_run[2][0]
    model_dir = out / "model"
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json"]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    ours = our_model(out / "checkpoints" / "step_000003")
    tok = FolderTokenizer(llama)
    ids = tok.encode(PROMPT)
    diff = mx.abs(mlx_lm_logits(model_dir, mx.array([ids])) - ours(mx.array([ids]))).max()
    assert diff.item() < 1e-4
    # the real command, greedy: the same text as our model's greedy continuation
    proc = waits.run([PYTHON, "-m", "mlx_lm", "generate", "--model", str(model_dir),
                           "--prompt", PROMPT, "--max-tokens", "8", "--temp", "0"],
                          cwd=REPO, env=trainer_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout.split("==========\n")[1].rsplit("\n", 1)[0]
    greedy = generate(ours, ids, 8, mx.random.key(0), temperature=0)
    if tok.eos_id in greedy:
        greedy = greedy[:greedy.index(tok.eos_id)]
    assert len(greedy) >= 4 and text == tok.tok.decode(greedy), (text, greedy)
    assert "Generation: " in proc.stdout


def test_export_cli_writes_any_checkpoint(two_rank_run, tmp_path, capsys):
    out = two_rank_run[2][0]
    assert export_main([str(out), str(tmp_path / "fp32")]) == 0
    said = capsys.readouterr().out
    assert "the float32 master weights" in said
    exported = mx.load(str(tmp_path / "fp32" / "model.safetensors"))
    at_end = mx.load(str(out / "model" / "model.safetensors"))
    saved = mx.load(str(out / "checkpoints" / "step_000003" / "model.safetensors"))
    assert sorted(exported) == sorted(at_end) == sorted(hf_from_ours(k) for k in saved)
    assert all(mx.array_equal(exported[hf_from_ours(k)], v).item() for k, v in saved.items())
    assert export_main([str(out / "checkpoints" / "step_000003"), str(tmp_path / "bf16"),
                        "--export_dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "a bfloat16 copy of the float32 master weights, as --export_dtype asks" in said
    half = mx.load(str(tmp_path / "bf16" / "model.safetensors"))
    assert {v.dtype for v in half.values()} == {mx.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    tokens = mx.array([list(range(1, 60, 2))])
    full, bf16 = mlx_lm_logits(tmp_path / "fp32", tokens), mlx_lm_logits(tmp_path / "bf16", tokens)
    assert bf16.dtype == mx.bfloat16
    assert 1e-3 < mx.abs(full - bf16.astype(mx.float32)).max().item() < 0.1  # why it is asked for
    assert export_main([str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "error: no checkpoint at" in capsys.readouterr().err


def test_a_byte_trained_model_opens_in_mlx_lm(tmp_path):
    """From scratch on the byte tokenizer: OUT/model carries an equivalent tokenizer.json."""
    from mlx_lm import load

    from reference_train.prepare import prepare_offline
    from reference_train.tokenizer import ByteTokenizer

    data = tmp_path / "data"
    prepare_offline(data, n_stories=100)
    out = tmp_path / "run"
    proc = run_trainer([*COMMON, "--steps", "2", "--data", str(data), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model for mlx-lm: " in proc.stdout and "byte tokenizer" in proc.stdout
    model, tokenizer = load(str(out / "model"))
    text = "Once upon a time, Zoë"
    assert tokenizer.encode(text) == ByteTokenizer().encode(text)
    ids = mx.array([ByteTokenizer().encode(text)])
    ours = our_model(out / "checkpoints" / "step_000002")
    assert mx.abs(model(ids) - ours(ids)).max().item() < 1e-4
    assert tokenizer.eos_token_ids == {256}


def run_refused(args, tmp_path):
    proc = run_trainer([*COMMON, "--steps", "1", "--out", str(tmp_path / "run"), *args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_refusals_exit_2_naming_both_sides(llama, llama_data, tmp_path):
    quantized = make_llama_folder(tmp_path / "q4", LLAMA3_CONFIG, quantize=True)
    err = run_refused(["--init_from", str(quantized), "--data", str(llama_data)], tmp_path)
    assert "the weights are quantized" in err and "full fine-tuning trains every weight" in err
    other = tmp_path / "gemma"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**LLAMA3_CONFIG, "model_type": "gemma2"}))
    err = run_refused(["--init_from", str(other), "--data", str(llama_data)], tmp_path)
    assert "model_type 'gemma2' is not supported; supported: llama, mistral, qwen2, qwen3" in err
    # byte-tokenized data for a model with its own tokenizer
    from reference_train.prepare import prepare_offline

    prepare_offline(tmp_path / "bytes", n_stories=50)
    err = run_refused(["--init_from", str(llama), "--data", str(tmp_path / "bytes")], tmp_path)
    assert f"the data {tmp_path / 'bytes'} was tokenized with the byte tokenizer" in err
    assert f"the model {llama} uses {llama / 'tokenizer.json'}" in err
    assert f"--tokenizer {llama}" in err


def test_a_run_from_a_folder_resumes_exactly(llama, llama_data, two_rank_run, tmp_path):
    out = tmp_path / "run"
    args = [*COMMON, "--steps", "3", "--init_from", str(llama), "--data", str(llama_data),
            "--out", str(out)]
    proc = run_trainer([*args, "--stop_after", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_trainer([*args, "--resume", "auto"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    uninterrupted = train_losses(two_rank_run[1][0])
    assert train_losses(out) == pytest.approx(uninterrupted, rel=1e-6)


def test_data_from_an_older_prepare_exports_without_tokenizer_only_when_told(tmp_path):
    """Data tokenized by name before prepare kept the tokenizer's files: the export at
    the end of a run still writes the model and says what is missing; the CLI refuses."""
    from reference_train.errors import DataError
    from reference_train.export import export_model
    from reference_train.prepare import prepare_offline

    data = tmp_path / "data"
    prepare_offline(data, n_stories=20)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "tokenizer": {"kind": "hf", "name": "gpt2"}}))
    args = ModelArgs(vocab_size=257, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    weights = dict(tree_flatten(Llama(args).parameters()))
    with pytest.raises(DataError, match="no tokenizer files found .* pass --tokenizer DIR"):
        export_model(weights, args, tmp_path / "model", data_dir=data)
    note = export_model(weights, args, tmp_path / "model", data_dir=data, need_tokenizer=False)
    assert "NO tokenizer files" in note and "copy its tokenizer.json" in note
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "config.json", "model.safetensors", "model.safetensors.index.json"]


def test_the_same_tokenizer_written_again_still_fits(llama, llama_data, tmp_path):
    """A copy of the model whose tokenizer.json was written again (other bytes, same
    tokenizer) accepts the data; a tokenizer trained otherwise does not."""
    import shutil

    from reference_train.data import load_meta
    from reference_train.errors import DataError
    from reference_train.files import file_sha256
    from reference_train.hf_io import check_data_fits, load_folder

    again = tmp_path / "again"
    shutil.copytree(llama, again)
    parsed = json.loads((llama / "tokenizer.json").read_text())
    (again / "tokenizer.json").write_text(json.dumps(parsed, indent=1, sort_keys=True))
    args = load_folder(again)[0]
    meta = load_meta(llama_data)
    assert file_sha256(again / "tokenizer.json") != meta["tokenizer"]["tokenizer_json_sha256"]
    check_data_fits(meta, llama_data, args, again)
    other = tmp_path / "other"
    shutil.copytree(llama, other)
    train_tokenizer(vocab_size=290).save_pretrained(other)
    with pytest.raises(DataError, match=f"but the model {other} uses"):
        check_data_fits(meta, llama_data, args, other)
