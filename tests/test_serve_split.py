"""The split check serve makes before launch (mlxcluster/fit/split.py), on
model folders made by mlx-lm's own classes and writer, judged by the
installed mlx-lm, and on hosts whose memory facts come from real captured
sysctl and /proc/meminfo outputs (tests/fixtures/macos/SOURCES.md).

Two kinds of model: tiny folders of each family mlx-lm splits (Llama 3,
Mistral, Qwen2, Qwen3, Gemma, a quantized Llama), whose family, heads and
files are judged for real; and the public Llama 3.3 70B config.json built
lazily by mlx-lm's class (shapes, no weights) for the memory judgement."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from mlxcluster.errors import InputError
from mlxcluster.facts.capture import MEMINFO, PROBE, HostCapture
from mlxcluster.facts.facts import host_facts
from mlxcluster.fit.family import PIPELINE, TENSOR, FamilySupport, StandInGroup
from mlxcluster.fit.model_folder import read_model_folder
from mlxcluster.fit.split import (
    FITS,
    GIB,
    MIB,
    TOO_BIG,
    UNKNOWN,
    judge_split,
    pipeline_layers,
    rank_bytes,
)
from mlxcluster.fit.split_check import check_split, refusal
from tests.hf_support import (
    LLAMA3_CONFIG,
    MISTRAL_CONFIG,
    QWEN2_CONFIG,
    QWEN3_CONFIG,
    make_llama_folder,
)
from tests.memory_support import (
    MEMINFO_FILE,
    STUDIO_WIRED,
    WORKING_SET_32GB,
    WORKING_SET_128GB,
    llama_70b_shapes,
    mac,
    mini_sysctl,
)

GEMMA_CONFIG = {"model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                "vocab_size": 300}


@pytest.fixture(scope="module")
def llama_70b():
    """Llama 3.3 70B's tensors in bfloat16 and in mlx-lm's 4 and 5 bits, shapes only (memory_support)."""
    return llama_70b_shapes()


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    """Tiny model folders written by mlx-lm: its own classes, save_model and save_config."""
    root = tmp_path_factory.mktemp("families")
    configs = {"llama": LLAMA3_CONFIG, "mistral": MISTRAL_CONFIG, "qwen2": QWEN2_CONFIG, "qwen3": QWEN3_CONFIG,
               "gemma": GEMMA_CONFIG,
               # 8 attention heads, 2 KV heads: mlx-lm's shard() over 4 ranks goes through, each rank 0 KV heads.
               "llama_8h_2kv": {**LLAMA3_CONFIG, "num_attention_heads": 8},
               "qwen2_5_layers": {**QWEN2_CONFIG, "num_hidden_layers": 5}}
    folders = {name: make_llama_folder(root / name, config) for name, config in configs.items()}
    folders["llama_4bit"] = make_llama_folder(root / "llama_4bit", LLAMA3_CONFIG, quantize=True)
    return folders


@pytest.fixture(scope="module")
def minis(macos_fixtures):
    """Three M2 Pro Mac minis of 32 GB at the default limit (the captured sysctl), mlx's working set unknown."""
    return {n: mac(n, mini_sysctl(macos_fixtures)) for n in ("m1", "m2", "m3")}


# ---- the family and the heads, on real folders ------------------------------------------------------

def test_two_ranks_fit_and_each_rank_holds_what_mlx_lm_s_own_shard_leaves_it(families, minis):
    verdict = check_split(families["llama"], ["m1", "m2"], minis)
    assert verdict.ok and verdict.mode == TENSOR and verdict.family.tensor
    assert [h.status for h in verdict.hosts] == [FITS, FITS]
    # The bytes per rank are what mlx-lm's shard() leaves a rank of the same folder.
    import mlx_lm.utils as mu
    from mlx.utils import tree_flatten

    for n in (2, 4):
        model, _ = mu.load_model(families["llama"], lazy=True, strict=False)
        model.shard(StandInGroup(n))
        held = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        assert rank_bytes(read_model_folder(families["llama"]), n, TENSOR) == [held] * n


def test_three_hosts_are_refused_naming_the_heads_and_the_counts_that_work(families, minis):
    verdict = check_split(families["llama"], ["m1", "m2", "m3"], minis)
    assert not verdict.ok
    assert verdict.refusals[0] == ("3 ranks do not divide the 4 attention heads and 2 KV heads "
                                   "(tensor parallelism gives every rank heads/N of each)")
    assert "1 or 2 rank(s): the counts that divide 4 and 2" in verdict.ways_out
    assert "--pipeline is no way out: llama has no pipeline() in mlx-lm 0.32.2" in verdict.notes
    error = refusal(verdict)
    assert error.exit_code == 2 and "2 KV heads" in error.message and error.hint.startswith("ways out: 1 or 2")


def test_kv_heads_are_checked_where_mlx_lm_s_own_shard_goes_through(families, minis):
    # 8 heads, 2 KV heads over 4 ranks: k_proj's 32 outputs split 4 ways without error, and every
    # rank would be left 2 // 4 = 0 KV heads: only the heads check refuses it.
    verdict = check_split(families["llama_8h_2kv"], ["m1", "m2", "m3", "m1"], minis)
    assert verdict.family.split_error is None
    assert verdict.refusals == ("4 ranks do not divide the 8 attention heads and 2 KV heads "
                                "(tensor parallelism gives every rank heads/N of each)",)
    assert verdict.hosts[0].ranks == (0, 3)  # two ranks on m1: its weights are both ranks'


def test_a_split_mlx_lm_itself_refuses_is_refused_with_its_words(families, minis):
    # 4-bit in groups of 32: heads divide, but the sharded matrices no longer hold whole groups.
    verdict = check_split(families["llama_4bit"], ["m1", "m2"], minis)
    [why] = verdict.refusals
    assert why.startswith("mlx-lm's own shard() of llama over 2 ranks fails: ValueError: [quantize] The last "
                          "dimension of the matrix needs to be divisible by the quantization group size 32")


def test_mistral_is_judged_as_the_llama_class_mlx_lm_loads_it_with(families, minis):
    verdict = check_split(families["mistral"], ["m1", "m2"], minis)
    assert verdict.ok and verdict.family.module == "mlx_lm.models.llama"
    three = check_split(families["mistral"], ["m1", "m2", "m3"], minis)
    assert three.refusals[0].startswith("3 ranks do not divide the 4 attention heads and 2 KV heads")


def test_pipeline_where_the_family_has_it_and_refused_where_it_has_not(families, minis):
    qwen2 = check_split(families["qwen2"], ["m1", "m2", "m3", "m1"], minis)
    assert any(w.startswith("--pipeline (qwen2 has pipeline() in mlx-lm") for w in qwen2.ways_out)
    assert check_split(families["qwen2"], ["m1", "m2"], minis, pipeline=True).ok
    three = check_split(families["qwen2"], ["m1", "m2", "m3"], minis, pipeline=True)
    assert three.refusals[0] == "3 ranks for 2 layers: --pipeline gives every rank at least one"
    assert "split [1, 1, 0] must be positive" in three.refusals[1]  # mlx-lm's own pipeline() agrees
    qwen3 = check_split(families["qwen3"], ["m1", "m2"], minis, pipeline=True)
    assert qwen3.refusals == ("qwen3 has no pipeline() in mlx-lm 0.32.2: --pipeline cannot split it",)
    assert qwen3.ways_out == ("without --pipeline: tensor parallelism (it has shard())",)


def test_a_family_split_neither_way_is_refused_for_more_than_one_rank(families, minis):
    verdict = check_split(families["gemma"], ["m1", "m2"], minis)
    assert verdict.refusals == ("gemma has no shard() in mlx-lm 0.32.2: tensor parallelism cannot split it",)
    assert verdict.ways_out[0].startswith("one rank on one host")
    assert check_split(families["gemma"], ["m1"], minis).ok


def test_pipeline_needs_the_index_sharded_load_reads(families, minis, tmp_path):
    folder = tmp_path / "qwen2"
    shutil.copytree(families["qwen2"], folder)
    (folder / "model.safetensors.index.json").unlink()
    verdict = check_split(folder, ["m1", "m2"], minis, pipeline=True)
    assert verdict.refusals[0].startswith("--pipeline needs model.safetensors.index.json in the folder")


def test_without_mlx_lm_here_the_family_is_a_note_not_a_refusal(families, minis):
    model = read_model_folder(families["llama"])
    unknown = FamilySupport("llama", unknown="mlx-lm does not import here (ModuleNotFoundError: No module "
                                             "named 'mlx_lm')")
    verdict = judge_split(model, unknown, ["m1", "m2"], minis)
    assert verdict.ok and verdict.notes[0].startswith("whether llama has shard() and pipeline() was not judged")


def test_hosts_on_another_mlx_lm_are_named(families, minis):
    other = {**minis, "m2": dataclasses.replace(minis["m2"], mlx_lm_version="0.31.3")}
    verdict = check_split(families["llama"], ["m1", "m2"], other)
    assert "judged with mlx-lm 0.32.2 (here); the hosts run theirs: m2 0.31.3" in verdict.notes


@pytest.mark.parametrize("make, why", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "has no config.json"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "llama"}')), "has no model*.safetensors"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "llama"}'),
                (p / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")),
     "is not a safetensors file"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("[1]")), "names no model_type"),
])
def test_a_folder_that_is_no_model_is_an_input_error(tmp_path, make, why):
    folder = tmp_path / "m"
    make(folder)
    with pytest.raises(InputError) as err:
        read_model_folder(folder)
    assert why in err.value.message and "config.json and model*.safetensors" in err.value.hint


# ---- memory: Llama 3.3 70B over real hosts' facts --------------------------------------------------

def test_70b_in_bfloat16_fits_two_128gb_macs_at_the_default_limit(llama_70b):
    hosts = {n: mac(n, "hw.memsize: 137438953472\niogpu.wired_limit_mb: 0\n", WORKING_SET_128GB)
             for n in ("studio1", "studio2")}
    verdict = judge_split(llama_70b["bf16"], FamilySupport("llama", "0.32.2", tensor=True, pipeline=False),
                          ["studio1", "studio2"], hosts)
    assert verdict.ok and [h.status for h in verdict.hosts] == [FITS, FITS]
    per_rank = verdict.rank_bytes[0]
    assert 67 * GIB < per_rank < 68 * GIB  # 131.4 GiB of layers halved, + 3.9 GiB of embeddings and head
    assert verdict.hosts[0].line().endswith("107.5 GiB (Metal working set as mlx reports it "
                                            "(iogpu.wired_limit_mb=0)): fits")


def test_70b_in_bfloat16_over_the_32gb_minis_is_refused_with_the_numbers(llama_70b, minis):
    verdict = judge_split(llama_70b["bf16"], FamilySupport("llama", "0.32.2", tensor=True, pipeline=False),
                          ["m1", "m2"], minis)
    assert [h.status for h in verdict.hosts] == [TOO_BIG, TOO_BIG]
    assert verdict.refusals[0].startswith("m1 needs 75.2 GiB for 67.7 GiB of weights (1 rank(s), +10% margin) "
                                          "and has 32.0 GiB (macOS's default GPU limit, at least 2/3 of 32.0 GiB")
    assert not any("sysctl" in w for w in verdict.ways_out)  # no wired limit makes 75 GiB fit in 32


def test_70b_in_4_bits_fits_two_minis_at_the_default_limit(llama_70b, minis):
    verdict = judge_split(llama_70b["4bit"], FamilySupport("llama", "0.32.2", tensor=True, pipeline=False),
                          ["m1", "m2"], minis)
    assert verdict.ok and [h.status for h in verdict.hosts] == [FITS, FITS]  # 21.1 GiB under 2/3 of 32


def test_70b_in_5_bits_on_minis_wants_the_wired_limit_raised(llama_70b, minis, macos_fixtures):
    family = FamilySupport("llama", "0.32.2", tensor=True, pipeline=False)
    # The working set unknown (2/3 to all of 32 GiB): not judged, and the way out is the limit.
    unknown = judge_split(llama_70b["5bit"], family, ["m1", "m2"], minis)
    assert unknown.ok and [h.status for h in unknown.hosts] == [UNKNOWN, UNKNOWN]
    assert unknown.hosts[0].wired_limit_mb == 26624
    # With mlx's working set (21845.34 MiB, the default on 32 GB): refused, and the limit is the way out.
    known = {n: mac(n, mini_sysctl(macos_fixtures), WORKING_SET_32GB) for n in ("m1", "m2")}
    verdict = judge_split(llama_70b["5bit"], family, ["m1", "m2"], known)
    assert [h.status for h in verdict.hosts] == [TOO_BIG, TOO_BIG]
    assert "on m1: sudo sysctl iogpu.wired_limit_mb=26624 (gives the GPU 26.0 GiB of its 32.0 GiB; until the " \
           "next reboot; or mlxcluster doctor --model DIR --fix)" in verdict.ways_out
    # Four minis hold it at the default limit.
    assert "4 hosts like the smallest here (tensor: 12.3 GiB per rank)" in verdict.ways_out


def test_a_raised_limit_counts_and_the_studio_holds_the_4bit_70b(llama_70b, macos_fixtures):
    studio = mac("studio", (macos_fixtures / STUDIO_WIRED).read_text(), memory=137438953472)
    assert studio.gpu_wired_limit_mb == 118000
    verdict = judge_split(llama_70b["4bit"], FamilySupport("llama", "0.32.2", tensor=True, pipeline=False),
                          ["studio"], {"studio": studio})
    assert verdict.ok and verdict.hosts[0].budget.low == 118000 * MIB


def test_pipeline_ranks_hold_what_mlx_lm_s_own_pipeline_leaves_them(families):
    # 5 layers over 3 ranks: 2, 2, 1 (the low ranks one more), rank 0 the last layers.
    assert [list(r) for r in pipeline_layers(5, 3)] == [[3, 4], [1, 2], [0]]
    import mlx_lm.utils as mu
    from mlx.utils import tree_flatten

    held = []
    for rank in range(3):
        model, _ = mu.load_model(families["qwen2_5_layers"], lazy=True, strict=False)
        model.model.pipeline(StandInGroup(3, rank))
        held.append(sum(v.nbytes for _, v in tree_flatten(model.parameters())))
    assert rank_bytes(read_model_folder(families["qwen2_5_layers"]), 3, PIPELINE) == held


def test_linux_hosts_are_judged_on_memavailable(families, macos_fixtures):
    box = host_facts(HostCapture("box", {PROBE: json.dumps({"platform": "linux"}),
                                         MEMINFO: (macos_fixtures / MEMINFO_FILE).read_text()}))
    verdict = check_split(families["llama"], ["box", "box"], {"box": box})
    assert verdict.ok and verdict.hosts[0].budget.source == "MemAvailable"
    unprobed = check_split(families["llama"], ["box", "gone"], {"box": box})
    assert unprobed.ok and "gone: not judged whether" in unprobed.notes[-1]
