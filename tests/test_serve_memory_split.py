"""serve --pipeline's split by memory (mlxcluster/fit/split.py ``place_by_memory``,
``memory_split``), its refusal naming what would fit, tensor parallelism's
refusal pointing to --pipeline, and which weight files each stage needs
(fit/stage_files.py). Llama 3.3 70B's shapes as mlx-lm's own class builds them
(tests/test_serve_split.py ``llama_70b``), hosts from real captured sysctl
outputs with mlx's working set (tests/memory_support.py); the files-per-stage
on a 4-shard folder written by mlx-lm's own save_model. The run over hosts:
tests/lab/test_serve_split_lab.py."""

from __future__ import annotations

import json

import pytest

from mlxcluster.fit.family import PIPELINE, TENSOR, FamilySupport
from mlxcluster.fit.split import (
    GIB,
    fits_room,
    judge_split,
    layer_bytes,
    memory_split,
    rank_bytes,
    spans_of,
)
from mlxcluster.fit.stage_files import files_left_out, left_out_per_rank
from mlxcluster.serve.pipeline_rank import parse_split
from tests.memory_support import (
    WORKING_SET_32GB,
    WORKING_SET_128GB,
    llama_70b_shapes,
    mac,
    mini_sysctl,
)

BOTH = FamilySupport("llama", "0.32.2", tensor=True, pipeline=True)


@pytest.fixture(scope="module")
def llama_70b():
    """Llama 3.3 70B's tensors in bfloat16 and in mlx-lm's 4 and 5 bits, shapes only (memory_support)."""
    return llama_70b_shapes()


@pytest.fixture(scope="module")
def mixed(macos_fixtures):
    """A 32 GB M2 Pro mini (mlx's working set at the default limit: 21.3 GiB) and a 128 GB studio."""
    return {"mini": mac("mini", mini_sysctl(macos_fixtures), WORKING_SET_32GB),
            "studio": mac("studio", "hw.memsize: 137438953472\niogpu.wired_limit_mb: 0\n", WORKING_SET_128GB)}


def test_layers_go_in_proportion_to_the_room_and_every_rank_fits():
    per_layer = [100] * 30
    # Room for layers (90% of the room, less the 50 bytes every rank holds) 1:2: 10 and 20 layers,
    # rank 0 (the last layers) on the larger host.
    split = memory_split(50, per_layer, [int((2 * 1000 + 50) / 0.9) + 1, int((1000 + 50) / 0.9) + 1])
    assert split == (20, 10)
    assert [list(s) for s in spans_of(split)] == [list(range(10, 30)), list(range(0, 10))]


def test_when_proportion_overshoots_the_greedy_split_still_fits_and_none_when_nothing_does():
    per_layer = [10, 10, 10, 70]  # the last layer heavy
    rooms = [int(80 / 0.9) + 1, int(30 / 0.9) + 1]  # rank 0 holds the last layers: it must take the heavy one
    split = memory_split(0, per_layer, rooms)
    assert split is not None
    assert all(fits_room(sum(per_layer[i] for i in span), room)
               for span, room in zip(spans_of(split), rooms, strict=True))
    assert memory_split(0, per_layer, [int(60 / 0.9), int(30 / 0.9)]) is None
    assert memory_split(0, [1, 1], [100, 100, 100]) is None  # more ranks than layers


def test_a_model_that_fits_only_weighted_is_served_so_and_said(llama_70b, mixed):
    model = llama_70b["5bit"]
    verdict = judge_split(model, BOTH, ["mini", "studio"], mixed, PIPELINE)
    assert verdict.ok and not verdict.even_fits and verdict.split is not None
    even = judge_split(model, BOTH, ["mini", "studio"], {**mixed, "studio": mixed["mini"]}, PIPELINE)
    assert not even.ok  # the even split over two minis: refused (each rank ~24 GiB)
    mini_layers, studio_layers = verdict.split
    assert mini_layers + studio_layers == 80 and mini_layers < 40 < studio_layers
    assert [h.status for h in verdict.hosts] == ["fits", "fits"]
    assert verdict.rank_bytes == tuple(rank_bytes(model, 2, PIPELINE, verdict.split))
    line = verdict.split_line()
    assert line.startswith(f"layers placed by each host's memory: rank 0 on mini: layers {80 - mini_layers}-79 "
                           f"({mini_layers}, ")
    assert f"rank 1 on studio: layers 0-{studio_layers - 1} ({studio_layers}, " in line
    assert line.endswith("mlx-lm's even split (40, 40 layers) does not fit")


def test_16_and_32_gb_take_the_layers_about_1_to_2_by_bytes(llama_70b, macos_fixtures):
    hosts = {"m16": mac("m16", "hw.memsize: 17179869184\niogpu.wired_limit_mb: 0\n", 16 * GIB * 2 // 3),
             "m32": mac("m32", mini_sysctl(macos_fixtures), WORKING_SET_32GB)}
    model = llama_70b["4bit"]
    whole_model = judge_split(model, BOTH, ["m16", "m32"], hosts, PIPELINE)
    # 37 GiB does not fit 16 + 32 GB Macs: the refusal names what would.
    assert not whole_model.ok
    whole, per_layer = layer_bytes(model)
    rooms = [16 * GIB * 2 // 3, int(WORKING_SET_32GB)]
    small = [b // 4 for b in per_layer]  # a quarter of the model fits: placed 1:2 by bytes
    split = memory_split(whole // 4, small, rooms)
    mine = [sum(small[i] for i in span) for span in spans_of(split)]
    assert 1.8 < mine[1] / mine[0] < 2.2


def test_hosts_alike_keep_mlx_lm_s_even_split(llama_70b, macos_fixtures):
    minis = {n: mac(n, mini_sysctl(macos_fixtures), WORKING_SET_32GB) for n in ("a", "b")}
    verdict = judge_split(llama_70b["4bit"], BOTH, ["a", "b"], minis, PIPELINE)
    assert verdict.ok and verdict.split is None and verdict.split_line() is None


def test_none_fits_the_refusal_names_the_fewest_hosts_and_the_quantization(llama_70b, mixed):
    verdict = judge_split(llama_70b["bf16"], BOTH, ["mini", "studio"], mixed, PIPELINE)
    assert not verdict.ok and verdict.split is None
    assert verdict.refusals[0].startswith("mini needs ")
    assert verdict.ways_out[:2] == (
        "2 hosts: studio and 1 more like studio (107.5 GiB), the layers placed by memory",
        "the model quantized to 8 bits (about 69.8 GiB; mlx_lm.convert -q --q-bits 8), the layers "
        "placed by memory over these hosts")
    # Two minis: 4 bits is what fits.
    minis = {"mini": mixed["mini"], "mini2": mixed["mini"]}
    four = judge_split(llama_70b["bf16"], BOTH, ["mini", "mini2"], minis, PIPELINE)
    assert any(w.startswith("the model quantized to 4 bits") for w in four.ways_out), four.ways_out
    # A host too small for any layer is left out of the smallest set that fits.
    tiny = mac("tiny", "hw.memsize: 8589934592\niogpu.wired_limit_mb: 0\n", 3 * GIB)
    smallest = judge_split(llama_70b["4bit"], BOTH, ["tiny", "mini"], {"tiny": tiny, "mini": mixed["mini"]},
                           PIPELINE)
    assert not smallest.ok
    assert smallest.ways_out[0] == "2 hosts: mini and 1 more like mini (21.3 GiB), the layers placed by memory"


def test_tensor_parallelism_keeps_equal_shares_and_its_refusal_points_to_pipeline(llama_70b, mixed):
    verdict = judge_split(llama_70b["5bit"], BOTH, ["mini", "studio"], mixed, TENSOR)
    assert not verdict.ok and verdict.split is None
    assert verdict.rank_bytes[0] == verdict.rank_bytes[1]  # equal shares
    assert verdict.ways_out[0].startswith("--pipeline: whole layers placed by each host's memory fit these "
                                          "hosts (")
    assert "uneven shards are not in MLX" in verdict.ways_out[0]
    # No --pipeline way out for a family without pipeline().
    tensor_only = judge_split(llama_70b["5bit"], FamilySupport("llama", "0.32.2", tensor=True, pipeline=False),
                              ["mini", "studio"], mixed, TENSOR)
    assert not any(w.startswith("--pipeline:") for w in tensor_only.ways_out)


def test_each_stage_needs_the_files_of_its_layers_and_of_no_layer(tmp_path):
    index = {"model.embed_tokens.weight": "a.safetensors", "model.layers.0.mlp.w": "a.safetensors",
             "model.layers.1.mlp.w": "b.safetensors", "model.layers.2.mlp.w": "c.safetensors",
             "model.layers.3.mlp.w": "d.safetensors", "model.norm.weight": "d.safetensors",
             "lm_head.weight": "e.safetensors"}
    # rank 0 the last layers (3), rank 1 the first three
    assert left_out_per_rank(index, (1, 3)) == [frozenset({"b.safetensors", "c.safetensors"}), frozenset()]
    assert left_out_per_rank(index, (2, 2)) == [frozenset({"b.safetensors"}), frozenset({"c.safetensors"})]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    assert files_left_out(tmp_path, (2, 2)) == left_out_per_rank(index, (2, 2))
    (tmp_path / "model.safetensors.index.json").unlink()
    assert files_left_out(tmp_path, (2, 2)) == [frozenset(), frozenset()]  # no index: every file


@pytest.mark.parametrize("text", ["", "a,b", "3,0", "2,-1"])
def test_the_rank_launcher_refuses_a_bad_split(text):
    with pytest.raises(ValueError):
        parse_split(text)
    assert parse_split("10,20") == [10, 20]



def test_doctor_model_pipeline_says_the_split_by_memory(tmp_path):
    import mlxcluster.doctor.checks.model_split  # noqa: F401  (registers the check)
    from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status, run_checks
    from tests.hf_support import QWEN2_CONFIG, make_llama_folder
    from tests.memory_support import mac_capture

    model = make_llama_folder(tmp_path / "qwen", {**QWEN2_CONFIG, "num_hidden_layers": 6, "max_window_layers": 6})
    sysctl = "hw.memsize: 17179869184\niogpu.wired_limit_mb: 0\n"
    captures = {"small": mac_capture("small", sysctl, 4 * GIB), "big": mac_capture("big", sysctl, 8 * GIB)}
    [result] = run_checks(CheckContext(captures, options={"model": str(model), "pipeline": True}),
                          [REGISTRY["model-split"]])
    assert result.status is Status.PASS, result
    assert result.hosts["split"].startswith("layers placed by each host's memory: rank 0 on small: "
                                               "layers 4-5 (2, ")
    assert "rank 1 on big: layers 0-3 (4, " in result.hosts["split"]
