"""The SSH checks' judgement, from what doctor collected live (the live
collection itself is exercised against real sshd hosts in tests/lab)."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlxcluster.doctor.checks.base import REGISTRY, CheckContext, Status
from mlxcluster.doctor.checks.common import grouped_fixes
from mlxcluster.doctor.checks.ssh import (
    host_keys,
    host_to_host,
    ssh_host_key_policy,
    ssh_openssh,
    ssh_paramiko,
)
from mlxcluster.doctor.doctor import CHECK_MODULES, OPTIONAL_CHECK_MODULES
from mlxcluster.ssh.openssh import OpenSshRunner, explain_failure, parse_ssh_g
from mlxcluster.ssh.remote import (
    CommandResult,
    HostKeyUnknown,
    Outcome,
    SshError,
    SshTarget,
    classify,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "doctor-checks.md"


def policy_of(config: Path | None, host: str) -> Outcome:
    """What doctor collects for one host: ssh -G through the real OpenSSH client."""
    return Outcome(host, value=OpenSshRunner(str(config) if config else None).resolved_options(host))


def judge(outcomes: dict[str, Outcome]):
    live = SimpleNamespace(ssh_options=outcomes)
    return ssh_host_key_policy(CheckContext(captures={}, live=True, services={"live": live}))


def test_a_config_that_accepts_any_key_warns_naming_the_hosts(tmp_path):
    weak = tmp_path / "weak"
    weak.write_text("Host studio-*\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    result = judge({"studio-1": policy_of(weak, "studio-1"), "mini-1": policy_of(weak, "mini-1")})
    assert result.status is Status.WARN
    assert result.evidence["studio-1"].startswith("! StrictHostKeyChecking no, UserKnownHostsFile /dev/null")
    assert result.evidence["mini-1"] == "StrictHostKeyChecking ask"
    assert "for studio-1 in the ssh config" in result.hint


def test_a_checking_config_passes_and_accept_new_is_said(tmp_path):
    tofu = tmp_path / "tofu"
    tofu.write_text("StrictHostKeyChecking accept-new\n")
    result = judge({"studio-1": policy_of(tofu, "studio-1"),
                    "studio-2": Outcome("studio-2", error=SshError("ssh", "ssh -G studio-2: bad"))})
    assert result.status is Status.PASS
    assert result.evidence == {"studio-1": "StrictHostKeyChecking accept-new (trusts a new key on first use)",
                            "studio-2": "not read (ssh -G studio-2: bad)"}


def test_ssh_g_output_is_parsed_first_value_wins():
    out = subprocess.run(["ssh", "-G", "studio-1"], capture_output=True, text=True, timeout=10).stdout
    options = parse_ssh_g(out)
    assert options["hostname"] == "studio-1" and options["batchmode"] == "no"
    assert parse_ssh_g("identityfile ~/.ssh/a\nidentityfile ~/.ssh/b\n") == {"identityfile": "~/.ssh/a"}


def test_every_check_has_its_section_in_the_docs():
    """docs/doctor-checks.md ('### id') and docs/doctor-topology.md ('## id') say
    what each check is, why, and how to fix it."""
    for module in (*CHECK_MODULES, *OPTIONAL_CHECK_MODULES):  # what doctor registers
        importlib.import_module(module)
    sections = set(re.findall(r"^### (\S+)$", DOCS.read_text(), re.M))
    sections |= set(re.findall(r"^## (\S+)$", (DOCS.parent / "doctor-topology.md").read_text(), re.M))
    assert "thunderbolt-bridge" in REGISTRY and "ssh-host-key-policy" in REGISTRY
    assert sorted(set(REGISTRY) - sections) == []


# ---- host-to-host-ssh: judged per backend --------------------------------------------

HOSTS = [f"studio-{i}" for i in range(1, 9)]
DENIED = "root@{}: Permission denied (publickey).\r\n"  # what ssh -o BatchMode=yes prints


def hop_live(stderr_of=lambda name: DENIED.format(name), status=255):
    """What doctor collects for 8 hosts whose first host's key no other host accepts."""
    return SimpleNamespace(
        host_to_host_source=HOSTS[0],
        host_to_host={HOSTS[0]: {n: Outcome(n, value=CommandResult("", stderr_of(n), status, 0.1))
                                 for n in HOSTS[1:]}},
        paramiko={n: Outcome(n, value=True) for n in HOSTS})


def judge_hops(backend, live):
    return host_to_host(CheckContext(captures={}, live=True, backend=backend, services={"live": live}))


@pytest.mark.parametrize("backend", [None, "ring", "jaccl", "jaccl-ring", "nccl"])
def test_host_to_host_is_not_needed_by_mlx_launch_backends(backend):
    """mlx.launch starts every rank from this machine: failing hops do not
    matter (doctor does not even make them) and the reason is said."""
    result = judge_hops(backend, hop_live())
    assert result.status is Status.SKIP
    assert f"not needed for {backend or 'ring'}" in result.hint
    assert "starts every rank over ssh from this machine" in result.hint


def test_host_to_host_failing_for_mpi_warns_with_the_lab_evidence():
    """Our mpirun passes plm_ssh_no_tree_spawn: it never needs SSH between
    hosts (lab: 2-8 hosts ran without it), so a failing hop warns."""
    result = judge_hops("mpi", hop_live())
    assert result.status is Status.WARN
    assert result.evidence["studio-2"] == "! studio-1 -> studio-2: ssh studio-2: key authentication failed"
    assert set(result.evidence) == set(HOSTS[1:])
    assert "passes '--mca plm_ssh_no_tree_spawn 1'" in result.hint
    assert "more than 64 hosts" in result.hint and "exits 255 without a message" in result.hint


def test_host_to_host_for_mpi_passes_when_every_hop_works():
    result = judge_hops("mpi", hop_live(stderr_of=lambda n: "", status=0))
    assert result.status is Status.PASS and result.hint is None
    assert result.evidence["studio-8"] == "studio-1 -> studio-8: ok"


# ---- each fix once, naming every host ---------------------------------------------------

def sentences(hint: str) -> list[str]:
    return [part.strip() for part in hint.split(";")]


@pytest.mark.parametrize("stderr, fix", [
    ("Host key verification failed.\r\n", "run 'ssh HOST' once interactively, check the fingerprint"),
    (DENIED, "ssh-copy-id USER@HOST"),
    ("ssh: connect to host x port 22: Connection refused\r\n", "enable Remote Login"),
])
def test_host_to_host_hint_gives_each_fix_once_for_all_hosts(stderr, fix):
    result = judge_hops("mpi", hop_live(stderr_of=lambda n: stderr.replace("{}", n)))
    others = ", ".join(HOSTS[1:])
    matching = [s for s in sentences(result.hint) if fix in s]
    assert len(matching) == 1, result.hint
    assert others in matching[0], matching[0]
    assert all(result.hint.count(h) <= 3 for h in HOSTS[1:]), result.hint  # not once per sentence per host


def test_grouped_fixes_name_every_host_once_per_fix():
    errors = [(h, explain_failure(h, 255, "Host key verification failed.\n")) for h in HOSTS]
    errors += [(h, explain_failure(h, 255, "ssh: connect to host: Connection timed out\n")) for h in ("m-2", "m-1")]
    hint = grouped_fixes((h, e.hint, e.target) for h, e in errors)
    assert sentences(hint) == [
        f"for each HOST in {', '.join(HOSTS)}: run 'ssh HOST' once interactively, check the fingerprint "
        "and accept the key",
        "m-1, m-2: host down or a firewall drops the SSH port"]
    # One host: its own fix, as written for it.
    one = explain_failure("studio-3", 255, "Host key verification failed.\n")
    assert grouped_fixes([("studio-3", one.hint, one.target)]) == one.hint


def test_grouped_fixes_take_out_only_the_whole_host_name():
    """10.0.0.2 is the target of 'root@10.0.0.2' but not part of 10.0.0.21."""
    fixes = [("a", "ssh-copy-id root@10.0.0.2 (from 10.0.0.21)", "10.0.0.2"),
             ("b", "ssh-copy-id root@10.0.0.3 (from 10.0.0.21)", "10.0.0.3")]
    assert grouped_fixes(fixes) == "for each HOST in 10.0.0.2, 10.0.0.3: ssh-copy-id root@HOST (from 10.0.0.21)"


def test_every_ssh_check_gives_each_fix_once():
    """ssh-paramiko, ssh-openssh and host-keys on 8 hosts failing alike."""
    targets = {h: SshTarget(h, f"10.0.0.{i}", 22, "root") for i, h in enumerate(HOSTS, 1)}
    import paramiko

    auth = {h: Outcome(h, error=classify(paramiko.AuthenticationException("no"), targets[h])) for h in HOSTS}
    unknown = {h: Outcome(h, error=HostKeyUnknown(h, "ssh-ed25519", "SHA256:x", "/k")) for h in HOSTS}
    batch = {h: Outcome(h, error=explain_failure(h, 255, DENIED.format(h))) for h in HOSTS}
    cases = [
        (ssh_paramiko, SimpleNamespace(paramiko=auth), "ssh-copy-id root@HOST",
         ", ".join(t.hostname for t in targets.values())),
        (ssh_openssh, SimpleNamespace(openssh=batch), "ssh-copy-id USER@HOST", ", ".join(HOSTS)),
        (host_keys, SimpleNamespace(paramiko=unknown, openssh={}), "run 'ssh HOST' once and answer yes",
         ", ".join(HOSTS)),
    ]
    for check, live, fix, named in cases:
        result = check(CheckContext(captures={}, live=True, services={"live": live}))
        assert result.status is Status.FAIL
        matching = [s for s in sentences(result.hint) if fix in s]
        assert len(matching) == 1 and named in matching[0], (check.__name__, result.hint)
