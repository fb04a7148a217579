"""Topology from capture dirs assembled out of real captures of cabled Macs."""

from __future__ import annotations

import json

from mlxcluster.facts.capture import HostCapture, load_capture_dir
from mlxcluster.topology.topology import Link, build_topology, find_ring, is_full_mesh
from tests.topology_helpers import (
    MACCLUSTER,
    OMLX,
    OSAURUS,
    drop_peer_uuids,
    make_capture_dir,
)


def topo(fixtures, tmp_path, layout, edit=None):
    return build_topology(load_capture_dir(make_capture_dir(fixtures, tmp_path / "cap", layout, edit)))


def test_omlx_pair_matched_by_uuid(macos_fixtures, tmp_path):
    t = topo(macos_fixtures, tmp_path, OMLX)
    assert [lk.to_json() for lk in t.links] == [{
        "a": "mbp", "a_interface": "en1", "b": "studio", "b_interface": "en3",
        "speed_gbps": 80.0, "matched_by": "uuid"}]
    assert t.ring == ("mbp", "studio") and t.full_mesh
    assert t.matrix() == [[0, 1], [1, 0]]
    studio = t.to_json()["hosts"]["studio"]
    assert [p["receptacle"] for p in studio["ports"]] == [1, 2, 3, 4, 5, 6]
    port4 = studio["ports"][3]
    assert port4 == {"receptacle": 4, "interface": "en5", "connected": True, "speed_gbps": 80.0,
                     "peer": None, "via": [], "devices": ["Envoy Ultra"],
                     "ipv4": None, "rdma_active": None}  # no ifconfig, no ibv_devinfo captured
    # That networksetup capture lists Thunderbolt 1-4 only: 5 and 6 stay unknown.
    assert studio["ports"][4]["interface"] is None
    assert studio["rdma_devices"] == ["rdma_en2", "rdma_en3", "rdma_en4"]
    assert studio["bridge_holds_thunderbolt"] is None  # no ifconfig captured
    mbp_port = t.to_json()["hosts"]["mbp"]["ports"][0]
    assert mbp_port["peer"] == {"name": "Mac Studio", "model": "Mac15,14",
                                "uuid": "28CA4C30-A263-4C55-B302-953416D0B209"}


def test_osaurus_pair_ignores_docks_and_enclosures(macos_fixtures, tmp_path):
    t = topo(macos_fixtures, tmp_path, OSAURUS)
    assert [(lk.a, lk.a_interface, lk.b, lk.b_interface, lk.speed_gbps, lk.matched_by)
            for lk in t.links] == [("local", "en6", "peer", "en6", 80.0, "uuid")]
    local = t.hosts["local"]
    assert local.ports[2].devices == ("SB-XTM5",) and local.ports[2].peer is None
    assert t.hosts["peer"].ports[2].devices == ("TBU405Pro",)
    assert local.rdma_devices == () and t.hosts["peer"].rdma_devices == ("rdma_en1", "rdma_en2", "rdma_en6")


def test_link_inferred_when_uuids_absent(macos_fixtures, tmp_path):
    t = topo(macos_fixtures, tmp_path, OSAURUS, edit=drop_peer_uuids)
    assert [(lk.a_interface, lk.b_interface, lk.speed_gbps, lk.matched_by) for lk in t.links] == [
        ("en6", "en6", 80.0, "inferred")]
    assert t.ring == ("local", "peer")


def test_ties_are_never_guessed(macos_fixtures, tmp_path):
    # The MBP has two 40 Gb/s cables to "Mac mini"s; the mini sees a MacBook Pro
    # at 40 Gb/s. Either MBP port could be it: no link is invented.
    t = topo(macos_fixtures, tmp_path, MACCLUSTER)
    assert t.links == ()
    assert t.ring is None and not t.full_mesh
    assert t.matrix() == [[0, 0], [0, 0]]
    mbp = t.hosts["mbp"]
    assert [(p.receptacle, p.interface, p.peer.model if p.peer else None) for p in mbp.ports] == [
        (1, "en1", None), (2, "en2", "Mac16,11"), (3, "en3", "Mac16,11")]
    assert mbp.bridge_holds_thunderbolt is True and mbp.bridge_members == ("en1", "en2", "en3")
    assert t.hosts["mini"].bridge_holds_thunderbolt is False


def test_peer_behind_dock_lists_via(tmp_path):
    def tb(uuid, peer_uuid, dock):
        mac = {"_name": "Mac mini", "device_name_key": "Mac16,11", "domain_uuid_key": peer_uuid}
        item = {"_name": dock, "vendor_name_key": "CalDigit", "_items": [mac],
                "receptacle_upstream_ambiguous_tag": {"current_speed_key": "40 Gb/s"}} if dock else mac
        bus = {"_name": "thunderboltusb4_bus_0", "device_name_key": "Mac mini",
               "domain_uuid_key": uuid, "_items": [item],
               "receptacle_1_tag": {"current_speed_key": "80 Gb/s", "receptacle_id_key": "1",
                                    "receptacle_status_key": "receptacle_connected"}}
        return json.dumps({"SPThunderboltDataType": [bus]})
    ports = "Hardware Port: Thunderbolt 1\nDevice: en3\n"
    caps = {
        "a": HostCapture("a", {"system_profiler_SPThunderboltDataType.json": tb("UA", "UB", "TS4"),
                               "networksetup_listallhardwareports.txt": ports}),
        "b": HostCapture("b", {"system_profiler_SPThunderboltDataType.json": tb("UB", "UA", None),
                               "networksetup_listallhardwareports.txt": ports}),
    }
    t = build_topology(caps)
    port = t.hosts["a"].ports[0]
    assert port.via == ("TS4",) and port.devices == ("TS4",) and port.peer.uuid == "UB"
    assert port.speed_gbps == 40.0  # the dock's 40 Gb/s hop limits the cable
    assert [(lk.a, lk.b, lk.speed_gbps, lk.matched_by) for lk in t.links] == [("a", "b", 40.0, "uuid")]


def L(a, b, speed=80.0):
    return Link(a, "en1", b, "en2", speed, "uuid")


def test_ring_prefers_fast_hops_and_mesh_detection():
    names = ["a", "b", "c", "d"]
    square = (L("a", "b"), L("b", "c"), L("c", "d"), L("a", "d"))
    assert find_ring(names, square) == ("a", "b", "c", "d") and not is_full_mesh(names, square)
    # With the diagonals the slow a-b cable is avoided.
    mesh = (L("a", "b", 40.0), L("b", "c"), L("c", "d"), L("a", "d"), L("a", "c"), L("b", "d"))
    assert find_ring(names, mesh) == ("a", "c", "b", "d") and is_full_mesh(names, mesh)
    assert find_ring(names, square[:3]) is None
    assert find_ring(["x"], ()) == ("x",)


def test_ring_search_is_fast_on_big_meshes():
    import itertools
    import time
    names = [f"h{i:02d}" for i in range(16)]
    mesh = tuple(L(a, b) for a, b in itertools.combinations(names, 2))
    start = time.monotonic()
    assert find_ring(names, mesh) == tuple(names)
    assert time.monotonic() - start < 1.0
    # One slow cable in a 16-host mesh is routed around.
    slow = tuple(L(a, b, 40.0 if (a, b) == ("h00", "h01") else 80.0)
                 for a, b in itertools.combinations(names, 2))
    ring = find_ring(names, slow)
    hops = set(zip(ring, ring[1:] + ring[:1], strict=True))
    assert ("h00", "h01") not in hops and ("h01", "h00") not in hops
