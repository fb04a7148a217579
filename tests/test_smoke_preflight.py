"""Backend preflight: doctor's probe captures read by the shared parsers
(real macOS captures), and jaccl/nccl reported unavailable (not crashing) on
this Linux machine, where the real probe runs."""

from __future__ import annotations

import json
import platform
import sys

import pytest

from mlxcluster.errors import InputError
from mlxcluster.facts.capture import PROBE, SW_VERS, HostCapture
from mlxcluster.jobs import hosts
from mlxcluster.jobs.hosts import HostResult, RankHost, local_hosts
from mlxcluster.smoke import preflight
from mlxcluster.smoke.preflight import (
    HostFacts,
    jaccl_problems,
    macos_version,
    rdma_devices,
    tb_link_gbps,
)
from tests.topology_helpers import OSAURUS


def read(fixtures, name):
    return (fixtures / name).read_text(encoding="utf-8", errors="replace")


def test_sw_vers_tabs_single_and_double(macos_fixtures):
    assert macos_version(read(macos_fixtures, "sw_vers_macos26.4_25E246_m2_macbook_air_double_tab.txt")) == (26, 4)
    assert macos_version(read(macos_fixtures, "sw_vers_macos12.6_21G115_m1pro_single_tab.txt")) == (12, 6)
    assert macos_version(read(macos_fixtures, "sw_vers_macos26.6.2_25G83.txt")) == (26, 6, 2)
    assert macos_version("") is None


def test_ibv_devices_lists_rdma_devices(macos_fixtures):
    assert rdma_devices(read(macos_fixtures, "ibv_devices_apple_tn3205_m4pro_mini_3ports.txt")) == (
        "rdma_en2", "rdma_en3", "rdma_en4")
    assert rdma_devices(read(macos_fixtures, "ibv_devices_osaurus_m5max_mbp_peer_macos27.txt")) == (
        "rdma_en1", "rdma_en6", "rdma_en2")
    assert rdma_devices(read(macos_fixtures, "ibv_devices_osaurus_rdma_disabled_header_only.txt")) == ()


def test_tb_link_speed_ignores_port_ratings(macos_fixtures):
    tb5 = read(macos_fixtures, "sp_thunderbolt_omlx_m5max_macbookpro_tb5_to_studio.json")
    assert tb_link_gbps(tb5) == 80.0  # not the "Up to 120 Gb/s" rating
    vm = read(macos_fixtures, "sp_thunderbolt_macos_vm_no_hardware_EXCERPT.json")
    assert tb_link_gbps(vm) is None
    assert tb_link_gbps("not json") is None


def test_jaccl_problems_name_each_host_and_reason(macos_fixtures):
    tb5 = tb_link_gbps(read(macos_fixtures, "sp_thunderbolt_omlx_m5max_macbookpro_tb5_to_studio.json"))
    devices = rdma_devices(read(macos_fixtures, "ibv_devices_apple_tn3205_m4pro_mini_3ports.txt"))
    good = HostFacts("mac1", "Darwin", (26, 4), devices, tb5)
    assert jaccl_problems([good]) == []
    problems = jaccl_problems([
        good,
        HostFacts("box", "Linux", None, (), None),
        HostFacts("old", "Darwin", (26, 1), devices, tb5),
        HostFacts("off", "Darwin", (27, 0), (), tb5),
        HostFacts("tb4", "Darwin", (26, 4), devices, 40.0),
    ])
    assert problems == [
        "box runs Linux, not macOS",
        "old runs macOS 26.1, JACCL needs 26.2 or later",
        "off lists no rdma devices (enable RDMA: rdma_ctl enable in Recovery)",
        "tb4 has 40 Gb/s; JACCL needs Thunderbolt 5 (> 40 Gb/s)",
    ]


def mac_capture(fixtures, name, files, system="Darwin") -> HostCapture:
    """A host's capture as doctor's probe returns it: probe.json and the raw outputs."""
    probe = json.dumps({"os": {"system": system}, "platform": "darwin"})
    return HostCapture(name, {PROBE: probe, **{f: read(fixtures, fixture) for f, fixture in files.items()}})


def test_the_facts_come_from_doctors_probe_capture(macos_fixtures):
    """The same capture doctor reads (raw sw_vers, ibv_devices, system_profiler)."""
    peer = mac_capture(macos_fixtures, "peer", {**OSAURUS["peer"], SW_VERS: "sw_vers_macos26.6.2_25G83.txt"})
    assert preflight.facts_from_capture(peer) == HostFacts(
        "peer", "Darwin", (26, 6, 2), ("rdma_en1", "rdma_en6", "rdma_en2"), 80.0)
    linux = HostCapture("box", {PROBE: json.dumps({"os": {"system": "Linux"}, "platform": "linux"})})
    assert preflight.facts_from_capture(linux) == HostFacts("box", "Linux", None, (), None)


def test_jaccl_is_unavailable_naming_each_host_from_real_captures(macos_fixtures):
    """--hostfile / --local: one probe per host (injected here with real
    captures of a Mac pair whose 'local' has RDMA off); the reason names the host."""
    captures = {
        "10.0.0.1": mac_capture(macos_fixtures, "local", {**OSAURUS["local"],
                                                          SW_VERS: "sw_vers_macos26.6.2_25G83.txt"}),
        "10.0.0.2": mac_capture(macos_fixtures, "peer", {**OSAURUS["peer"],
                                                         SW_VERS: "sw_vers_macos26.6.2_25G83.txt"}),
    }
    pair = tuple(RankHost(c.name, ssh, (ssh,), "/py") for ssh, c in captures.items())
    probed = []

    def probe(host):
        probed.append(host.ssh)
        return captures[host.ssh]

    reason = preflight.unavailable_reason("jaccl", pair + pair[:1], probe=probe)
    assert sorted(probed) == ["10.0.0.1", "10.0.0.2"]  # one probe per host, not per rank
    assert reason == "local lists no rdma devices (enable RDMA: rdma_ctl enable in Recovery)"
    both_on = {ssh: captures["10.0.0.2"] for ssh in captures}
    assert preflight.unavailable_reason("jaccl", pair, probe=lambda h: both_on[h.ssh]) is None
    gone = preflight.unavailable_reason(
        "jaccl", pair, probe=lambda h: HostCapture(h.name, error="no answer within 60 s"))
    assert gone == "cannot ask local (no answer within 60 s), peer (no answer within 60 s)"


def test_this_machine_cannot_run_jaccl_or_nccl():
    hosts = local_hosts(2)
    jaccl = preflight.unavailable_reason("jaccl", hosts)
    assert jaccl == f"local-0 runs {platform.system()}, not macOS"
    nccl = preflight.unavailable_reason("nccl", hosts)
    assert nccl == "local-0 has no CUDA (NCCL runs on NVIDIA GPUs only)"
    assert preflight.unavailable_reason("ring", hosts) is None
    assert preflight.unavailable_reason("mpi", hosts) is None


def test_local_ranks_need_a_python_that_exists_here():
    """--local 2 --python /nonexistent/python launched, and its ranks 'exited
    with code 127'; now it is bad input. Remote hosts are asked over ssh later."""
    hosts.require_local_pythons(local_hosts(2, sys.executable))
    hosts.require_python_here("sh")  # a name on PATH is fine
    with pytest.raises(InputError, match="python not found: /nonexistent/python"):
        hosts.require_local_pythons(local_hosts(2, "/nonexistent/python"))
    remote = RankHost("mac1", "mac1.local", ("10.0.0.1",), "/nonexistent/python")
    hosts.require_local_pythons([remote])


FISH_REFUSAL = ("its login shell /opt/homebrew/bin/fish cannot parse the command line mlx.launch "
                "sends over ssh (the launch would hang, or that rank exit 2): chsh -s /bin/zsh "
                "(macOS) or chsh -s /bin/bash (Linux) there")


def shell_answers(answers: dict[str, HostResult]):
    """A runner answering preflight.SHELL_QUESTION per ssh target, recording what it was asked."""
    asked = []

    def run(host, script):
        asked.append((host.ssh, script))
        return answers[host.ssh]

    return run, asked


def test_a_login_shell_that_cannot_parse_the_launch_is_named_before_launching():
    mac1, mac2 = (RankHost(f"mac{i}", f"mac{i}.local", (f"mac{i}.local",), "/py") for i in (1, 2))
    ranks = (*local_hosts(1), mac1, mac2, mac2)
    run, asked = shell_answers({"mac1.local": HostResult("mac1", True, "/bin/zsh\nDarwin\n"),
                                "mac2.local": HostResult("mac2", True,
                                                         "/opt/homebrew/bin/fish\nDarwin\n")})
    assert preflight.unavailable_reason("ring", ranks, run=run) == f"mac2: {FISH_REFUSAL}"
    # once per remote host; local ranks start without ssh, so their shell is not asked
    assert sorted(asked) == [("mac1.local", preflight.SHELL_QUESTION),
                             ("mac2.local", preflight.SHELL_QUESTION)]
    assert "mpirun sends" in preflight.unavailable_reason("mpi", ranks, run=run)
    asked.clear()
    assert preflight.unavailable_reason("ring", ranks, run=run, shells=False) is None
    assert asked == []  # train and run asked already, in their own probe


@pytest.mark.parametrize("answer,backend,refused", [
    ("/bin/sh\nLinux\n", "ring", True),       # dash: mlx.launch's bash text, that rank exits 2
    ("/bin/sh\nLinux\n", "mpi", False),       # ... but mpirun's POSIX sh is fine
    ("/bin/sh\nDarwin\n", "ring", False),     # macOS's sh is bash
    ("/usr/bin/fish\nLinux\n", "mpi", True),
    ("/bin/zsh\nDarwin\n", "ring", False),
    ("/usr/local/bin/myshell\nDarwin\n", "ring", False),  # unknown: not refused
    ("Unknown command: echo\n", "ring", False),           # no answer to read: left to the launch
])
def test_what_a_login_shell_answer_refuses(answer, backend, refused):
    assert (preflight.shell_refusal(answer, backend) is not None) == refused


def test_a_host_that_does_not_answer_is_left_to_the_launch():
    mac = RankHost("mac1", "mac1.local", ("mac1.local",), "/py")
    run, _ = shell_answers({"mac1.local": HostResult("mac1", False, "", "timed out after 30 s")})
    assert preflight.unavailable_reason("ring", (mac, mac), run=run) is None
