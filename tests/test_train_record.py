"""The run's record kept where mlxcluster runs: record lines stored, not shown."""

from __future__ import annotations

import json

import pytest

from mlxcluster.launch.record import RunRecord


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_record_lines_are_stored_and_the_rest_logged(tmp_path):
    out = tmp_path / "run"
    rec = RunRecord(out)
    rec.start_launch("launching 2 rank(s) on ring")
    assert rec.feed('@@mlxcluster-record {"event": "start", "step": 0, "ranks": 2}') is None
    assert rec.feed('[1] @@mlxcluster-record {"step": 1, "loss": 4.5}') is None
    assert rec.feed("step      1/4 | loss 4.5000") == "step      1/4 | loss 4.5000"
    assert rec.feed("@@mlxcluster-record {cut short") is None and rec.bad_lines == 1
    rec.close()
    got = records(out)
    assert got[0]["event"] == "start" and "time" in got[0]
    assert got[1] == {"step": 1, "loss": 4.5}
    log = (out / "train.log").read_text()
    assert log.startswith("== ") and "step      1/4 | loss 4.5000\n" in log
    assert '"step": 1' not in log


def test_a_resume_drops_later_steps_and_a_fresh_start_drops_all(tmp_path):
    out = tmp_path / "run"
    rec = RunRecord(out)
    for step in (1, 2, 3, 4):
        rec.feed(f'@@mlxcluster-record {{"step": {step}, "loss": {5 - step}}}')
    rec.feed('@@mlxcluster-record {"event": "start", "step": 2, "ranks": 3}')
    rec.feed('@@mlxcluster-record {"step": 3, "loss": 1.5}')
    assert [(r.get("step"), r.get("loss")) for r in records(out)] == [
        (1, 4), (2, 3), (2, None), (3, 1.5)]
    rec.feed('@@mlxcluster-record {"event": "start", "step": 0, "ranks": 3}')
    assert [r.get("event") for r in records(out)] == ["start"]
    rec.close()


def test_a_restart_resumes_before_the_first_step_the_record_lacks(tmp_path):
    """Rank 0's host lost: its last records died with its link. The bound
    keeps every logged step (and every evaluation) the record lacks ahead of
    the resume, so that they are redone and logged again."""
    rec = RunRecord(tmp_path / "run")
    assert rec.resume_bound(log_every=10, eval_every=50) == 10  # nothing recorded: before the first log
    for step in (10, 20, 30):
        rec.feed(f'@@mlxcluster-record {{"step": {step}, "loss": 3.0}}')
    assert rec.resume_bound(log_every=10, eval_every=0) == 40  # a checkpoint at 39 logged nothing new
    assert rec.resume_bound(log_every=10, eval_every=25) == 25  # the val loss at 25 never came
    rec.feed('@@mlxcluster-record {"step": 25, "val_loss": 3.1}')
    assert rec.resume_bound(log_every=10, eval_every=25) == 40
    rec.feed('@@mlxcluster-record {"event": "start", "step": 20, "ranks": 2}')  # a resume at 20
    assert rec.resume_bound(log_every=1, eval_every=0) == 21
    rec.close()


def test_the_launcher_and_the_trainer_speak_one_protocol():
    """The marks and switches the trainer prints and reads are the very
    objects the launcher matches (one copy: reference_train/metrics.py), and
    the metrics file is cut at a resume by the trainer's own function."""
    import mlxcluster.jobs.job as job
    import mlxcluster.jobs.stall as stall
    import mlxcluster.launch.record as record
    import reference_train.metrics as metrics

    assert record.RECORD_MARK is metrics.RECORD_MARK and record.RECORD_ENV is metrics.RECORD_ENV
    assert stall.HEARTBEAT_MARK is metrics.HEARTBEAT_MARK
    assert job.HEARTBEAT_ENV is metrics.HEARTBEAT_ENV
    assert record.truncate_metrics is metrics.truncate_metrics
    # A line the trainer emits is one the record takes.
    assert record.RECORD_RE.search(f"{metrics.RECORD_MARK} {{\"step\": 1}}").group(1) == '{"step": 1}'
    assert stall.HEARTBEAT_RE.search(f"{metrics.HEARTBEAT_MARK} 0 5")


def test_files_the_trainer_sends_land_here_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    """LoRA's adapters, sent as record lines (reference_train.metrics.emit_folder)
    by rank 0 on its own Mac, are written under --out here: byte for byte,
    however many pieces; a wrong sum, a piece missing or a path leaving --out
    writes nothing."""
    import os

    import reference_train.metrics as metrics

    monkeypatch.setattr(metrics, "FILE_PIECE_BYTES", 1000)
    sent = tmp_path / "rank0-host" / "adapters"
    sent.mkdir(parents=True)
    (sent / "adapters.safetensors").write_bytes(os.urandom(4500))  # 5 pieces
    (sent / "adapter_config.json").write_text('{"fine_tune_type": "lora"}\n')
    metrics.emit_folder(sent, "adapters")
    lines = [f"[0] {line}" for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 6

    rec = RunRecord(tmp_path / "here")
    assert all(rec.feed(line) is None for line in lines)
    for name in ("adapters.safetensors", "adapter_config.json"):
        assert (tmp_path / "here" / "adapters" / name).read_bytes() == (sent / name).read_bytes()
    assert rec.bad_lines == 0 and not (tmp_path / "here" / "metrics.jsonl").exists()

    other = RunRecord(tmp_path / "other")  # lines[0]: the config; 1-5: the weights' pieces
    other.feed(lines[0].replace('"sha256": "', '"sha256": "0'))  # a wrong sum
    other.feed(lines[0].replace('"path": "adapters/', '"path": "../../'))  # leaves --out
    other.feed(lines[2])  # a piece without the ones before it
    for line in lines[1:5]:  # the last piece never comes
        other.feed(line)
    assert other.bad_lines == 3 and other.files == []
    assert not (tmp_path / "other" / "adapters").exists()
    assert not (tmp_path / "adapter_config.json").exists()
    # ... and the user is told, once the job has ended (not silently lost)
    assert rec.damage() is None
    said = other.damage()
    assert "3 record line(s) arrived damaged" in said and \
        "adapters/adapters.safetensors did not arrive here whole" in said, said


def test_a_folder_is_read_from_a_host_whole_and_only_its_files(tmp_path):
    """launch/fetch.py, run through the same argv as a host (bash here for a local one):
    the folder's regular files come byte for byte; a subfolder, a hidden file (macOS's
    AppleDouble "._NAME") and a symlink do not; a missing folder is an OSError naming the
    host, nothing written."""
    import sys

    from mlxcluster.jobs.hosts import RankHost
    from mlxcluster.launch.fetch import fetch_folder

    host = RankHost(name="mac1", ssh="127.0.0.1", ips=("127.0.0.1",), python=sys.executable)
    folder = tmp_path / "out" / "adapters"
    (folder / "sub").mkdir(parents=True)
    (folder / "adapters.safetensors").write_bytes(bytes(range(256)) * 300)
    (folder / "adapter_config.json").write_text('{"fine_tune_type": "lora"}\n')
    (folder / "._adapters.safetensors").write_bytes(b"attrs")
    (folder / "sub" / "x").write_text("no")
    (folder / "link").symlink_to(folder / "adapter_config.json")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    got = fetch_folder(host, folder)
    assert sorted(p.name for p in got) == ["adapter_config.json", "adapters.safetensors"]
    assert all(p.read_bytes() == before[p.name] for p in got)
    assert not [p for p in folder.iterdir() if p.name.startswith(".adapter")]  # no temp left
    with pytest.raises(OSError, match="mac1: "):
        fetch_folder(host, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_replayed_records_are_kept_only_where_the_record_lacks_them(tmp_path, monkeypatch):
    """A resume sends again the records logged since the checkpoint before
    (reference_train/callbacks.RecentRecords): mlxcluster's record keeps the
    ones whose lines were lost, and so does the trainer's own metrics.jsonl."""
    from reference_train.metrics import RECORD_ENV, replay_records

    out = tmp_path / "run"
    rec = RunRecord(out)
    for step in (1, 2):
        rec.feed(f'@@mlxcluster-record {{"step": {step}, "loss": {5 - step}}}')
    rec.feed('@@mlxcluster-record {"step": 2, "val_loss": 3.5}')
    rec.feed('@@mlxcluster-record {"event": "start", "step": 4, "ranks": 2}')
    for line in ('{"step": 2, "loss": 9, "replayed": true}', '{"step": 3, "loss": 2, "replayed": true}',
                 '{"step": 4, "val_loss": 1.5, "replayed": true}', '{"step": 4, "loss": 1, "replayed": true}',
                 '{"step": 5, "loss": 0.5}'):
        rec.feed(f"@@mlxcluster-record {line}")
    rec.close()
    kept = [(r["step"], r.get("loss"), r.get("val_loss")) for r in records(out) if "event" not in r]
    assert kept == [(1, 4, None), (2, 3, None), (2, None, 3.5), (3, 2, None), (4, None, 1.5),
                    (4, 1, None), (5, 0.5, None)]

    monkeypatch.delenv(RECORD_ENV, raising=False)  # the trainer alone writes its own file
    own = tmp_path / "own" / "metrics.jsonl"
    own.parent.mkdir()
    own.write_text('{"step": 1, "loss": 4}\n')
    replay_records(own, [{"step": 1, "loss": 9}, {"step": 2, "loss": 3}])
    assert [json.loads(line) for line in own.read_text().splitlines()] == [
        {"step": 1, "loss": 4}, {"step": 2, "loss": 3, "replayed": True}]
