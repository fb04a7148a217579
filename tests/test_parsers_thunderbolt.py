"""The Thunderbolt parser on every real SPThunderboltDataType capture."""

from __future__ import annotations

from mlxcluster.facts.parsers.thunderbolt import parse_speed, parse_thunderbolt


def load(fixtures, name):
    return parse_thunderbolt((fixtures / name).read_text(encoding="utf-8"))


def by_receptacle(report):
    return {b.receptacle: b for b in report.buses}


def test_speed_strings_split_link_from_capability():
    assert parse_speed("80 Gb/s") == (80.0, None)
    assert parse_speed("Up to 120 Gb/s") == (None, 120.0)
    assert parse_speed("Up to 40 Gb/s x1") == (None, 40.0)
    assert parse_speed("fast") == (None, None)
    assert parse_speed(None) == (None, None)


def test_omlx_macbook_pro_tb5_to_studio(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_omlx_m5max_macbookpro_tb5_to_studio.json")
    assert r.state == "ok"
    assert [b.bus for b in r.buses] == [2, 1, 0]  # listed out of order
    ports = by_receptacle(r)
    assert ports[1].connected and ports[1].speed_gbps == 80.0
    assert ports[1].uuid == "817DCFA4-B481-4100-80FC-91C7AA969F0B"
    (studio,) = ports[1].devices
    assert (studio.name, studio.model, studio.uuid) == (
        "Mac Studio", "Mac15,14", "28CA4C30-A263-4C55-B302-953416D0B209")
    assert studio.is_mac
    # "Up to 120 Gb/s" on an empty port is a capability, not a link.
    assert not ports[2].connected and ports[2].speed_gbps is None
    assert ports[2].max_speed_gbps == 120.0
    assert ports[1].host_name == "MacBook Pro"


def test_omlx_studio_with_owc_drive(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_omlx_m3ultra_studio_tb5_to_macbookpro_plus_owc_drive.json")
    ports = by_receptacle(r)
    assert sorted(ports) == [1, 2, 3, 4, 5, 6]
    assert [p for p, b in sorted(ports.items()) if b.connected] == [2, 4]
    drive = ports[4].devices[0]
    assert (drive.name, drive.vendor, drive.uuid, drive.speed_gbps) == (
        "Envoy Ultra", "Other World Computing", None, 80.0)
    mbp = ports[2].devices[0]
    assert (mbp.name, mbp.model, mbp.uuid) == (
        "MacBook Pro", "Mac17,7", "817DCFA4-B481-4100-80FC-91C7AA969F0B")
    assert ports[2].uuid == "28CA4C30-A263-4C55-B302-953416D0B209"


def test_osaurus_local_with_sabrent_dock(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_osaurus_m5max_mbp_local_macos27_rdma_off.json")
    ports = by_receptacle(r)
    dock = ports[3].devices[0]
    assert (dock.name, dock.vendor, dock.is_mac, dock.speed_gbps) == ("SB-XTM5", "Sabrent", False, 80.0)
    assert ports[3].connected and ports[3].speed_gbps == 80.0  # link status 0x4, still linked
    peer = ports[2].devices[0]
    assert (peer.model, peer.uuid) == ("Mac17,6", "00000003-0000-4000-8000-000000000003")
    assert not ports[1].connected


def test_osaurus_peer_with_tb3_enclosure(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_osaurus_m5max_mbp_peer_macos27_rdma_on.json")
    ports = by_receptacle(r)
    assert ports[3].speed_gbps == 40.0 and ports[3].devices[0].vendor == "ACASIS"
    assert ports[2].devices[0].uuid == "00000004-0000-4000-8000-000000000004"
    assert ports[2].uuid == "00000003-0000-4000-8000-000000000003"


def test_maccluster_json_and_text_agree(macos_fixtures):
    j = load(macos_fixtures, "sp_thunderbolt_maccluster_m4pro_mini_macos27_mbp_and_studio_display.json")
    t = load(macos_fixtures, "sp_thunderbolt_text_maccluster_m4pro_mini_macos27_mbp_and_studio_display.txt")
    assert j == t
    ports = by_receptacle(j)
    assert ports[3].speed_gbps == 20.0 and ports[3].devices[0].name == "Studio Display"
    assert ports[3].devices[0].uuid is None
    mbp = ports[2].devices[0]
    assert (mbp.name, mbp.model, mbp.uuid) == (
        "MacBook Pro", "Mac17,6", "BC5DEC53-7E36-4A9A-8459-456EBAB5E58A")
    assert ports[2].speed_gbps == 40.0
    assert ports[1].max_speed_gbps == 120.0 and not ports[1].connected


def test_vm_reports_no_hardware(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_macos_vm_no_hardware_EXCERPT.json")
    assert r.state == "no_hardware" and r.buses == ()


def test_text_exo_truncated_capture(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_exo_issue1390_m4pro_mini_to_m4max_studio_rdma_service_TRUNCATED.txt")
    assert [b.bus for b in r.buses] == [2, 1]
    bus2, bus1 = r.buses
    assert bus2.receptacle == 3 and bus2.speed_gbps == 80.0
    studio = bus2.devices[0]
    assert (studio.name, studio.model, studio.uuid) == (
        "Mac Studio", "Mac16,9", "88F10ACA-5CAA-4F5D-8361-03EED54ACB5A")
    # Cut off after "Port:": what is missing is unknown, not invented.
    assert bus1.receptacle is None and not bus1.connected and bus1.speed_gbps is None
    assert bus1.uuid == "0A3248FD-13DA-4F5B-9167-7C469F35421C"


def test_text_m1pro_x1_speed_form(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_m1pro_mbp16_2021_older_macos_link_width_x1.txt")
    assert [(b.receptacle, b.connected, b.max_speed_gbps) for b in r.buses] == [
        (3, False, 40.0), (2, False, 40.0), (1, False, 40.0)]


def test_text_m4_base_ios_name_and_bus_gap(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_m4_base_t8132_device_name_iOS_bus2_missing.txt")
    assert [b.bus for b in r.buses] == [3, 1, 0]
    assert [b.receptacle for b in r.buses] == [4, 2, 1]
    assert {b.host_name for b in r.buses} == {"iOS"}


def test_text_studio_docks_blank_lines_stripped(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_m4max_studio_macos26.6.2_docks_blanklines_stripped.txt")
    ports = by_receptacle(r)
    assert ports[4].devices[0].name == "PRO-G40" and ports[4].speed_gbps == 40.0
    ts5 = ports[2].devices[0]
    assert (ts5.name, ts5.vendor, ts5.speed_gbps, ts5.children) == ("TS5 Plus", "CalDigit, Inc.", 80.0, ())
    assert not ports[3].connected
    assert all(not d.is_mac for b in r.buses for d in b.devices)


def test_text_mbp_to_two_minis(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_maccluster_mbp_to_two_m4pro_minis_macos27_abridged.txt")
    ports = by_receptacle(r)
    assert ports[3].devices[0].uuid == "E4CCB4B9-724D-4728-ADE2-F356148F8F79"
    assert ports[2].devices[0].uuid == "E9F38DFF-9A9A-4A0A-8D9C-02C3325633C0"
    assert ports[2].devices[0].model == "Mac16,11"
    assert ports[2].speed_gbps == ports[3].speed_gbps == 40.0


def test_text_mini_no_devices(macos_fixtures):
    r = load(macos_fixtures, "sp_thunderbolt_text_maccluster_m4pro_mini_no_devices.txt")
    assert [b.uuid for b in r.buses] == [
        "3D589BC7-F32A-4054-BE1A-F8253AD4FE51",
        "E5C15E80-C140-4B6D-89CC-8A9846961AC7",
        "2877CCA3-0C34-4652-B0B9-A00BE06237EE",
    ]
    assert not any(b.connected for b in r.buses)


def test_mac_behind_dock_is_nested():
    # No real capture has a Mac behind a dock; the nesting follows the real
    # dock shape above (a Mac has domain_uuid_key).
    text = """{"SPThunderboltDataType": [{"_name": "thunderboltusb4_bus_0",
      "device_name_key": "Mac mini", "domain_uuid_key": "AAAA",
      "receptacle_1_tag": {"current_speed_key": "40 Gb/s", "receptacle_id_key": "1",
                           "receptacle_status_key": "receptacle_connected"},
      "_items": [{"_name": "TS4", "vendor_name_key": "CalDigit",
        "_items": [{"_name": "Mac Studio", "device_name_key": "Mac16,9", "domain_uuid_key": "BBBB"}]}]}]}"""
    (bus,) = parse_thunderbolt(text).buses
    dock = bus.devices[0]
    assert dock.name == "TS4" and not dock.is_mac
    assert dock.children[0].uuid == "BBBB"


def test_unknown_shapes_degrade():
    assert parse_thunderbolt("").state == "unknown"
    assert parse_thunderbolt("{not json").state == "unknown"
    assert parse_thunderbolt('{"SPThunderboltDataType": 3}').state == "unknown"
    assert parse_thunderbolt('{"SPThunderboltDataType": [1, {"_name": "x"}]}').buses == ()


def test_mac_without_uuid_is_known_by_model_id():
    text = """{"SPThunderboltDataType": [{"_name": "thunderboltusb4_bus_0", "domain_uuid_key": "A",
      "receptacle_1_tag": {"receptacle_id_key": "1", "receptacle_status_key": "receptacle_connected"},
      "_items": [{"_name": "MacBook Pro", "device_name_key": "Mac17,6"},
                 {"_name": "Envoy", "device_name_key": "Envoy Ultra"}]}]}"""
    (bus,) = parse_thunderbolt(text).buses
    assert [d.is_mac for d in bus.devices] == [True, False]
    assert bus.connected and bus.speed_gbps is None  # no speed key: unknown, not 0


def test_text_mac_behind_dock_is_nested():
    text = """Thunderbolt/USB4:
    Thunderbolt/USB4 Bus 0:
      Device Name: Mac mini
      Domain UUID: AAAA
      Port:
          Status: Device connected
          Speed: 40 Gb/s
          Receptacle: 1
        TS4:
          Vendor Name: CalDigit
          Device Name: TS4
          Port (Upstream):
              Speed: 40 Gb/s
          Port:
              Status: Device connected
            Mac Studio:
              Device Name: Mac16,9
              Domain UUID: BBBB
"""
    (bus,) = parse_thunderbolt(text).buses
    (dock,) = bus.devices
    assert (dock.name, dock.speed_gbps, dock.is_mac) == ("TS4", 40.0, False)
    assert [(c.name, c.model, c.uuid) for c in dock.children] == [("Mac Studio", "Mac16,9", "BBBB")]
