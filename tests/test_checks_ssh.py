"""The SSH checks' judgement, from what doctor collected live (the live
collection itself is exercised against real sshd hosts in tests/lab)."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

from mlxcluster.checks.base import REGISTRY, CheckContext, Status
from mlxcluster.checks.ssh import ssh_host_key_policy
from mlxcluster.doctor import CHECK_MODULES, OPTIONAL_CHECK_MODULES
from mlxcluster.openssh import OpenSshRunner, parse_ssh_g
from mlxcluster.remote import Outcome, SshError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "doctor.md"


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
    """docs/doctor.md ('### id') and docs/doctor-topology.md ('## id') say what
    each check is, why, and how to fix it."""
    for module in (*CHECK_MODULES, *OPTIONAL_CHECK_MODULES):  # what doctor registers
        importlib.import_module(module)
    sections = set(re.findall(r"^### (\S+)$", DOCS.read_text(), re.M))
    sections |= set(re.findall(r"^## (\S+)$", (DOCS.parent / "doctor-topology.md").read_text(), re.M))
    assert "thunderbolt-bridge" in REGISTRY and "ssh-host-key-policy" in REGISTRY
    assert sorted(set(REGISTRY) - sections) == []
