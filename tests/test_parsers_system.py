"""sw_vers and SPHardwareDataType parsers on every real capture, plus a
fuzz pass: truncated or garbled captures never make any parser raise."""

from __future__ import annotations

import random

from mlxcluster.facts.parsers.hardware import parse_hardware
from mlxcluster.facts.parsers.hardware_ports import parse_hardware_ports, thunderbolt_interfaces
from mlxcluster.facts.parsers.ibv import parse_ibv_devices, parse_ibv_devinfo
from mlxcluster.facts.parsers.ifconfig import parse_ifconfig
from mlxcluster.facts.parsers.rdma_ctl import parse_rdma_ctl_status
from mlxcluster.facts.parsers.routes import parse_routes
from mlxcluster.facts.parsers.sw_vers import MacOSVersion, parse_sw_vers
from mlxcluster.facts.parsers.thunderbolt import parse_thunderbolt


def read(fixtures, name):
    return (fixtures / name).read_text(encoding="utf-8")


def test_sw_vers_single_and_double_tab(macos_fixtures):
    cases = {
        "sw_vers_macos12.6_21G115_m1pro_single_tab.txt": ("12.6", "21G115", (12, 6)),
        "sw_vers_macos26.4_25E246_m2_macbook_air_double_tab.txt": ("26.4", "25E246", (26, 4)),
        "sw_vers_macos26.6.2_25G83.txt": ("26.6.2", "25G83", (26, 6, 2)),
    }
    for name, (version, build, tup) in cases.items():
        v = parse_sw_vers(read(macos_fixtures, name))
        assert (v.product, v.version, v.build, v.version_tuple) == ("macOS", version, build, tup)
        assert not v.is_beta


def test_sw_vers_beta_and_garbage():
    assert MacOSVersion("macOS", "26.3", "25D5087f").is_beta
    assert parse_sw_vers("junk") == MacOSVersion(None, None, None)
    assert parse_sw_vers(None).version_tuple == ()


def test_hardware_json(macos_fixtures):
    m4 = parse_hardware(read(macos_fixtures, "sp_hardware_cnquery_m4max_mbp_mac16_5.json"))
    assert (m4.model_name, m4.model_id, m4.chip, m4.memory_gb, m4.cores) == (
        "MacBook Pro", "Mac16,5", "Apple M4 Max", 48.0, 16)
    assert m4.uuid == "6D9530A4-90A2-5A28-B133-3D6011CC7772"
    m2 = parse_hardware(read(macos_fixtures, "sp_hardware_m2_mbp14_mac14_7_blog_capture.json"))
    assert (m2.model_id, m2.chip, m2.memory_gb, m2.cores, m2.serial) == (
        "Mac14,7", "Apple M2", 16.0, 8, "D5XQV1FMFJ")


def test_hardware_number_processors_int():
    text = '{"SPHardwareDataType": [{"machine_model": "MacPro7,1", "number_processors": 28}]}'
    assert parse_hardware(text).cores == 28


def test_hardware_text(macos_fixtures):
    air = parse_hardware(read(macos_fixtures, "sp_hardware_text_glpi_macbookair10_1_m1_macos11.2.3_excerpt.txt"))
    assert (air.model_name, air.model_id, air.chip, air.memory_gb, air.cores) == (
        "MacBook Air", "MacBookAir10,1", "Apple M1", 16.0, 8)
    assert air.uuid == "2B05150B-FA33-45BD-90F0-3369BF908E3E"
    m2 = parse_hardware(read(macos_fixtures, "sp_hardware_text_m2_macbook_air_macos26.4_serials_removed.txt"))
    assert (m2.model_id, m2.memory_gb, m2.serial, m2.uuid) == ("Mac14,2", 8.0, None, None)


PARSERS = {
    "sp_thunderbolt": parse_thunderbolt,
    "sp_hardware": parse_hardware,
    "networksetup": lambda t: thunderbolt_interfaces(parse_hardware_ports(t)),
    "ifconfig": parse_ifconfig,
    "ibv_devices": parse_ibv_devices,
    "ibv_devinfo": parse_ibv_devinfo,
    "sw_vers": parse_sw_vers,
    "rdma_ctl_status": parse_rdma_ctl_status,
    "netstat_rn": parse_routes,
    "ip_route": parse_routes,
}


def test_truncated_or_garbled_input_never_raises(macos_fixtures):
    rng = random.Random(4)
    checked = 0
    for path in sorted(macos_fixtures.iterdir()):
        parse = next((p for prefix, p in PARSERS.items() if path.name.startswith(prefix)), None)
        if parse is None:
            continue
        text = path.read_text(encoding="utf-8")
        variants = [text[:cut] for cut in range(0, len(text), max(1, len(text) // 25))]
        for _ in range(15):
            chars = list(text)
            for _ in range(max(1, len(chars) // 40)):
                chars[rng.randrange(len(chars))] = rng.choice(' \t\n:{}[]",0xˇ')
            variants.append("".join(chars))
        variants += [text.replace("\n", "\r\n"), text.replace("\t", "    "), "\x00" * 10]
        for variant in variants:
            parse(variant)
            checked += 1
    assert checked > 500


WRONG_TYPES = (5, None, "x", [], {}, [1], True, -1.5, {"_items": 5}, ["x", {}])


def _paths(node, path=()):
    """Every (path) to a value inside a JSON document, the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield path + (key,)
        yield from _paths(child, path + (key,))


def _replaced(doc, path, value):
    import copy

    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def test_wrong_json_types_anywhere_never_raise(macos_fixtures):
    """Every value of every real system_profiler -json capture replaced by each
    wrong type (a number for a list, a list for an object...): the parsers and
    the topology built from them never raise (``_items: 5`` used to)."""
    import json

    from mlxcluster.facts import capture as C
    from mlxcluster.topology.topology import build_topology

    checked = 0
    for path in sorted(macos_fixtures.glob("sp_*.json")):
        parse = PARSERS["sp_thunderbolt" if path.name.startswith("sp_thunderbolt") else "sp_hardware"]
        doc = json.loads(path.read_text(encoding="utf-8"))
        key = C.THUNDERBOLT if parse is parse_thunderbolt else C.HARDWARE
        for where in _paths(doc):
            for value in WRONG_TYPES:
                text = json.dumps(_replaced(doc, where, value))
                parse(text)
                build_topology({"a": C.HostCapture("a", {key: text})})
                checked += 1
    assert checked > 2000


def test_json_nested_too_deep_to_decode_degrades():
    deep = '{"SPThunderboltDataType": ' + "[" * 100_000
    assert parse_thunderbolt(deep).state == "unknown"
    assert parse_hardware(deep.replace("Thunderbolt", "Hardware")).chip is None
