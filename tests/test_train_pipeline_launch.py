"""`mlxcluster train -- --pipeline N` places the stages (launch/pipeline_launch.py,
fit/stages.py): the flags through the hand-off; the world, the split and the
micro-batches checked before anything starts (exit 2, nothing probed, sent or
launched); each stage judged against its host's memory facts, as `serve` judges
its ranks. The hosts' facts are real captured macOS sysctl and Linux /proc/meminfo
outputs (tests/fixtures/macos/SOURCES.md); the models are tiny folders written by
mlx-lm, and Llama 3.1 8B's public shape built lazily by mlx-lm's own class (no
weights) for the memory judgement. The lab test (tests/lab/test_pipeline_lab.py)
runs the same check against real hosts' facts."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.facts.capture import MEMINFO, PROBE, HostCapture
from mlxcluster.facts.facts import host_facts
from mlxcluster.fit.split import FITS, TOO_BIG, UNKNOWN
from mlxcluster.fit.stages import fitting_split, judge_stages, more_stages
from mlxcluster.jobs.events import Note
from mlxcluster.jobs.job import Job, job_local
from mlxcluster.jobs.restarts import Dropped
from mlxcluster.launch.job_source import JobSource
from mlxcluster.launch.pipeline_launch import (
    Pipeline,
    check_pipeline,
    check_stages,
    stage_files_left_out,
)
from mlxcluster.launch.session import LaunchFlags
from mlxcluster.launch.trainer import (
    TrainerRun,
    missing_shards,
    parse_trainer_args,
    training_job,
    training_request,
    with_stage_split,
)
from reference_train.stages import ModelBytes, folder_bytes, index_map, plan_stages
from tests import memory_support as memory
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder
from tests.train_launch_support import INVENTORY, nothing_may_start  # noqa: F401 (a fixture)

# Llama 3.1 8B's public config.json (huggingface.co/meta-llama/Llama-3.1-8B), the fields
# mlx-lm's ModelArgs reads.
LLAMA_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
FOUR_BLOCKS = {**LLAMA3_CONFIG, "num_hidden_layers": 4}


@pytest.fixture(scope="module")
def llama_8b() -> ModelBytes:
    """Llama 3.1 8B as the trainer holds it (float32 master weights): the parts of
    mlx-lm's own class built from the public config, lazily (shapes only)."""
    import mlx_lm.utils as mu
    from mlx.utils import tree_flatten

    model_class, args_class = mu._get_classes(LLAMA_8B)
    model = model_class(args_class.from_dict(LLAMA_8B))

    def held(module) -> int:
        return sum(v.size * 4 for _, v in tree_flatten(module.parameters()))

    inner = model.model
    return ModelBytes(held(inner.embed_tokens), tuple(held(b) for b in inner.layers),
                      held(inner.norm) + held(model.lm_head), False)


@pytest.fixture(scope="module")
def hosts(macos_fixtures):
    """Two M2 Pro Mac minis of 32 GB (Metal's working set 21.3 GiB, measured), a 128 GB
    Mac Studio at iogpu.wired_limit_mb=118000, a Linux box's MemAvailable."""
    mini = memory.mini_sysctl(macos_fixtures)
    studio = (macos_fixtures / memory.STUDIO_WIRED).read_text()
    facts = {n: host_facts(memory.mac_capture(n, mini, memory.WORKING_SET_32GB))
             for n in ("mini1", "mini2")}
    facts["studio"] = host_facts(memory.mac_capture("studio", studio, memory.WORKING_SET_128GB))
    meminfo = (macos_fixtures / memory.MEMINFO_FILE).read_text()
    facts["box"] = host_facts(HostCapture("box", {PROBE: json.dumps({"platform": "linux"}),
                                                  MEMINFO: meminfo}))
    return facts


@pytest.fixture(scope="module")
def four_blocks(tmp_path_factory):
    """A tiny Llama folder of 4 blocks, written by mlx-lm."""
    return make_llama_folder(tmp_path_factory.mktemp("pp") / "llama4", FOUR_BLOCKS)


def args_of(*flags: str):
    return parse_trainer_args(("--config", "tiny", *flags))


def job_on(*names: str) -> Job:
    """A ring job of one rank on each of ``names`` (this machine's python)."""
    job = job_local(len(names), "ring", sys.executable)
    return replace(job, hosts=tuple(replace(h, name=n) for h, n in zip(job.hosts, names, strict=True)))


# ---- the flags through the hand-off --------------------------------------------------------


def test_the_pipeline_flags_reach_the_ranks_and_mlxcluster_reads_them_as_they_do():
    args = args_of("--pipeline", "2", "--pipeline_split", "1,1", "--micro_batches", "4",
                   "--pipeline_schedule", "gpipe")
    assert args.pipeline == Pipeline(2, (1, 1), 4, "gpipe")
    assert args.argv()[-8:] == ("--pipeline", "2", "--pipeline_split", "1,1", "--micro_batches",
                                "4", "--pipeline_schedule", "gpipe")
    assert not args_of().pipeline.on and args_of("--pipeline", "1").pipeline == Pipeline()
    # mlxcluster's own flags come last and win, as argparse takes a flag's last value
    again = args.with_flags(pipeline=3, pipeline_split="1,1,2")
    assert again.pipeline == Pipeline(3, (1, 1, 2), 4, "gpipe")
    assert again.argv()[-4:] == ("--pipeline", "3", "--pipeline_split", "1,1,2")


@pytest.mark.parametrize("flags, said", [
    (("--pipeline", "two"), "--pipeline two: not a whole number"),
    (("--pipeline", "0"), "pipeline 0: must be at least 1"),
    (("--pipeline", "2", "--pipeline_split", "1,x"), "--pipeline_split 1,x: expected whole numbers"),
    (("--pipeline", "2", "--pipeline_split", "1,1,1"), "names 3 stages, but --pipeline is 2"),
    (("--pipeline", "2", "--pipeline_schedule", "zigzag"), "pipeline_schedule zigzag: must be one"),
])
def test_a_pipeline_flag_that_is_not_one_is_exit_2_naming_it(flags, said):
    with pytest.raises(InputError) as err:
        args_of(*flags)
    assert said in err.value.message and err.value.exit_code == 2


# ---- before anything starts: the world, the split, the micro-batches ------------------------


def test_the_world_must_equal_the_stages_on_ring_naming_the_backend_and_what_works(four_blocks):
    cfg = args_of("--init_from", str(four_blocks)).config
    with pytest.raises(InputError) as err:
        check_pipeline(cfg, Pipeline(2), 4, "ring")
    assert "4 ranks with --pipeline 2 would be 2 copies of the pipeline, but the ring backend " \
           "cannot split a group" in err.value.message
    assert err.value.hint == ("launch 2 ranks, one per stage; or run the 2 copies over MPI "
                              "(--backend mpi), whose groups split")
    for backend in ("jaccl", "jaccl-ring"):
        with pytest.raises(InputError, match=f"the {backend} backend cannot split a group"):
            check_pipeline(cfg, Pipeline(2), 4, backend)
    with pytest.raises(InputError, match=r"--pipeline 3 needs 3 ranks, one per stage \(or a "
                                         r"multiple of 3 on MPI: copies of the pipeline\); "
                                         r"this run has 2"):
        check_pipeline(cfg, Pipeline(3), 2, "ring")
    check_pipeline(cfg, Pipeline(2), 2, "ring")  # one rank per stage: goes
    check_pipeline(cfg, Pipeline(2), 4, "mpi")  # MPI: 2 copies of the pipeline go
    # each copy's rows of the global batch (8 / 2 = 4) split into its micro-batches
    with pytest.raises(InputError, match="--micro_batches 3 does not divide global_batch 4"):
        check_pipeline(cfg, Pipeline(2, None, 3), 4, "mpi")
    with pytest.raises(InputError, match=r"global_batch 9 does not split over 2 copies of the "
                                         r"pipeline \(4 ranks / --pipeline 2\)"):
        check_pipeline(args_of("--init_from", str(four_blocks), "--global_batch", "9").config,
                       Pipeline(2), 4, "mpi")


def test_the_split_is_checked_against_the_models_blocks_read_here(four_blocks):
    cfg = args_of("--init_from", str(four_blocks)).config
    with pytest.raises(InputError) as err:
        check_pipeline(cfg, Pipeline(5), 5, "ring")
    assert "the model has 4 blocks, and each stage holds at least one" in err.value.message
    assert err.value.hint == "use --pipeline 4 or fewer"
    with pytest.raises(InputError, match="--pipeline_split 1,2 adds up to 3 blocks, but the "
                                         "model has 4") as err:
        check_pipeline(cfg, Pipeline(2, (1, 2)), 2, "ring")
    assert err.value.hint == "give numbers that add up to 4"
    with pytest.raises(InputError, match="--micro_batches 3 does not divide global_batch 8"):
        check_pipeline(cfg, Pipeline(2, (1, 3), 3), 2, "ring")  # (config.py checks it too)
    check_pipeline(cfg, Pipeline(2, (1, 3)), 2, "ring")
    # a model from scratch: its --n_layers blocks (the tiny config's 2)
    with pytest.raises(InputError, match="the model has 2 blocks"):
        check_pipeline(args_of().config, Pipeline(3), 3, "ring")


def test_bad_pipelines_fail_before_anything_starts(tmp_path, four_blocks, nothing_may_start):  # noqa: F811
    """Each exit 2 with its message, from an inventory, --local or with MPI: no ssh,
    no probe, no launcher, within moments."""
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(INVENTORY + "  - name: mac3\n    ssh: 10.0.0.3\n")
    four = tmp_path / "four.yaml"
    four.write_text(INVENTORY + "".join(f"  - name: mac{i}\n    ssh: 10.0.0.{i}\n" for i in (3, 4)))
    model = ["--init_from", str(four_blocks), "--out", str(tmp_path / "run")]
    cases = [
        (["-i", str(inventory)], ["--pipeline", "5"], "--pipeline 5: the model has 4 blocks"),
        (["--local", "2"], ["--pipeline", "2", "--pipeline_split", "1,2"], "adds up to 3 blocks"),
        (["-i", str(inventory)], ["--pipeline", "2", "--pipeline_split", "1,3"],
         "--pipeline 2 needs 2 ranks, one per stage (or a multiple of 2 on MPI"),
        (["--local", "4"], ["--pipeline", "2"], "but the ring backend cannot split a group"),
        (["-i", str(four), "--backend", "mpi"], ["--pipeline", "2", "--global_batch", "9"],
         "global_batch 9 does not split over 2 copies of the pipeline"),
    ]
    for source, flags, said in cases:
        start = time.monotonic()
        result = CliRunner().invoke(cli, ["train", *source, "--config", "tiny", "--", *model, *flags])
        assert result.exit_code == 2, (source, flags, result.output)
        assert said in result.output, result.output
        assert "Traceback" not in result.output and "launching" not in result.output
        assert time.monotonic() - start < 5
    assert nothing_may_start == []


# ---- each stage against its host's memory (captured facts) ---------------------------------


def test_a_stage_that_does_not_fit_its_mac_is_named_with_its_bytes_and_a_split_that_fits(
        llama_8b, hosts):
    # LoRA on Llama 3.1 8B (32.1 GB of float32 weights) with 28 of its 32 blocks on one mini
    plans = plan_stages(llama_8b, 2, [28, 4])
    verdict = judge_stages(llama_8b, plans, ["mini1", "mini2"], hosts, "lora")
    assert not verdict.ok and [h.status for h in verdict.hosts] == [TOO_BIG, FITS]
    assert verdict.refusals == (
        "stage 1 of 2 (the embedding, blocks 0-27 of 32) on mini1 needs 27.5 GiB (24.7 GiB held "
        "while training, +10% margin); mini1 has 21.3 GiB (Metal working set as mlx reports it "
        "(iogpu.wired_limit_mb=0))",)
    split = fitting_split(llama_8b, [h.budget.low for h in verdict.hosts], "lora")
    assert f"--pipeline_split {','.join(map(str, split))}: moves blocks off the host that is " \
           "short, and every stage fits its host here" in verdict.ways_out
    # the way out is one: it fits both minis
    assert judge_stages(llama_8b, plan_stages(llama_8b, 2, split), ["mini1", "mini2"], hosts,
                        "lora").ok
    # balanced by bytes, the 8B fits two 32 GB minis
    assert judge_stages(llama_8b, plan_stages(llama_8b, 2), ["mini1", "mini2"], hosts, "lora").ok


def test_blocks_move_off_the_small_mac_onto_the_studio(llama_8b, hosts):
    plans = plan_stages(llama_8b, 2, [4, 28])
    verdict = judge_stages(llama_8b, plans, ["studio", "mini1"], hosts, "lora")
    assert [h.status for h in verdict.hosts] == [FITS, TOO_BIG]
    assert verdict.refusals[0].startswith("stage 2 of 2 (blocks 4-31 of 32, the final norm and "
                                          "head) on mini1 needs")
    # the greedy split fills the studio first; the mini keeps a block and the head
    assert fitting_split(llama_8b, [h.budget.low for h in verdict.hosts], "lora") == [31, 1]
    assert "--pipeline_split 31,1: moves blocks off the host that is short, and every stage " \
           "fits its host here" in verdict.ways_out


def test_full_fine_tuning_counts_gradients_and_adam_and_names_more_hosts_or_adapters(
        llama_8b, hosts):
    plans = plan_stages(llama_8b, 2)
    verdict = judge_stages(llama_8b, plans, ["mini1", "mini2"], hosts, "full")
    assert [h.status for h in verdict.hosts] == [TOO_BIG, TOO_BIG]
    assert verdict.held == tuple(4 * p.bytes for p in plans)
    assert "weights, gradients and AdamW state" in verdict.refusals[0]
    more = more_stages(llama_8b, hosts["mini1"].gpu_working_set_bytes, "full", 2)
    assert more and f"more hosts: --pipeline {more} over {more} hosts like the smallest here " \
                     "(21.3 GiB)" in verdict.ways_out
    assert judge_stages(llama_8b, plan_stages(llama_8b, more), [f"m{i}" for i in range(more)],
                        {f"m{i}": hosts["mini1"] for i in range(more)}, "full").ok
    assert not judge_stages(llama_8b, plan_stages(llama_8b, more - 1),
                            [f"m{i}" for i in range(more - 1)],
                            {f"m{i}": hosts["mini1"] for i in range(more - 1)}, "full").ok
    assert any(w.startswith("--fine_tune lora") for w in verdict.ways_out)
    assert "no --pipeline_split of the 32 blocks over these 2 hosts fits every one of them" \
        in verdict.notes


def test_two_stages_on_one_host_are_judged_together_and_an_unprobed_host_is_a_note(
        llama_8b, hosts):
    plans = plan_stages(llama_8b, 2)
    together = judge_stages(llama_8b, plans, ["mini1", "mini1"], hosts, "lora")
    assert not together.ok and together.hosts[0].ranks == (0, 1)
    assert "mini1 holds stages 1, 2" in together.refusals[0]
    unknown = judge_stages(llama_8b, plans, ["mini1", "gone"], hosts, "lora")
    assert unknown.ok and unknown.hosts[1].status == UNKNOWN
    assert unknown.notes[0].startswith("gone: not judged whether")


def test_the_check_hook_refuses_or_says_each_stage(four_blocks, hosts, llama_8b, tmp_path):
    """check_stages on a real folder (its headers read here) and captured facts."""
    cfg = args_of("--init_from", str(four_blocks), "--fine_tune", "lora").config
    job = job_on("localhost", "localhost")
    notes: list = []
    check_stages(job, cfg, Pipeline(2), {"localhost": hosts["box"]}, notes.append)
    said = [n.text for n in notes if isinstance(n, Note)]
    sizes = folder_bytes(four_blocks)
    assert said[0].startswith("pipeline: stage 1 of 2 on localhost: the embedding, blocks 0-1 of 4")
    assert "localhost: ranks 0,1:" in said[0] and said[0].endswith("(MemAvailable): fits")
    assert sum(p.bytes for p in plan_stages(sizes, 2)) == sizes.embedding + sum(sizes.blocks) + sizes.head
    # the same job on a host that reports no memory: not judged, a note, no refusal
    notes.clear()
    check_stages(job, cfg, Pipeline(2), {"localhost": None}, notes.append)
    assert any("not judged" in n.text for n in notes)


# ---- what each host is sent: only its stage's weight files ------------------------------------


@pytest.fixture(scope="module")
def four_sharded(tmp_path_factory):
    """The 4-block Llama saved one tensor a file, with mlx-lm's index."""
    return make_llama_folder(tmp_path_factory.mktemp("pps") / "llama4", FOUR_BLOCKS, shard=True)


def test_each_host_is_sent_only_its_stages_files_and_the_ranks_their_split(four_sharded, four_blocks):
    """--pipeline over a sharded folder: the split planned here given to the ranks
    (they hold only their stage's files), each host left without the files of the other
    stages (a host of two ranks needs both); a folder of one file: nothing left out."""
    args = args_of("--init_from", str(four_sharded), "--fine_tune", "lora", "--pipeline", "2")
    given = with_stage_split(args)
    assert given.argv()[-2:] == ("--pipeline_split", "2,2") and given.pipeline.split == (2, 2)
    assert with_stage_split(given.with_flags(pipeline_split="1,3")).pipeline.split \
        == (1, 3)  # the user's split stays
    whole = args_of("--init_from", str(four_blocks), "--pipeline", "2")
    assert with_stage_split(whole) is whole  # one model.safetensors: nothing to leave out
    assert with_stage_split(args_of("--init_from", str(four_sharded))).pipeline.split is None
    index = index_map(four_sharded)
    left = stage_files_left_out(job_on("a", "b"), given.config, given.pipeline, str(four_sharded))
    on_a = {f for n, f in index.items() if n.startswith(("model.embed_tokens.", "model.layers.0.",
                                                         "model.layers.1."))}
    assert set(index.values()) - left["a"] == on_a  # the embedding and blocks 0-1
    assert left["a"] == set(index.values()) - on_a and not left["a"] & left["b"]
    assert "model.norm.weight" in {n for n, f in index.items() if f not in left["b"]}
    both = stage_files_left_out(job_on("a", "a"), given.config, given.pipeline, str(four_sharded))
    assert both == {"a": frozenset()}
    request = training_request(given, LaunchFlags(JobSource()), detached=False, send_folders=True)
    assert request.model_files(job_on("a", "b"), str(four_sharded)) == left
    assert training_request(whole, LaunchFlags(JobSource()), detached=False,
                            send_folders=True).model_files is None


def test_a_re_split_sends_the_hosts_left_their_new_blocks_files(four_sharded, hosts, tmp_path,
                                                                  monkeypatch):
    """--elastic over hosts holding their stages' files only: after a host is lost and the
    stages re-split, the relaunch first sends each host left the files of its new stage
    (launch/sync.py sends what a host lacks); without stage files, nothing is sent."""
    import mlxcluster.launch.sync as sync

    sent: list = []
    monkeypatch.setattr(sync, "sync_model", lambda job, folder, env, on_event, left_out: sent.append(
        (tuple(h.name for h in job.hosts), folder, left_out)))
    args = with_stage_split(args_of("--init_from", str(four_sharded), "--fine_tune", "lora",
                                    "--pipeline", "3", "--out", str(tmp_path / "o")))
    assert args.pipeline.split == (1, 2, 1)  # a: block 0, b: blocks 1-2, c: block 3
    run = TrainerRun(args, 3, facts=lambda job: {h.name: hosts["box"] for h in job.hosts},
                     on_stage_files=print)
    job, _ = run.drop(job_on("a", "b", "c"), [Dropped("b", "unreachable over ssh")])
    assert not sent  # sent with the relaunch, after the drop is said
    job, _ = run.resume(job, 1)
    assert run.args.pipeline.split == (2, 2)
    (names, folder, left_out), = sent
    assert names == ("a", "c") and folder == str(four_sharded)
    index = index_map(four_sharded)
    needed_c = {f for n, f in index.items()
                if n.startswith(("model.layers.2.", "model.layers.3.", "model.norm.", "lm_head."))}
    assert left_out["c"] == set(index.values()) - needed_c  # blocks 2-3 now: block 2's files sent
    assert not {f for n, f in index.items() if n.startswith("model.layers.1.")} & left_out["a"]
    run.resume(job, 2)
    assert len(sent) == 1  # a restart on the same hosts moves no block
    quiet = TrainerRun(args, 3, facts=lambda job: {h.name: hosts["box"] for h in job.hosts})
    quiet.resume(quiet.drop(job_on("a", "b", "c"), [Dropped("b", "gone")])[0], 1)
    assert len(sent) == 1  # --no-sync-data, or whole folders: nothing of ours to send


# ---- restarts and --elastic ------------------------------------------------------------------


def test_elastic_re_splits_the_stages_over_the_hosts_left(four_blocks, hosts, tmp_path):
    """A lost host's stage goes to the hosts left: --pipeline N-1, balanced by bytes, the
    hosts' facts asked again (here: captured), the drop in the record; a restart on the same
    hosts keeps the pipeline. The trainer re-cuts the checkpoints (tests/test_resplit.py)."""
    args = args_of("--init_from", str(four_blocks), "--fine_tune", "lora", "--pipeline", "3",
                   "--pipeline_split", "2,1,1", "--out", str(tmp_path / "o"))
    asked = []
    run = TrainerRun(args, 3, facts=lambda job: asked.append(job.hosts) or
                     {h.name: hosts["box"] for h in job.hosts})
    job, notes = run.drop(job_on("a", "b", "c"), [Dropped("c", "unreachable over ssh")])
    assert [h.name for h in job.hosts] == ["a", "b"] and len(asked) == 1
    assert notes[0] == "dropped c (unreachable over ssh): going on with --pipeline 2 on a, b, " \
                       "--pipeline_split 2,2"
    assert notes[1].startswith("pipeline: stage 1 of 2 on a: the embedding, blocks 0-1 of 4")
    assert job.program[-4:] == ("--pipeline", "2", "--pipeline_split", "2,2")
    assert run.args.pipeline == Pipeline(2, (2, 2))
    records = [json.loads(line) for line in run.record.metrics.read_text().splitlines()]
    [dropped] = [r for r in records if r.get("event") == "host_dropped"]
    assert dropped.pop("time") and dropped == {"event": "host_dropped", "host": "c", "ranks": 2,
                                               "reason": "unreachable over ssh", "pipeline": 2}
    # a restart on the same hosts resumes the pipeline now run: the flags kept, resume added
    job, _ = run.resume(job, 1)
    assert job.program[-8:] == ("--pipeline", "2", "--pipeline_split", "2,2", "--resume", "auto",
                                "--resume_before", "1")


def test_a_re_split_moves_blocks_off_a_small_mac_or_stops_naming_why(llama_8b, hosts, four_blocks):
    """A 64-block model (Llama 3.1 8B's blocks twice, 64 GB of float32 weights) on a Mac
    Studio and two 32 GB minis: without mini2 its LoRA halves do not fit mini1, the split
    that fits does; full fine-tuning over the two left fits no split: the run stops, naming
    the stage, the host and the ways out. One host left, or copies of the pipeline: stopped."""
    from mlxcluster.launch.pipeline_launch import resplit

    big = ModelBytes(llama_8b.embedding, llama_8b.blocks * 2, llama_8b.head, False)
    lora = args_of("--init_from", str(four_blocks), "--fine_tune", "lora", "--pipeline", "3").config
    left = job_on("studio", "mini1")
    done = resplit(lora, Pipeline(3), 3, left, ["mini2"], hosts, big)
    # the greedy split fills the studio; the mini keeps a block and the head
    assert done.pipeline == Pipeline(2, (63, 1))
    assert judge_stages(big, plan_stages(big, 2, [63, 1]), ["studio", "mini1"], hosts, "lora").ok
    assert not judge_stages(big, plan_stages(big, 2), ["studio", "mini1"], hosts, "lora").ok
    assert done.lines[1].startswith("stage 2 of 2 on mini1: block 63 of 64, the final norm and "
                                    "head") and done.lines[1].endswith(": fits")

    full = args_of("--init_from", str(four_blocks), "--pipeline", "3").config
    with pytest.raises(MlxclusterError) as err:
        resplit(full, Pipeline(3), 3, left, ["mini2"], hosts, big)
    said = err.value.message
    assert said.startswith("--elastic cannot go on without mini2: with --pipeline 3, its blocks "
                           "do not re-split over the 2 host(s) left: the pipeline's stages do "
                           "not all fit their hosts:")
    assert "on mini1 needs" in said and "weights, gradients and AdamW state" in said
    assert "--fine_tune lora" in said and "rerun with '-- --resume auto'" in err.value.hint

    # a model from scratch (bytes unknown here): its blocks shared evenly, the user's split
    # replaced (it named three stages)
    scratch = args_of("--n_layers", "6", "--pipeline", "3", "--pipeline_split", "1,2,3").config
    assert resplit(scratch, Pipeline(3, (1, 2, 3)), 3, left, ["mini2"], hosts, None) \
        .pipeline == Pipeline(2, (3, 3))
    with pytest.raises(MlxclusterError, match="1 rank is left, and a pipeline needs 2 stages"):
        resplit(lora, Pipeline(2), 2, job_on("studio"), ["mini1"], hosts, big)
    with pytest.raises(MlxclusterError, match="its 4 ranks ran 2 copies of the pipeline"):
        resplit(lora, Pipeline(2), 4, job_on("studio", "mini1", "mini2"), ["x"], hosts, big)


def test_the_model_here_is_whole_when_the_index_finds_every_shard(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    assert missing_shards(folder) is None
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert missing_shards(folder) == ["model-00002-of-00002.safetensors"]
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert missing_shards(folder) == []


def test_a_job_of_the_right_size_goes_through_the_program_step(four_blocks):
    args = args_of("--init_from", str(four_blocks), "--pipeline", "2")
    job = training_job(job_on("a", "b"), args)
    assert "--pipeline" in job.program and job.title == "training"
