"""Known run-time errors mapped to cause and fix, on the real lines ranks printed."""

from __future__ import annotations

import re
from pathlib import Path

from mlxcluster.doctor.known_errors import KNOWN_ERRORS, diagnose

REAL = "mlx_distributed_runtime_error_lines.txt"
DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def real_lines(fixtures):
    return [line for line in (fixtures / REAL).read_text().splitlines() if not line.startswith("###")]


def keys(lines):
    return [d.error.key for d in diagnose(lines)]


def test_each_real_line_is_recognised(macos_fixtures):
    lines = real_lines(macos_fixtures)
    expected = {
        "ValueError: [jaccl] Changing queue pair to RTR failed with errno 22": ["jaccl-rtr-errno-22"],
        "[jaccl] Creating the queue pair failed with errno 16. Thunderbolt RDMA devices": ["jaccl-qp-errno-16"],
        "[  0.004s]   qp[10] FAILED errno=16 (Resource busy)": ["jaccl-qp-errno-16"],
        "- `[jaccl] Couldn't allocate protection domain`": ["jaccl-protection-domain"],
        "[ring] Couldn't connect (error: 60)": ["connect-timeout"],
        "#   RuntimeError: [jaccl] Couldn't connect (error: 60)": ["connect-timeout"],
        "[ring] Sending to socket 3 failed with errno 22": ["ring-2gib"],
        "[ring] Too many send/recv errors. Aborting...": [],
    }
    assert sorted(expected) == sorted(lines)
    for line, want in expected.items():
        assert keys([line]) == want, line


def test_the_same_message_on_linux_and_macos_errnos():
    # ring's message format (mlx ring.cpp: "Couldn't connect (error: <errno>)") with Linux numbers.
    assert keys(["[ring] Couldn't connect (error: 110)"]) == ["connect-timeout"]
    assert keys(["[ring] Couldn't connect (error: 61)", "[ring] Couldn't connect (error: 111)"]) == ["connect-refused"]
    assert keys(["[ring] Couldn't connect (error: 65)"]) == ["connect-no-route"]
    # The #4280 line's format with ECONNRESET (macOS 54, Linux 104): no real capture of these.
    assert keys(["[ring] Receiving from socket 4 failed with errno 54"]) == ["peer-reset"]
    assert keys(["[ring] Sending to socket 3 failed with errno 104"]) == ["peer-reset"]
    # Other errnos are not guessed at.
    assert keys(["[jaccl] Changing queue pair to RTR failed with errno 96", "[ring] Couldn't connect (error: 2)"]) == []


def test_a_fixed_bug_names_the_mlx_that_fixes_it(macos_fixtures):
    [d] = diagnose(["[ring] Sending to socket 3 failed with errno 22"])
    old = d.text("0.32.0")
    assert "this cluster runs mlx 0.32.0; mlx 0.32.1 fixes it" in old and "#4281" in old
    assert "fixes it" not in d.text("0.32.4") and "fixes it" not in d.text(None)
    [rtr] = diagnose(real_lines(macos_fixtures)[:1])
    assert rtr.text("0.30.0").startswith("ValueError: [jaccl] Changing queue pair to RTR failed with errno 22: "
                                         "a Thunderbolt port JACCL uses has no IPv4 address yet")


def test_first_seen_once_each():
    lines = ["[ring] Couldn't connect (error: 60)", "[jaccl] Couldn't allocate protection domain",
             "[ring] Couldn't connect (error: 60)"]
    assert keys(lines) == ["connect-timeout", "jaccl-protection-domain"]


def test_the_docs_table_lists_every_known_error():
    table = DOC.read_text()
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert documented == [e.key for e in KNOWN_ERRORS]


def test_smoke_prints_cause_and_fix_under_the_failed_rank(macos_fixtures):
    from mlxcluster.cli.smoke import render_failures
    from mlxcluster.smoke.run import SmokeReport
    from mlxcluster.smoke.watch import RankOutcome

    tail = "\n".join(real_lines(macos_fixtures)[-2:])  # the #4280 lines
    report = SmokeReport("ring", "failed", ranks=[
        RankOutcome(0, "mini1", "failed", "exited with code 1", cause=True, stderr_tail=tail),
        RankOutcome(1, "mini2", "stopped")])
    text = render_failures(report)
    assert ("  known error: [ring] Sending to socket 3 failed with errno 22: one ring send/recv of 2 GiB or "
            "more") in text
    assert text.count("known error") == 1
    assert "known error" not in render_failures(SmokeReport("ring", "failed", ranks=[
        RankOutcome(0, "mini1", "failed", "exited with code 1", cause=True, stderr_tail="Traceback ...")]))


def test_train_prints_cause_and_fix_when_a_rank_fails(monkeypatch, macos_fixtures, tmp_path):
    monkeypatch.chdir(tmp_path)  # the run's record (default --out runs/reference) goes here
    from click.testing import CliRunner

    import mlxcluster.launch.trainer as trainer
    from mlxcluster.cli import main
    from mlxcluster.jobs.watch import RunOutcome

    rtr = real_lines(macos_fixtures)[0]
    monkeypatch.setattr(trainer, "run_job", lambda job, on_line, **kwargs: RunOutcome(
        exit_code=1, failed_rank=1, seconds=0.1, lines=("step 1", rtr)))
    result = CliRunner().invoke(main, ["train", "--local", "2", "--no-preflight", "--config", "tiny"])
    assert result.exit_code == 1, result.output
    assert f"known error: {rtr}: a Thunderbolt port JACCL uses has no IPv4 address yet" in result.output
    assert "ml-explore/mlx #3467" in result.output


def test_train_names_the_mlx_release_that_fixes_it(monkeypatch, macos_fixtures, tmp_path):
    monkeypatch.chdir(tmp_path)  # the run's record (default --out runs/reference) goes here
    from click.testing import CliRunner

    import mlxcluster.launch.preflight as preflight
    import mlxcluster.launch.trainer as trainer
    from mlxcluster.cli import main
    from mlxcluster.jobs.preflight import HostProbe
    from mlxcluster.jobs.watch import RunOutcome

    too_big = real_lines(macos_fixtures)[-2]  # mlx #4280, fixed in 0.32.1
    monkeypatch.setattr(preflight, "probe_hosts", lambda job, env=None: [
        HostProbe(h, {"mlx": "0.32.0", "platform": "darwin", "import_errors": {}}) for h in job.hosts])
    monkeypatch.setattr(preflight, "check_probes", lambda job, probes: [])
    monkeypatch.setattr(preflight, "smoke_all_sum", lambda job, env=None: (True, "all_sum ok"))
    monkeypatch.setattr(trainer, "run_job", lambda job, on_line, **kwargs: RunOutcome(
        exit_code=1, failed_rank=0, seconds=0.1, lines=(too_big, "[ring] Too many send/recv errors. Aborting...")))
    result = CliRunner().invoke(main, ["train", "--local", "2", "--config", "tiny", "--no-openblas"])
    assert result.exit_code == 1, result.output
    assert "this cluster runs mlx 0.32.0; mlx 0.32.1 fixes it" in result.output
