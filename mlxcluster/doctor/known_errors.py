"""Known run-time errors of MLX distributed ranks: message -> cause and fix.

One table, here; docs/errors.md shows the same table. ``diagnose(lines)``
finds the known messages in a failed rank's output (smoke and train call it
when a rank fails) and says what they mean. Library code: it prints nothing.

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
    source: str
    fixed_in: str | None = None  # the mlx release that no longer fails this way

    def matches(self, line: str) -> bool:
        return bool(self.pattern.search(line))


def _p(regex: str) -> re.Pattern:
    return re.compile(regex, re.I)


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError(
        "jaccl-rtr-errno-22", _p(r"Changing queue pair to RTR failed.*errno\D{0,3}22\b"),
        "a Thunderbolt port JACCL uses has no IPv4 address yet (JACCL accepts only IPv4-mapped GIDs), "
        "or the Thunderbolt Bridge (bridge0) still holds the ports",
        "give each cable a /30 (mlxcluster hostfile generate --plan-ips) or wait for the 169.254 address; "
        "take the ports out of bridge0; mlxcluster doctor --backend jaccl (thunderbolt-ipv4, thunderbolt-bridge)",
        "ml-explore/mlx #3467"),
    KnownError(
        "jaccl-qp-errno-16", _p(r"(queue pair failed with errno\D{0,3}16\b|create_qp.*errno\D{0,3}16\b"
                                r"|qp\[\d+\] FAILED errno=16|Couldn't create queue pair.*errno\D{0,3}16\b)"),
        "the RDMA device ran out of queue pairs: macOS allows 10 per Thunderbolt RDMA device, the 11th "
        "ibv_create_qp fails with errno 16 (EBUSY); retrying cannot help",
        "use fewer connections per device (fewer hosts per mesh, or jaccl-ring), or spread the cables over "
        "more ports; reboot if an earlier crashed run still holds queue pairs",
        "ml-explore/mlx PR #4209, issue #3162"),
    KnownError(
        "jaccl-protection-domain", _p(r"\[jaccl\] Couldn't allocate protection domain"),
        "an RDMA device in the matrix is PORT_DOWN (no live cable, or the peer has RDMA off)",
        "check 'ibv_devinfo' on both ends: every device the hostfile names must be PORT_ACTIVE; "
        "mlxcluster doctor --backend jaccl (rdma-ports-active), then regenerate the hostfile",
        "ibv_devinfo captures (osaurus, omlx-plus); a public JACCL write-up"),
    KnownError(
        "connect-timeout", _p(r"Couldn't connect \(error: (60|110)\)"),
        "ETIMEDOUT: the connection was never answered: a firewall drops the port, the address is on a "
        "link the peer cannot reach (a Wi-Fi IP next to Thunderbolt ones), or the peer/coordinator is not up",
        "mlxcluster doctor -i INVENTORY (data-path, data-ip-routes); use addresses of one kind on every host; "
        "allow the ports in the macOS firewall",
        "exo-explore/exo #2309, #2295"),
    KnownError(
        "connect-refused", _p(r"Couldn't connect \(error: (61|111)\)"),
        "ECONNREFUSED: nothing listens on that address and port (the peer rank died or listens on another IP)",
        "same hostfile on every host; check the rank that should listen there; mlxcluster doctor (data-path)",
        "exo-explore/exo #2309"),
    KnownError(
        "connect-no-route", _p(r"Couldn't connect \(error: (65|113)\)"),
        "EHOSTUNREACH: no route to that address from this host (wrong subnet, cable or interface down)",
        "check the cables and the IP plan; mlxcluster doctor (data-ips-present, data-ip-routes)",
        "FIELD_NOTES: ring errno 60/61/65"),
    KnownError(
        "peer-reset", _p(r"failed with errno (54|104)\b"),
        "ECONNRESET: the peer rank died (crash, out of memory, killed); before mlx 0.32.1 the other "
        "ring ranks then hung instead of failing",
        "look at the first rank that failed; update mlx where it is older than 0.32.1",
        "ml-explore/mlx PR #4060", fixed_in="0.32.1"),
    KnownError(
        "ring-2gib", _p(r"\[ring\] (Sending to|Receiving from) socket \d+ failed with errno 22\b"),
        "one ring send/recv of 2 GiB or more: send(2)/recv(2) reject lengths above INT_MAX (EINVAL)",
        "update mlx to 0.32.1 or later on every host, or keep single transfers under 2 GiB",
        "ml-explore/mlx #4280, fixed by PR #4281", fixed_in="0.32.1"),
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
