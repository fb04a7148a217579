"""Known run-time errors mapped to cause and fix, on the real lines ranks printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mlxcluster.doctor.known_errors import KNOWN_ERRORS, diagnose
from mlxcluster.facts.mpi import find_libmpi

from .conftest import require

REAL = "mlx_distributed_runtime_error_lines.txt"
DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def real_lines(fixtures):
    return [line for line in (fixtures / REAL).read_text().splitlines() if not line.startswith("###")]


def real_line(fixtures, text):
    """The one captured line holding ``text``."""
    [line] = [line for line in real_lines(fixtures) if text in line]
    return line


def keys(lines):
    return [d.error.key for d in diagnose(lines)]


def test_each_real_line_is_recognised(macos_fixtures):
    lines = real_lines(macos_fixtures)
    expected = {
        "ValueError: [jaccl] Changing queue pair to RTR failed with errno 22": ["jaccl-rtr-errno-22"],
        # PR #4209's first revision (3c787aa) as its author ran it on two Macs; no release prints it.
        "[jaccl] Creating the queue pair failed with errno 16. Thunderbolt RDMA devices": ["jaccl-qp-errno-16"],
        # the libibverbs probe in issue #3162 that measured the 10 queue pairs, on a Mac: the same EBUSY.
        "[  0.004s]   qp[10] FAILED errno=16 (Resource busy)": ["jaccl-qp-errno-16"],
        "- `[jaccl] Couldn't allocate protection domain`": ["jaccl-protection-domain"],
        "[ring] Couldn't connect (error: 60)": ["connect-timeout"],
        "#   RuntimeError: [jaccl] Couldn't connect (error: 60)": ["connect-timeout"],
        "[ring] Sending to socket 3 failed with errno 22": ["ring-2gib"],
        "[ring] Too many send/recv errors. Aborting...": [],
        # exo #1912: mlx's line, then Metal's reason on the next (the pair is tested below)
        "RuntimeError: [metal::Device] Unable to load kernel fence_update": ["metal-kernel-load"],
        "Function fence_update is using language version 4.0 which is incompatible with this OS.":
            ["metal-newer-macos"],
        "RuntimeError: [metal::Device] Unable to load kernel v_copyint32float32": ["metal-kernel-load"],
        "RuntimeError: Failed to load the default metallib. This library is using language version 4.0 which "
        "is not supported on this OS. library not found library not found library not found": ["metal-newer-macos"],
        # mlxstudio #2: the same message broken over lines; only Metal's words say why
        "RuntimeError: Failed to load the default metallib.": [],
        "This library is using language version 4.0 which is not supported on this OS": ["metal-newer-macos"],
        "library not found": [],
        "library not found library not found": [],
        "MLX error: Failed to load the default metallib. This library is using a deployment target (0x00020008) "
        "that is not supported on this OS. library not found library not found library not found  at "
        "/Users/tom/dev/vllm-swift/swift/.build/checkouts/mlx-swift/Source/Cmlx/mlx-c/mlx/c/memory.cpp:69":
            ["metal-newer-macos"],
        "Terminating due to uncaught exception: [metal::Device] Unable to load kernel input_coherent":
            ["metal-kernel-load"],
    }
    assert sorted(expected) == sorted(lines)
    for line, want in expected.items():
        assert keys([line]) == want, line


def test_metals_reason_on_the_next_line_says_the_cause(macos_fixtures):
    kernel = real_line(macos_fixtures, "Unable to load kernel fence_update")
    reason = real_line(macos_fixtures, "Function fence_update")
    [d] = diagnose(["Traceback (most recent call last):", kernel, reason])
    assert d.error.key == "metal-newer-macos" and d.line == reason
    assert "built for a newer macOS" in d.text() and "pip" in d.text()
    # without Metal's reason the kernel line names the likely causes itself
    [alone] = diagnose([real_line(macos_fixtures, "v_copyint32float32")])
    assert "newer macOS" in alone.text() and "mlx-metal of different versions" in alone.text()


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
    [rtr] = diagnose([real_line(macos_fixtures, "to RTR failed with errno 22")])
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


# Every wording each entry matches, release by release since mlx 0.29.0: (key, releases, line, where).
# "where" is the file under mlx/ and the tag (or commit) it was read at in ml-explore/mlx, or the capture.
# Values are filled in as they print: macOS's strerror and errnos, Python's exception prefix
# (std::runtime_error -> RuntimeError, std::invalid_argument -> ValueError). Releases named "0.32.1-"
# run to HEAD 846d176 (0.32.2.dev), which prints the same; the mlx-metal 0.32.4 wheel holds the same
# strings. Metal's words (after mlx's prefix or on the next line) are Apple's, from public captures.
_RDMA_BY_RELEASE = (("0.30.1-0.30.5", "distributed/jaccl/jaccl.cpp@v0.30.1"),
                    ("0.30.6-0.31.1", "distributed/jaccl/utils.cpp@v0.30.6"),
                    ("0.31.2-", "distributed/jaccl/lib/jaccl/rdma.cpp@v0.31.2"))
_QP_FULL_4209 = ("[jaccl] Creating the queue pair failed with errno {}. Thunderbolt RDMA devices support a limited "
                 "number of queue pairs per device and fail here once they are exhausted.")
_GID = ("RuntimeError: [jaccl] No IPv4-mapped GID for this device. Thunderbolt RDMA ports only publish one once "
        "the interface has an IPv4 address; assign a link-local address to it, for example: ifconfig "
        "<interface> inet 169.254.0.1 netmask 255.255.0.0 alias")
# Metal's words for each command-buffer entry (captures: airllm #367, mlx #1231, omlx #1387, mlx PR #479)
_CB_REASONS = {
    "metal-gpu-timeout": "Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)",
    "metal-internal-error": "Internal Error (0000000e:Internal Error)",
    "metal-impacting-interactivity":
        "Impacting Interactivity (0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)",
    "metal-out-of-memory": "Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
}
_CB = "[METAL] Command buffer execution failed: "
_ABORT = "libc++abi: terminating due to uncaught exception of type std::runtime_error: "

WORDINGS = [
    # --- queue pairs ---
    *[("jaccl-qp-create", releases, "RuntimeError: [jaccl] Couldn't create queue pair", where)
      for releases, where in _RDMA_BY_RELEASE if releases != "0.31.2-"],
    ("jaccl-qp-create", "0.31.2-0.32.0", "RuntimeError: [jaccl] Couldn't create queue pair",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.0"),
    ("jaccl-qp-errno-16", "0.32.1-", "RuntimeError: [jaccl] Creating the queue pair failed with 'Resource busy (16)'.",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1 (52960f8, PR #4209)"),
    # the same line when the errno mlx reads again after std::generic_category().message() has moved
    ("jaccl-qp-errno-16", "0.32.1-", "RuntimeError: [jaccl] Creating the queue pair failed with 'Resource busy (0)'.",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1 (err for the words, errno for the number)"),
    ("jaccl-qp-create", "0.32.1-",
     "RuntimeError: [jaccl] Creating the queue pair failed with 'Cannot allocate memory (12)'.",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1"),
    ("jaccl-qp-errno-16", "no release", "RuntimeError: " + _QP_FULL_4209.format(16),
     "distributed/jaccl/lib/jaccl/rdma.cpp@3c787aa (PR #4209's first revision, refs/pull/4209)"),
    ("jaccl-qp-create", "no release", "RuntimeError: " + _QP_FULL_4209.format(12),
     "distributed/jaccl/lib/jaccl/rdma.cpp@3c787aa"),
    # --- GID, RTR, devices, protection domains ---
    ("jaccl-no-ipv4-gid", "0.32.1-", _GID, "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1 (21d897d, PR #4191)"),
    *[("jaccl-rtr-errno-22", releases, "ValueError: [jaccl] Changing queue pair to RTR failed with errno 22", where)
      for releases, where in _RDMA_BY_RELEASE],
    *[("jaccl-rtr-errno-96", releases, "ValueError: [jaccl] Changing queue pair to RTR failed with errno 96", where)
      for releases, where in _RDMA_BY_RELEASE],
    ("jaccl-no-rdma-devices", "0.32.1-", "RuntimeError: [jaccl] Could not find device rdma_en3 (0 available)",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1 (307692c, PR #4180)"),
    ("jaccl-device-not-found", "0.32.1-", "RuntimeError: [jaccl] Could not find device rdma_en5 (2 available)",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1"),
    ("jaccl-device-not-found", "0.32.1-", "RuntimeError: [jaccl] Could not find device rdma_en5 (10 available)",
     "distributed/jaccl/lib/jaccl/rdma.cpp@v0.32.1"),
    *[("jaccl-protection-domain", releases, "RuntimeError: [jaccl] Couldn't allocate protection domain", where)
      for releases, where in _RDMA_BY_RELEASE],
    # --- sockets ---
    ("jaccl-side-channel", "0.30.1-0.31.1", "RuntimeError: [jaccl] Recv failed with errno=54",
     "distributed/utils.cpp@v0.30.1 (TCPSocket with the [jaccl] tag)"),
    ("jaccl-side-channel", "0.31.2-", "RuntimeError: [jaccl] Send failed with errno=32",
     "distributed/jaccl/lib/jaccl/tcp.cpp@v0.31.2"),
    ("jaccl-side-channel", "0.31.2-", "[jaccl] Recv failed with errno=2", "distributed/jaccl/lib/jaccl/tcp.cpp@v0.32.1"),
    ("connect-timeout", "0.29.0-0.30.0", "RuntimeError: [ring] Couldn't connect (error: 60)",
     "distributed/ring/ring.cpp@v0.29.0"),
    ("connect-timeout", "0.30.1-", "RuntimeError: [ring] Couldn't connect (error: 110)",
     "distributed/utils.cpp@v0.30.1 (throw_socket_error since v0.32.1, c6c809b: same words)"),
    ("connect-timeout", "0.30.1-0.31.1", "RuntimeError: [jaccl] Couldn't connect (error: 60)",
     "distributed/utils.cpp@v0.30.1"),
    ("connect-timeout", "0.31.2-", "RuntimeError: [jaccl] Couldn't connect (error: 60)",
     "distributed/jaccl/lib/jaccl/tcp.cpp@v0.31.2"),
    ("connect-refused", "0.29.0-0.30.0", "RuntimeError: [ring] Couldn't connect (error: 61)",
     "distributed/ring/ring.cpp@v0.29.0"),
    ("connect-refused", "0.30.1-", "RuntimeError: [ring] Couldn't connect (error: 111)", "distributed/utils.cpp@v0.32.1"),
    ("connect-no-route", "0.30.1-", "RuntimeError: [ring] Couldn't connect (error: 65)", "distributed/utils.cpp@v0.32.1"),
    ("connect-no-route", "0.29.0-0.30.0", "RuntimeError: [ring] Couldn't connect (error: 113)",
     "distributed/ring/ring.cpp@v0.29.0"),
    ("peer-reset", "0.29.0-", "[ring] Receiving from socket 4 failed with errno 54", "distributed/ring/ring.cpp@v0.29.0"),
    ("peer-reset", "0.29.0-", "[ring] Sending to socket 3 failed with errno 104", "distributed/ring/ring.cpp@v0.32.1"),
    ("ring-peer-lost", "0.32.1-", "[ring] Socket 7 was closed by the peer",
     "distributed/ring/ring.cpp@v0.32.1 (8c28c38, PR #4060)"),
    ("ring-peer-lost", "0.32.1-", "[ring] Sending to socket 7 made no progress", "distributed/ring/ring.cpp@v0.32.1"),
    ("ring-peer-lost", "0.32.1-", "RuntimeError: [ring] connection to a peer was lost",
     "distributed/ring/ring.cpp@v0.32.1"),
    ("ring-2gib", "0.29.0-0.32.0", "[ring] Sending to socket 3 failed with errno 22", "distributed/ring/ring.cpp@v0.32.0"),
    ("ring-2gib", "0.29.0-0.32.0", "[ring] Receiving from socket 3 failed with errno 22",
     "distributed/ring/ring.cpp@v0.29.0"),
    # --- files ---
    ("write-failed", "0.29.0-", "RuntimeError: [write] Unable to write 8 bytes to file.", "io/load.h@v0.29.0"),
    # as reference_train printed it before it said the host and folder itself (issue 39)
    ("write-failed", "0.29.0-", "error: [write] Unable to write 402653184 bytes to file.", "io/load.h@v0.32.1"),
    # --- Metal command buffers: completion handlers abort without a final "." until 0.31.2;
    # a synchronize raised it without "." until 0.31.1, with "." from 0.31.2 (5e2c442, PR #3348);
    # from 0.32.0 (a025496, PR #3523) every one is a RuntimeError with "." ---
    *[(key, "0.29.0-0.31.2", _ABORT + _CB + reason, "backend/metal/eval.cpp@v0.29.0 and @v0.31.2 (check_error)")
      for key, reason in _CB_REASONS.items()],
    *[(key, "0.29.0-0.31.1", "RuntimeError: " + _CB + reason, "backend/metal/eval.cpp@v0.31.1 (finalize)")
      for key, reason in _CB_REASONS.items()],
    *[(key, "0.31.2-", "RuntimeError: " + _CB + reason + ".", "backend/metal/device.cpp@v0.31.2 and @v0.32.0")
      for key, reason in _CB_REASONS.items()],
    # --- GPU code built for a newer macOS: mlx's prefix unchanged since 0.29.0 (device.cpp), Metal's four
    # refusals after it (captures: mlxstudio #104, vllm-swift #10, exo #1912, ultralight-quick-start #1) ---
    ("metal-newer-macos", "0.29.0-", "RuntimeError: Failed to load the default metallib. This library is using "
     "language version 4.0 which is not supported on this OS. library not found library not found ",
     "backend/metal/device.cpp@v0.29.0 (load_default_library)"),
    ("metal-newer-macos", "0.29.0-", "RuntimeError: Failed to load the default metallib. This library is using a "
     "deployment target (0x00020008) that is not supported on this OS. library not found ",
     "backend/metal/device.cpp@v0.32.1"),
    ("metal-newer-macos", "0.29.0-", "RuntimeError: Failed to load the metallib from </opt/k/custom.metallib> with "
     "error This library is using language version 4.0 which is not supported on this OS.",
     "backend/metal/device.cpp@v0.32.1 (load_library with a path)"),
    ("metal-newer-macos", "0.29.0-", "Function fence_update is using language version 4.0 which is incompatible "
     "with this OS.", "backend/metal/device.cpp@v0.32.1 (get_kernel_: Metal's reason on the next line)"),
    ("metal-newer-macos", "0.29.0-", "Function v_copyint32float32 has a deployment target which is incompatible "
     "with this OS.", "backend/metal/device.cpp@v0.29.0 (get_kernel_)"),
    ("metal-kernel-load", "0.29.0-", "RuntimeError: [metal::Device] Unable to load kernel v_copyint32float32",
     "backend/metal/device.cpp@v0.29.0 (get_kernel_)"),
    ("metal-kernel-load", "0.29.0-", _ABORT + "[metal::Device] Unable to load kernel fence_update",
     "backend/metal/device.cpp@v0.32.1, uncaught, as libc++abi prints it (mlx-swift-examples #198)"),
    ("metal-kernel-load", "0.29.0-", "RuntimeError: [metal::Device] Unable to load function steel_gemm_fused_nn",
     "backend/metal/device.cpp@v0.32.1 (get_function_)"),
    # --- MPI and the backend choice (the next test makes the installed mlx print the last three) ---
    ("mpi-not-open-mpi", "0.29.0-",
     "[mpi] MPI found but it does not appear to be Open MPI.MLX requires Open MPI but this is MPICH Version: 4.2.0",
     "distributed/mpi/mpi.cpp@v0.29.0 (std::cerr, no space after the first '.')"),
    ("mpi-cannot-init", "0.29.0-", "RuntimeError: Cannot initialize MPI", "distributed/mpi/mpi.cpp@v0.29.0"),
    ("mpi-single-process", "0.32.1-", "RuntimeError: [mpi] The world has a single process. Launch with mpirun to "
     "initialize the mpi backend.", "distributed/mpi/mpi.cpp@v0.32.1 (adf21de, PR #4210)"),
    ("no-backend", "0.29.0-", "RuntimeError: [distributed] Couldn't initialize any backend",
     "distributed/distributed.cpp@v0.29.0"),
]


def test_every_wording_of_every_release():
    for key, releases, line, where in WORDINGS:
        assert keys([line]) == [key], (releases, where, line)


def test_every_entry_has_its_wordings():
    assert {key for key, *_ in WORDINGS} == {e.key for e in KNOWN_ERRORS}


def test_the_docs_list_each_wording_under_its_entry():
    # docs/errors.md "Every wording, by release": under each "### `key`", one "- `line` ..." per wording
    text = DOC.read_text().split("## Every wording, by release", 1)[1].split("\n## ", 1)[0]
    sections = dict(re.findall(r"^### `([a-z0-9-]+)`\n(.*?)(?=^### |\Z)", text, re.M | re.S))
    assert list(sections) == [e.key for e in KNOWN_ERRORS]
    for key, body in sections.items():
        lines = re.findall(r"^- `([^`]+)`", body, re.M)
        assert lines, key
        for line in lines:
            assert keys([line]) == [key], line


def _mlx_init_errors(script_env: dict[str, str], backends: list[str]) -> list[str]:
    """The installed mlx's own messages when mx.distributed.init(strict=True) fails, one per backend."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLX_", "JACCL_", "OMPI_", "PMIX_", "PRTE_"))} | script_env
    code = ("import mlx.core as mx\n"
            f"for backend in {backends!r}:\n"
            "    try:\n"
            "        mx.distributed.init(strict=True, backend=backend)\n"
            "    except RuntimeError as e:\n"
            "        print(f'{type(e).__name__}: {e}')\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_installed_mlx_prints_the_mpi_and_backend_wordings(tmp_path):
    # No libmpi where MLX_MPI_LIBNAME points: the mpi backend cannot start, and then no backend can.
    printed = _mlx_init_errors({"MLX_MPI_LIBNAME": str(tmp_path / "libmpi.so.40")}, ["mpi", "any"])
    assert printed == ["RuntimeError: Cannot initialize MPI",
                       "RuntimeError: [distributed] Couldn't initialize any backend"]
    assert keys(printed) == ["mpi-cannot-init", "no-backend"]
    # The real Open MPI beside this python, started without mpirun: a world of one (mlx 0.32.1 and later).
    libmpi = find_libmpi(python=sys.executable)
    require(libmpi is not None, "no Open MPI libmpi beside the test python")
    [single] = _mlx_init_errors({"MLX_MPI_LIBNAME": libmpi}, ["mpi"])
    assert single.startswith("RuntimeError: [mpi] The world has a single process.")
    assert keys([single]) == ["mpi-single-process"]


def test_mlxs_own_line_yields_to_the_reason_printed_beside_it():
    not_open = "[mpi] MPI found but it does not appear to be Open MPI.MLX requires Open MPI but this is MPICH"
    assert keys([not_open, "RuntimeError: Cannot initialize MPI"]) == ["mpi-not-open-mpi"]
    assert keys(["RuntimeError: Cannot initialize MPI"]) == ["mpi-cannot-init"]


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
        # a JIT or custom kernel that did not compile (oMLX #2152): the compiler's errors follow, not ours
        "RuntimeError: [metal::Device] Unable to build metal library from source",
        # an MPI message about a missing collective, not about starting MPI
        "[mpi] sum_scatter not yet implemented.",
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
    [busy] = diagnose(["RuntimeError: [jaccl] Creating the queue pair failed with 'Resource busy (16)'."])
    assert "kill the leftover ranks" in busy.text("0.32.4")


def test_smoke_prints_cause_and_fix_under_the_failed_rank(macos_fixtures):
    from mlxcluster.cli.smoke import render_failures
    from mlxcluster.smoke.run import SmokeReport
    from mlxcluster.smoke.watch import RankOutcome

    tail = "\n".join([real_line(macos_fixtures, "Sending to socket 3"),  # the #4280 lines
                      real_line(macos_fixtures, "Too many send/recv errors")])
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

    rtr = real_line(macos_fixtures, "to RTR failed with errno 22")
    monkeypatch.setattr(trainer, "run_job", lambda job, on_line, **kwargs: RunOutcome(
        exit_code=1, failed_rank=1, seconds=0.1, lines=("step 1", rtr)))
    result = CliRunner().invoke(main, ["train", "--local", "2", "--no-preflight", "--config", "tiny"])
    assert result.exit_code == 1, result.output
    assert f"known error: {rtr}: a Thunderbolt port JACCL uses has no IPv4 address yet" in result.output
    assert "ml-explore/mlx #3467" in result.output


def test_train_names_the_mlx_release_that_fixes_it(monkeypatch, macos_fixtures, tmp_path,
                                                   hosts_run_by):
    monkeypatch.chdir(tmp_path)  # the run's record (default --out runs/reference) goes here
    import json

    from click.testing import CliRunner

    import mlxcluster.launch.preflight as preflight
    import mlxcluster.launch.trainer as trainer
    from mlxcluster.cli import main
    from mlxcluster.jobs.watch import RunOutcome
    from tests.fakes import FakeSsh
    from tests.fakes import result as reply
    from tests.probe_support import run_probe

    too_big = real_line(macos_fixtures, "Sending to socket 3")  # mlx #4280, fixed in 0.32.1
    # The ranks' host answers the job's probe (its python reading the script on stdin:
    # ``PY -``) as a Mac with mlx 0.32.0 would, and runs no other job.
    probe = run_probe()
    probe["platform"], probe["mlx"]["version"] = "darwin", "0.32.0"

    def answer(host, command):
        return reply(json.dumps(probe) + "\n") if " - --inventory-env" in command else reply()

    hosts = hosts_run_by(FakeSsh(default=answer))
    monkeypatch.setattr(preflight, "check_probes", lambda job, probes: [])
    monkeypatch.setattr(preflight, "smoke_all_sum", lambda job, env=None: (True, "all_sum ok"))
    monkeypatch.setattr(trainer, "run_job", lambda job, on_line, **kwargs: RunOutcome(
        exit_code=1, failed_rank=0, seconds=0.1, lines=(too_big, "[ring] Too many send/recv errors. Aborting...")))
    result = CliRunner().invoke(main, ["train", "--local", "2", "--config", "tiny", "--no-openblas"])
    assert result.exit_code == 1, result.output
    assert "this cluster runs mlx 0.32.0; mlx 0.32.1 fixes it" in result.output
    asked = [command for _, command in hosts.calls]
    assert {host for host, _ in hosts.calls} == {"local-0"}  # both ranks on this machine
    assert sum(" - --inventory-env" in command for command in asked) == 1  # probed once
