"""The memory parsers on real captured outputs (tests/fixtures/macos/SOURCES.md):
sysctl's RAM and GPU wired limit on Macs, /proc/meminfo on Linux, and the
facts they become."""

from __future__ import annotations

import json

from mlxcluster.facts.capture import MEMINFO, PROBE, SYSCTL_MEMORY, HostCapture
from mlxcluster.facts.facts import host_facts
from mlxcluster.facts.parsers.memory import MacMemory, parse_mac_memory, parse_meminfo, parse_sysctl
from tests.memory_support import MEMINFO_FILE, MINI_MEMSIZE, MINI_WIRED, SET_LOG, STUDIO_WIRED


def read(fixtures, name):
    return (fixtures / name).read_text(encoding="utf-8")


def test_a_mac_at_the_default_limit_says_0_beside_its_ram(macos_fixtures):
    # What the probe's one command prints on this Mac: both lines, as sysctl gives them.
    text = read(macos_fixtures, MINI_MEMSIZE) + read(macos_fixtures, MINI_WIRED)
    assert parse_mac_memory(text) == MacMemory(memory_bytes=34359738368, wired_limit_mb=0)
    assert parse_sysctl(text)["hw.model"] == "Mac14,12"


def test_a_raised_limit_is_read_beside_other_iogpu_values(macos_fixtures):
    values = parse_sysctl(read(macos_fixtures, STUDIO_WIRED))
    assert values == {"iogpu.wired_limit_mb": "118000", "iogpu.dynamic_lwm": "1"}
    assert parse_mac_memory(read(macos_fixtures, STUDIO_WIRED)) == MacMemory(None, 118000)


def test_what_setting_prints_reads_as_the_new_value(macos_fixtures):
    text = read(macos_fixtures, SET_LOG)
    assert parse_mac_memory(text).wired_limit_mb == 114688
    assert parse_mac_memory(text.splitlines()[1]).wired_limit_mb == 114688  # "0 -> 114688"


def test_an_older_macos_without_the_oid_or_garbage_is_unknown():
    # sysctl writes an unknown name's error to stderr: stdout holds hw.memsize alone.
    assert parse_mac_memory("hw.memsize: 17179869184\n") == MacMemory(17179869184, None)
    assert parse_mac_memory("iogpu.wired_limit_mb: lots\n") == MacMemory(None, None)
    assert parse_mac_memory(None) == MacMemory(None, None)


def test_meminfo_total_and_available_in_bytes(macos_fixtures):
    m = parse_meminfo(read(macos_fixtures, MEMINFO_FILE))
    assert m.total_bytes == 24684084 * 1024 and m.available_bytes == 23968660 * 1024
    assert parse_meminfo("MemTotal: 100 kB\n").available_bytes is None


def test_facts_carry_the_memory_of_a_mac_and_of_a_linux_host(macos_fixtures):
    probe = {"hostname": "mini", "platform": "darwin",
             "mlx": {"import_ok": True, "version": "0.32.2",
                     "gpu": {"max_recommended_working_set_size": 22906503168, "memory_size": 34359738368}},
             "trainer_modules": {"mlx_lm": {"distribution": "mlx-lm", "found": True, "version": "0.31.3"}}}
    mac = host_facts(HostCapture("mini", {
        PROBE: json.dumps(probe),
        SYSCTL_MEMORY: read(macos_fixtures, MINI_MEMSIZE) + read(macos_fixtures, MINI_WIRED)}))
    assert (mac.memory_bytes, mac.gpu_wired_limit_mb, mac.gpu_working_set_bytes) == (34359738368, 0, 22906503168)
    assert mac.mlx_lm_version == "0.31.3" and mac.memory_available_bytes is None
    linux = host_facts(HostCapture("box", {PROBE: json.dumps({"platform": "linux"}),
                                           MEMINFO: read(macos_fixtures, MEMINFO_FILE)}))
    assert linux.memory_available_bytes == 23968660 * 1024 and linux.gpu_wired_limit_mb is None
    # A replayed capture without probe.json still says the Mac's limit.
    assert host_facts(HostCapture("old", {SYSCTL_MEMORY: "iogpu.wired_limit_mb: 0\n"})).gpu_wired_limit_mb == 0


def test_a_wrong_typed_working_set_is_a_problem_not_a_crash():
    probe = {"mlx": {"gpu": {"max_recommended_working_set_size": "big"}}}
    f = host_facts(HostCapture("m", {PROBE: json.dumps(probe)}))
    assert f.gpu_working_set_bytes is None and any("max_recommended_working_set_size" in p for p in f.problems)
