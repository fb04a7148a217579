"""Known run-time errors of MLX distributed ranks: message -> cause and fix.

One table, here; docs/errors.md shows the same table. ``diagnose(lines)``
finds the known messages in a failed rank's output (smoke and train call it
when a rank fails) and says what they mean. Library code: it prints nothing.

Each pattern is built from the words mlx's own source formats (the file is
``printed_by``, read at tag v0.32.1; the mlx-metal 0.32.4 wheel carries the
same strings), and older releases' words are kept where they differ
(``changed_in`` names the release that changed them). Metal's part of a
command-buffer or metallib message (after mlx's prefix) is Apple's error text,
not in mlx's source: those words come from public captures (docs/errors.md).

Errno numbers differ between macOS and Linux for the same cause (ETIMEDOUT
60 / 110, ECONNREFUSED 61 / 111, EHOSTUNREACH 65 / 113, ECONNRESET 54 / 104):
the patterns take both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mlxcluster.facts.facts import version_tuple


@dataclass(frozen=True)
class KnownError:
    key: str
    pattern: re.Pattern
    cause: str
    fix: str
    source: str  # where the cause and fix come from (issues, PRs, captures)
    printed_by: str  # the mlx source file (under mlx/) that formats the message
    changed_in: str = ""  # the mlx release whose change this wording is tied to; "" = unchanged
    fixed_in: str | None = None  # the mlx release that no longer fails this way

    def matches(self, line: str) -> bool:
        return bool(self.pattern.search(line))


def _p(regex: str) -> re.Pattern:
    return re.compile(regex, re.I)


_RDMA = "distributed/jaccl/lib/jaccl/rdma.cpp"
_JACCL_TCP = "distributed/jaccl/lib/jaccl/tcp.cpp"
_SOCKETS = "distributed/utils.cpp ([ring]), distributed/jaccl/lib/jaccl/tcp.cpp ([jaccl])"
_RING = "distributed/ring/ring.cpp"
_METAL = "backend/metal/device.cpp"
_METAL_CB = "[METAL] Command buffer execution failed: "
_CB_FIX_SMALLER = ("make each GPU step smaller (batch size, sequence length, --grad_checkpoint) or put "
                   "MLX_MAX_OPS_PER_BUFFER=10 in the inventory's env so each command buffer holds less work")

KNOWN_ERRORS: tuple[KnownError, ...] = (
    # --- JACCL (RDMA over Thunderbolt) -------------------------------------------------------
    KnownError(
        "jaccl-qp-errno-16", _p(r"\[jaccl\] Creating the queue pair failed with '[^']*\(16\)'"),
        "the RDMA device has no queue pair left (EBUSY, 'Resource busy'): macOS allows 10 per "
        "Thunderbolt RDMA device, and ranks of an earlier run that never exited still hold theirs; "
        "retrying cannot help",
        "kill the leftover ranks of earlier runs on that host (or reboot it); use fewer connections per "
        "device (fewer hosts per mesh, or jaccl-ring), or spread the cables over more ports",
        "ml-explore/mlx PR #4209, issue #3162", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-qp-create", _p(r"\[jaccl\] Couldn't create queue pair"
                              r"|\[jaccl\] Creating the queue pair failed with '[^']*\((?!16\))\d+\)'"),
        "ibv_create_qp failed: mlx 0.32.1 and later give the reason in the quotes; mlx 0.30.1 to 0.32.0 "
        "give none (the usual one on Thunderbolt is the device's 10 queue pairs used up, errno 16)",
        "kill the leftover ranks of earlier runs on that host (or reboot it); update mlx to 0.32.1 or later "
        "to see the errno",
        "ml-explore/mlx PR #4209", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-no-ipv4-gid", _p(r"\[jaccl\] No IPv4-mapped GID for this device"),
        "a Thunderbolt port JACCL uses has no IPv4 address yet, so its RDMA device publishes no "
        "IPv4-mapped GID (the only kind JACCL accepts), or the Thunderbolt Bridge (bridge0) holds the port",
        "give each cable a /30 (mlxcluster hostfile generate --plan-ips) or wait for the 169.254 address; "
        "take the ports out of bridge0; mlxcluster doctor --backend jaccl (thunderbolt-ipv4, thunderbolt-bridge)",
        "ml-explore/mlx PR #4191, issue #3467", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-rtr-errno-22", _p(r"\[jaccl\] Changing queue pair to RTR failed with errno 22\b"),
        "a Thunderbolt port JACCL uses has no IPv4 address yet (JACCL accepts only IPv4-mapped GIDs), "
        "or the Thunderbolt Bridge (bridge0) still holds the ports (mlx 0.32.0 and older word it so; "
        "0.32.1 and later say 'No IPv4-mapped GID for this device')",
        "give each cable a /30 (mlxcluster hostfile generate --plan-ips) or wait for the 169.254 address; "
        "take the ports out of bridge0; mlxcluster doctor --backend jaccl (thunderbolt-ipv4, thunderbolt-bridge)",
        "ml-explore/mlx #3467", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-rtr-errno-96", _p(r"\[jaccl\] Changing queue pair to RTR failed with errno 96\b"),
        "the RDMA device's protection domains or queue pairs are used up by ranks of earlier runs that "
        "never exited, or leaked by failed starts (only a reboot frees those); also reported after "
        "re-plugging cables while bridge0 held the ports",
        "kill the leftover ranks of earlier runs on every host, and reboot the hosts if it persists; "
        "take the ports out of bridge0 (mlxcluster doctor --backend jaccl)",
        "exo-explore/exo #1973; public cluster notes (leaked protection domains)", _RDMA),
    KnownError(
        "jaccl-no-rdma-devices", _p(r"\[jaccl\] Could not find device \S+ \(0 available\)"),
        "this Mac has no RDMA device at all: Thunderbolt 4 or older (RDMA needs Thunderbolt 5), RDMA "
        "not enabled, or macOS older than 26.2; mlx 0.32.0 and older crash here (SIGSEGV in ibv_reg_mr) "
        "without a message",
        "on Thunderbolt 4 use the ring backend (--backend ring); on Thunderbolt 5 run 'rdma_ctl enable' "
        "in Recovery and reboot; mlxcluster doctor --backend jaccl",
        "ml-explore/mlx PR #4180, issue #3777", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-device-not-found", _p(r"\[jaccl\] Could not find device \S+ \((?!0 available\))\d+ available\)"),
        "the hostfile names an RDMA device this host does not have (ports renumbered after re-cabling "
        "or a reboot, or a hostfile made for other hosts)",
        "regenerate the hostfile (mlxcluster hostfile generate) and compare with 'ibv_devices' on that host",
        "ml-explore/mlx PR #4180", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-protection-domain", _p(r"\[jaccl\] Couldn't allocate protection domain"),
        "ibv_alloc_pd failed on an RDMA device the hostfile names: the device is PORT_DOWN (no live "
        "cable, or the peer has RDMA off), or the Mac lists rdma devices but cannot do RDMA "
        "(Thunderbolt 4), or protection domains leaked by earlier failed starts are used up",
        "check 'ibv_devinfo' on both ends: every device the hostfile names must be PORT_ACTIVE; "
        "mlxcluster doctor --backend jaccl (rdma-ports-active), then regenerate the hostfile; on "
        "Thunderbolt 4 use --backend ring; reboot if earlier runs crashed",
        "ibv_devinfo captures (osaurus, omlx-plus); a public JACCL write-up", _RDMA),
    KnownError(
        "jaccl-side-channel", _p(r"\[jaccl\] (Recv|Send) failed with errno=\d+"),
        "the TCP side channel to the coordinator (MLX_JACCL_COORDINATOR, rank 0) broke: the other end "
        "exited or was killed (often after failing first itself) or the link went down; when the peer "
        "just closed the socket the errno is stale and means nothing (errno=2, errno=0)",
        "look at the first rank that failed (often rank 0); check every host reaches the coordinator's "
        "address (mlxcluster doctor, data-path)",
        "exo-explore/exo #1847", _JACCL_TCP),
    # --- sockets (ring, and JACCL's coordinator) ----------------------------------------------
    KnownError(
        "connect-timeout", _p(r"Couldn't connect \(error: (60|110)\)"),
        "ETIMEDOUT: the connection was never answered: a firewall drops the port, the address is on a "
        "link the peer cannot reach (a Wi-Fi IP next to Thunderbolt ones), or the peer/coordinator is not up",
        "mlxcluster doctor -i INVENTORY (data-path, data-ip-routes); use addresses of one kind on every host; "
        "allow the ports in the macOS firewall",
        "exo-explore/exo #2309, #2295", _SOCKETS),
    KnownError(
        "connect-refused", _p(r"Couldn't connect \(error: (61|111)\)"),
        "ECONNREFUSED: nothing listens on that address and port (the peer rank died or listens on another IP)",
        "same hostfile on every host; check the rank that should listen there; mlxcluster doctor (data-path)",
        "exo-explore/exo #2309", _SOCKETS),
    KnownError(
        "connect-no-route", _p(r"Couldn't connect \(error: (65|113)\)"),
        "EHOSTUNREACH: no route to that address from this host (wrong subnet, cable or interface down)",
        "check the cables and the IP plan; mlxcluster doctor (data-ips-present, data-ip-routes)",
        "FIELD_NOTES: ring errno 60/61/65", _SOCKETS),
    KnownError(
        "peer-reset", _p(r"failed with errno (54|104)\b"),
        "ECONNRESET: the peer rank died (crash, out of memory, killed); before mlx 0.32.1 the other "
        "ring ranks then hung instead of failing",
        "look at the first rank that failed; update mlx where it is older than 0.32.1",
        "ml-explore/mlx PR #4060", _RING, fixed_in="0.32.1"),
    KnownError(
        "ring-peer-lost", _p(r"\[ring\] (connection to a peer was lost|Socket \d+ was closed by the peer)"),
        "a neighbouring rank died or its connection broke; since mlx 0.32.1 this rank fails with it "
        "instead of hanging",
        "look at the first rank that failed (its own error is the cause); mlxcluster doctor if none failed",
        "ml-explore/mlx PR #4060", _RING, changed_in="0.32.1"),
    KnownError(
        "ring-2gib", _p(r"\[ring\] (Sending to|Receiving from) socket \d+ failed with errno 22\b"),
        "one ring send/recv of 2 GiB or more: send(2)/recv(2) reject lengths above INT_MAX (EINVAL)",
        "update mlx to 0.32.1 or later on every host, or keep single transfers under 2 GiB",
        "ml-explore/mlx #4280, fixed by PR #4281", _RING, fixed_in="0.32.1"),
    # --- files ---------------------------------------------------------------------------------
    KnownError(
        "write-failed", _p(r"\[write\] Unable to write \d+ bytes to file"),
        "mlx could not write a file it was saving (mx.save_safetensors, mx.save, mx.savez: "
        "checkpoints, exported weights): write(2) failed, almost always because that host's disk "
        "(or the volume or quota of the folder written to) is full; mlx names neither the host "
        "nor the file, and the file it was writing is left half-written",
        "free room on the host of the rank that printed it (df -h on the folder the program "
        "writes to; remove the half-written file) or write to another folder, then run again; "
        "reference_train says this itself (host, folder, room left) and resumes with --resume auto",
        "mlx/io/load.h FileWriter::write (no errno kept); issue 39: a lab host's disk filled "
        "mid-run", "io/load.h"),
    # --- Metal ---------------------------------------------------------------------------------
    KnownError(
        "metal-gpu-timeout",
        _p(re.escape(_METAL_CB) + r"(Caused GPU Timeout Error|.*kIOGPUCommandBufferCallbackErrorTimeout)"),
        "macOS stopped a GPU command buffer that ran past its time limit (one step's kernels too long)",
        _CB_FIX_SMALLER,
        "public captures (lyogavin/airllm #367)", _METAL, changed_in="0.32.0"),
    KnownError(
        "metal-internal-error", _p(re.escape(_METAL_CB) + r"Internal Error\b"),
        "the GPU gave up on a command buffer; mlx's maintainers read it as a GPU kernel timing out, most "
        "often with very large operations or several processes sharing one GPU",
        _CB_FIX_SMALLER + "; run one rank per Mac",
        "ml-explore/mlx #1231, #1335", _METAL, changed_in="0.32.0"),
    KnownError(
        "metal-impacting-interactivity",
        _p(re.escape(_METAL_CB) + r"(Impacting Interactivity|.*kIOGPUCommandBufferCallbackErrorImpactingInteractivity)"),
        "macOS took the GPU back from a command buffer that held it too long while other GPU clients "
        "(the window server of a Mac in use) waited: Apple's 'Impacting Interactivity'",
        _CB_FIX_SMALLER + "; keep other GPU work (and a logged-in desktop) off the training Macs",
        "jundot/omlx #1387; Acelogic/LTX-2-MLX #5", _METAL, changed_in="0.32.0"),
    KnownError(
        "metal-out-of-memory",
        _p(re.escape(_METAL_CB) + r"(Insufficient Memory|.*kIOGPUCommandBufferCallbackErrorOutOfMemory)"),
        "the GPU ran out of memory during a step",
        "smaller batch or sequence length, --grad_checkpoint, or a smaller model; one rank per Mac",
        "ml-explore/mlx PR #479", _METAL, changed_in="0.32.0"),
    KnownError(
        "metallib-newer-macos", _p(r"Failed to load the (default )?metallib.*not supported on this OS"),
        "this host's mlx-metal was built for a newer macOS than the host runs (a macosx_26_0 wheel, "
        "Metal language 4.0, on macOS 15 or older), e.g. wheels downloaded on or for another Mac",
        "install mlx with pip on that host itself, or fetch the wheel for its macOS "
        "(pip download --platform macosx_<its major>_0_arm64); or update that host's macOS",
        "jjang-ai/mlxstudio #104; TheTom/vllm-swift #10", _METAL),
)


@dataclass(frozen=True)
class Diagnosis:
    error: KnownError
    line: str  # the line that matched, stripped

    def text(self, mlx_version: str | None = None) -> str:
        """'<line>: <cause>. Fix: <fix> (<source>)', saying when mlx is older than the fix."""
        fix = self.error.fix
        fixed = self.error.fixed_in
        if fixed and mlx_version and version_tuple(mlx_version) < version_tuple(fixed):
            fix = f"this cluster runs mlx {mlx_version}; mlx {fixed} fixes it. {fix}"
        return f"{self.line}: {self.error.cause}. Fix: {fix} ({self.error.source})"


def diagnose(lines: Iterable[str]) -> list[Diagnosis]:
    """Each known error found in ``lines``, once, in the order first seen."""
    found: dict[str, Diagnosis] = {}
    for line in lines:
        for err in KNOWN_ERRORS:
            if err.key not in found and err.matches(line):
                found[err.key] = Diagnosis(err, line.strip()[:300])
    return list(found.values())
