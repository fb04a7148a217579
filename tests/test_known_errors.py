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
        # PR #4209's description, not what the merged code prints (see MLX_0_32 below): no release says it.
        "[jaccl] Creating the queue pair failed with errno 16. Thunderbolt RDMA devices": [],
        # a libibverbs test program's line in issue #3162, not mlx's.
        "[  0.004s]   qp[10] FAILED errno=16 (Resource busy)": [],
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
    assert keys(["[jaccl] Changing queue pair to RTR failed with errno 95", "[ring] Couldn't connect (error: 2)"]) == []


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
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", table, re.M)}
    for e in KNOWN_ERRORS:  # each row names the mlx file that prints it and the release that changed it
        assert e.printed_by.split(" ")[0] in rows[e.key], e.key
        assert (e.changed_in or "unchanged") in rows[e.key], e.key


# Each message as mlx formats it (the file under mlx/ is the entry's printed_by, read at tag v0.32.1;
# the mlx-metal 0.32.4 wheel's libjaccl.dylib and libmlx.dylib hold the same strings), with real values
# filled in: macOS's strerror, Python's exception prefix (std::runtime_error -> RuntimeError,
# std::invalid_argument -> ValueError). After "[METAL] Command buffer execution failed: " and
# "Failed to load the default metallib. " the words are Metal's own error text, from public captures.
MLX_0_32 = {
    "jaccl-qp-errno-16": ["RuntimeError: [jaccl] Creating the queue pair failed with 'Resource busy (16)'."],
    "jaccl-qp-create": ["RuntimeError: [jaccl] Creating the queue pair failed with 'Cannot allocate memory (12)'."],
    "jaccl-no-ipv4-gid": [
        "RuntimeError: [jaccl] No IPv4-mapped GID for this device. Thunderbolt RDMA ports only publish one once "
        "the interface has an IPv4 address; assign a link-local address to it, for example: ifconfig "
        "<interface> inet 169.254.0.1 netmask 255.255.0.0 alias"],
    "jaccl-rtr-errno-96": ["ValueError: [jaccl] Changing queue pair to RTR failed with errno 96"],
    "jaccl-no-rdma-devices": ["RuntimeError: [jaccl] Could not find device rdma_en3 (0 available)"],
    "jaccl-device-not-found": ["RuntimeError: [jaccl] Could not find device rdma_en5 (2 available)",
                               "RuntimeError: [jaccl] Could not find device rdma_en5 (10 available)"],
    "jaccl-protection-domain": ["RuntimeError: [jaccl] Couldn't allocate protection domain"],
    "jaccl-side-channel": ["RuntimeError: [jaccl] Recv failed with errno=54", "[jaccl] Recv failed with errno=2",
                           "RuntimeError: [jaccl] Send failed with errno=32"],
    "connect-timeout": ["RuntimeError: [jaccl] Couldn't connect (error: 60)"],
    "ring-peer-lost": ["[ring] Socket 7 was closed by the peer", "RuntimeError: [ring] connection to a peer was lost"],
    # mlx/io/load.h (FileWriter::write); the second as reference_train printed it before it said
    # the host and folder itself (issue 39: a lab host's disk filled mid-run)
    "write-failed": ["RuntimeError: [write] Unable to write 8 bytes to file.",
                     "error: [write] Unable to write 402653184 bytes to file."],
    "metal-gpu-timeout": ["RuntimeError: [METAL] Command buffer execution failed: Caused GPU Timeout Error "
                          "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)."],
    "metal-internal-error": ["RuntimeError: [METAL] Command buffer execution failed: Internal Error "
                             "(0000000e:Internal Error)."],
    "metal-impacting-interactivity": [
        "RuntimeError: [METAL] Command buffer execution failed: Impacting Interactivity "
        "(0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)."],
    "metal-out-of-memory": ["RuntimeError: [METAL] Command buffer execution failed: Insufficient Memory "
                            "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)."],
    "metallib-newer-macos": [
        "RuntimeError: Failed to load the default metallib. This library is using language version 4.0 which is "
        "not supported on this OS. library not found library not found library not found ",
        "RuntimeError: Failed to load the default metallib. This library is using a deployment target "
        "(0x00020008) that is not supported on this OS. library not found library not found "],
}

# What older releases print for the same causes.
OLDER = {
    # mlx 0.30.1-0.32.0 (no reason given; 0.32.1's PR #4209 adds it)
    "RuntimeError: [jaccl] Couldn't create queue pair": "jaccl-qp-create",
    # mlx 0.30.1-0.32.0 (0.32.1's PR #4191: "No IPv4-mapped GID for this device")
    "ValueError: [jaccl] Changing queue pair to RTR failed with errno 22": "jaccl-rtr-errno-22",
    # mlx 0.31.x and older: thrown in Metal's completion handler, so the process aborts, and no final "."
    # (0.32.0, PR #3523, raises it as a RuntimeError instead)
    "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
    "execution failed: Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)":
        "metal-gpu-timeout",
    "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
    "execution failed: Internal Error (0000000e:Internal Error)": "metal-internal-error",
    "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
    "execution failed: Impacting Interactivity (0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)":
        "metal-impacting-interactivity",
    "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
    "execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)":
        "metal-out-of-memory",
}


def test_each_entry_on_the_text_mlx_0_32_prints():
    for key, lines in MLX_0_32.items():
        for line in lines:
            assert keys([line]) == [key], line


def test_older_wordings_still_match():
    for line, key in OLDER.items():
        assert keys([line]) == [key], line


def test_near_misses_are_not_taken_for_known_errors():
    assert keys([
        "[jaccl] Recv failed with error code 5",  # ibv_post_recv's status, not the side channel's socket
        "[jaccl] Changing queue pair to RTR failed with errno 960",
        "[jaccl] Changing queue pair to RTS failed with errno 96",
        # Metal's follow-up once a buffer failed: the first failure names the cause.
        "[METAL] Command buffer execution failed: Ignored (for causing prior/excessive GPU errors) "
        "(00000004:kIOGPUCommandBufferCallbackErrorSubmissionsIgnored).",
        # a missing metallib (broken install), not one built for a newer macOS
        "Failed to load the default metallib. library not found library not found library not found ",
        "[ring] Too many send/recv errors. Failing pending tasks...",
        # a file mlx could not open, not a write that found no room
        "RuntimeError: [write] File /runs/a.safetensors is not open.",
        # reference_train's own message for a full disk says it all: not said twice
        "error: labhost2: no room to write checkpoint step_000002 in /runs/x/checkpoints: 0 bytes "
        "free there (mlx: unable to write 8 bytes to file) (hint: free room on labhost2 ...)",
    ]) == []


def test_a_mac_without_rdma_devices_is_told_apart_from_a_wrong_device_name():
    [none] = diagnose(["[jaccl] Could not find device rdma_en3 (0 available)"])
    assert "Thunderbolt 4" in none.text() and "--backend ring" in none.text()
    [wrong] = diagnose(["[jaccl] Could not find device rdma_en3 (1 available)"])
    assert wrong.error.key == "jaccl-device-not-found" and "regenerate the hostfile" in wrong.text()
    [busy] = diagnose(MLX_0_32["jaccl-qp-errno-16"])
    assert "kill the leftover ranks" in busy.text("0.32.4")


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
