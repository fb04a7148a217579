"""Inventory and SSH checks: can we, mlx.launch and mpirun reach every host?

Host-key problems are judged by ``host-keys`` alone; the other SSH checks
point at it instead of failing too, so one cause gives one failing check.
Likewise host-to-host SSH does not blame a host that nobody can reach
(``ssh-paramiko`` already does).
"""

from __future__ import annotations

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import (
    BAD,
    WARN,
    Verdict,
    doctor_check,
    from_hosts,
    grouped_fixes,
    join_hosts,
    skip,
    worst,
)
from mlxcluster.doctor.fixes.host_keys import SAVE_HOST_KEYS
from mlxcluster.doctor.fixes.host_to_host import HOST_TO_HOST_KEYS
from mlxcluster.facts.mpi import NO_TREE_SPAWN, ROUTED_RADIX
from mlxcluster.ssh.hops import HOP_SCRIPT_FAILED
from mlxcluster.ssh.openssh import explain_failure

HOST_KEY_KINDS = ("unknown-host-key", "host-key-mismatch")


def _live(ctx: CheckContext):
    return ctx.services.get("live")


def _hints(failures) -> str | None:
    """Each fix once for all the hosts it applies to; ``failures`` are
    (host name, error) pairs."""
    return grouped_fixes((name, getattr(err, "hint", None), getattr(err, "target", None))
                         for name, err in failures)


def _kind(err) -> str:
    return getattr(err, "kind", "ssh")


@doctor_check("inventory-valid", "Inventory loads and validates")
def inventory_valid(ctx: CheckContext) -> Verdict:
    """Loading already validated it (a bad inventory stops doctor with exit 2)."""
    inv = ctx.inventory
    if inv is None:
        return skip("no inventory (replay of a capture folder)")
    evidence = {h.name: f"ssh {h.ssh}" + (f", data IPs {', '.join(h.ips)}" if h.ips else "") for h in inv.hosts}
    return Verdict(Status.PASS, evidence, None)


def _ssh_verdict(outcomes: dict, describe_ok) -> Verdict:
    evidence, errors, failed = {}, [], False
    for name, outcome in outcomes.items():
        if outcome.ok:
            evidence[name] = describe_ok(name, outcome)
        elif _kind(outcome.error) in HOST_KEY_KINDS:
            evidence[name] = "host key not trusted (see host-keys)"
        else:
            evidence[name] = BAD + str(outcome.error)
            errors.append((name, outcome.error))
            failed = True
    return Verdict(worst(failed, False), evidence, _hints(errors))


@doctor_check("ssh-paramiko", "SSH (keys only, no prompt) to every host", live=True)
def ssh_paramiko(ctx: CheckContext) -> Verdict:
    live = _live(ctx)
    return _ssh_verdict(live.paramiko, lambda n, o: f"ok in {o.seconds:.2f} s")


@doctor_check("ssh-openssh", "OpenSSH BatchMode (what mlx.launch and mpirun use)", live=True)
def ssh_openssh(ctx: CheckContext) -> Verdict:
    live = _live(ctx)
    v = _ssh_verdict(live.openssh, lambda n, o: f"ssh -o BatchMode=yes ok in {o.seconds:.2f} s")
    if v.status is Status.FAIL:
        v.hint = (v.hint or "") + "; mlx.launch and mpirun run plain 'ssh HOST': fix it for that client"
    return v


@doctor_check("host-keys", "Host keys known (no trust-on-first-use prompt)", live=True, fix=SAVE_HOST_KEYS)
def host_keys(ctx: CheckContext) -> Verdict:
    live = _live(ctx)
    evidence, errors = {}, []
    for name, outcome in live.paramiko.items():
        batch = live.openssh.get(name)
        bad = [o.error for o in (outcome, batch) if o is not None and not o.ok and _kind(o.error) in HOST_KEY_KINDS]
        if bad:
            evidence[name] = BAD + str(bad[0])
            errors.extend((name, err) for err in bad)
        elif outcome.ok:
            evidence[name] = "known"
        else:
            evidence[name] = f"not checked ({_kind(outcome.error)}, see ssh-paramiko)"
    # What the fix saves: the key the connection was offered (a changed key is never fixed).
    keys = {name: {"host_id": err.host_id, "key_type": err.key_type, "fingerprint": err.fingerprint,
                   "key_base64": err.key_base64, "known_hosts": err.known_hosts}
            for name, err in errors if getattr(err, "key_base64", None)}
    return Verdict(worst(bool(errors), False), evidence, _hints(errors), keys)


# ssh -G values that verify nothing: no checking, or an empty known_hosts.
_NO_CHECKING = ("false", "no", "off")


@doctor_check("ssh-host-key-policy", "Plain ssh verifies host keys (mlx.launch, mpirun without mlxcluster)",
              live=True)
def ssh_host_key_policy(ctx: CheckContext) -> Verdict:
    """mlxcluster's own ssh calls, and the ssh it gives mlx.launch and mpirun,
    force StrictHostKeyChecking=yes; run by hand with a hostfile, they use the
    config as it is. Warn where it accepts any key for a host."""
    live = _live(ctx)
    evidence, weak = {}, []
    for name, outcome in live.ssh_options.items():
        if not outcome.ok:
            evidence[name] = f"not read ({outcome.error})"
            continue
        options = outcome.value
        strict = options.get("stricthostkeychecking", "ask")
        known = options.get("userknownhostsfile", "")
        problems = []
        if strict in _NO_CHECKING:
            problems.append("StrictHostKeyChecking no")
        if known and all(f == "/dev/null" for f in known.split()):
            problems.append("UserKnownHostsFile /dev/null")
        if problems:
            evidence[name] = WARN + f"{', '.join(problems)}: any key is accepted for {options.get('hostname', name)}"
            weak.append(name)
        else:
            evidence[name] = f"StrictHostKeyChecking {strict}" + (" (trusts a new key on first use)"
                                                                  if strict == "accept-new" else "")
    hint = None
    if weak:
        hint = (f"remove 'StrictHostKeyChecking no' / 'UserKnownHostsFile /dev/null' for {join_hosts(weak)} "
                "in the ssh config (ssh -G HOST shows what applies), then connect once to each host and "
                "check its fingerprint; mlxcluster smoke and train verify keys whatever the config says")
    return Verdict(worst(False, bool(weak)), evidence, hint)


# Backends whose launcher, mlx.launch, starts every rank with ssh from this
# machine; the ranks then talk over TCP (ring), RDMA (jaccl) or NCCL and never
# ssh to each other.
_LAUNCHED_FROM_HERE = ("ring", "jaccl", "jaccl-ring", "nccl")
_FLAG = " ".join(NO_TREE_SPAWN)


@doctor_check("host-to-host-ssh", "SSH between the hosts, every pair (mpi: mpirun started on a host)",
              live=True, fix=HOST_TO_HOST_KEYS)
def host_to_host(ctx: CheckContext) -> Verdict:
    """Only mpi is judged, and only as a warning: the mpirun mlxcluster runs or
    prints starts every daemon from its own machine (no tree spawn), which the
    lab showed to work with no SSH trust between hosts (docs/doctor-checks.md).
    Every pair is judged: an mpirun may be started on any host, and with tree
    spawn a daemon on any host ssh's onward (the lab saw labhost2 -> labhost4).
    Evidence is keyed by the host that could not be reached."""
    backend = ctx.backend or "ring"
    if backend in _LAUNCHED_FROM_HERE:
        return skip(f"not needed for {backend}: mlx.launch starts every rank over ssh from this machine "
                    "(checked by ssh-openssh) and the ranks never ssh each other")
    live = _live(ctx)
    first = live.host_to_host_source
    if first is None:
        return skip("only one host")
    if not live.host_to_host:
        return skip(f"first host {first} is not reachable (see ssh-paramiko)")
    untried = [o.error for o in live.host_to_host.get(first, {}).values()
               if not o.ok and _kind(o.error) == HOP_SCRIPT_FAILED]
    if untried:
        return skip(f"not tested: {untried[0]}")
    sources = list(live.host_to_host.items())
    everyone = list(live.host_to_host)
    targets = list(dict.fromkeys(t for _, hops in sources for t in hops))
    evidence, errors, failing, fix_data = {}, [], [], {}
    for name in targets:
        target_down = not live.paramiko[name].ok
        reached, down_from, broken = [], [], {}  # broken: error text -> (sources, error)
        for source, hops in sources:
            outcome = hops.get(name)
            if outcome is None:
                continue
            if outcome.ok and outcome.value.exit_status == 0:
                reached.append(source)
                continue
            if not outcome.ok and _kind(outcome.error) == HOP_SCRIPT_FAILED:
                continue  # that host's script did not run (python-path): no hop was tried
            err = outcome.error if not outcome.ok else explain_failure(
                name, outcome.value.exit_status, outcome.value.stderr)
            if target_down:
                down_from.append(source)
                continue
            broken.setdefault(str(err), ([], err))[0].append(source)
        if broken:
            evidence[name] = WARN + "; ".join(f"{from_hosts(srcs, set(everyone) - {name})} -> {name}: {text}"
                                              for text, (srcs, _) in broken.items())
            errors += [(name, err) for _, err in broken.values()]
            failing.append(name)
            fix_data[name] = {"sources": [s for s in everyone if any(s in srcs for srcs, _ in broken.values())]}
        elif down_from:
            evidence[name] = f"{join_hosts(down_from)} -> {name}: not judged, {name} is unreachable (see ssh-paramiko)"
        elif reached:
            evidence[name] = f"{from_hosts(reached, set(everyone) - {name})} -> {name}: ok"
    hint = None
    if errors:
        from_where = join_hosts({s for d in fix_data.values() for s in d["sources"]})
        fixes = _hints(errors) or f"ssh-copy-id to {join_hosts(failing)}, then 'ssh HOST true' once for each"
        hint = (f"mlxcluster's mpirun (smoke, train, hostfile generate) does not need this: it passes "
                f"'{_FLAG}', so every daemon starts from this machine. Needed only by an mpirun started on "
                f"a host (the first, {first}, or any other), or by one without that flag on more than "
                f"{ROUTED_RADIX} hosts, whose daemons ssh onward (it then exits 255 without a message; "
                f"mlx.launch --backend mpi: add --mpi-arg='{_FLAG}'). To allow it anyway, on "
                f"{from_where}: {fixes}; or 'mlxcluster doctor --backend mpi --fix'")
    return Verdict(worst(False, bool(errors)), evidence, hint, fix_data)
