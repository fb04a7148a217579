"""hostfile generate --backend jaccl prefers PORT_ACTIVE devices (ibv_devinfo)
and says which it skipped or had to keep."""

from __future__ import annotations

import copy

from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.hostfile.hostfile_generate import generate_mlx_hostfile, rdma_port_notes
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.topology.topology import HostTopology, Link, Topology, build_topology
from tests.topology_helpers import OSAURUS, make_capture_dir

PAIR = """cluster: t
python: /usr/bin/python3
hosts:
  - {name: local, ssh: local.lan, ips: [10.0.0.1]}
  - {name: peer, ssh: peer.lan, ips: [10.0.0.2]}
"""
TRIO = """cluster: t
python: /usr/bin/python3
hosts:
  - {name: a, ssh: a, ips: [10.0.0.1]}
  - {name: b, ssh: b, ips: [10.0.0.2]}
  - {name: c, ssh: c, ips: [10.0.0.3]}
"""


def osaurus_with_devinfo(fixtures, root):
    layout = copy.deepcopy(OSAURUS)
    layout["peer"][C.IBV_DEVINFO] = "ibv_devinfo_osaurus_m5max_mbp_peer_macos27_port_down.txt"
    return make_capture_dir(fixtures, root, layout)


def test_a_port_down_device_with_no_alternative_is_kept_and_named(macos_fixtures, tmp_path):
    folder = osaurus_with_devinfo(macos_fixtures, tmp_path / "cap")
    topology = build_topology(load_capture_dir(folder))
    assert topology.hosts["peer"].port_down("rdma_en6") and not topology.hosts["local"].rdma_active
    inv = parse_inventory(PAIR, "inv.yaml")
    hf = generate_mlx_hostfile(inv, "jaccl", topology)
    assert [h.rdma for h in hf.hosts] == [(None, "rdma_en6"), ("rdma_en6", None)]  # Thunderbolt 2 on both
    notes = rdma_port_notes(inv, topology, hf)
    assert len(notes) == 1
    assert notes[0].startswith("rdma_en6 on peer (cable local <-> peer) is PORT_DOWN yet in the matrix")
    assert "Couldn't allocate protection domain" in notes[0]
    # The CLI prints the note on stderr; the hostfile itself is unchanged JSON.
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(PAIR)
    out = CliRunner().invoke(main, ["hostfile", "generate", "-i", str(inv_path), "--backend", "jaccl",
                                    "--from", str(folder), "-o", "-"])
    assert out.exit_code == 0, out.output
    assert "note: rdma_en6 on peer (cable local <-> peer) is PORT_DOWN" in out.stderr
    assert '"rdma_en6"' in out.stdout


def _host(name, active=None):
    return HostTopology(name, (), ("rdma_en1", "rdma_en2"), None, rdma_active=active or {})


def _trio(b_active):
    links = (Link("a", "en1", "b", "en1", 80.0, "uuid", 1, 1), Link("a", "en2", "b", "en2", 80.0, "uuid", 2, 2),
             Link("a", "en3", "c", "en1", 80.0, "uuid", 3, 1), Link("b", "en3", "c", "en2", 80.0, "uuid", 3, 2))
    return Topology({"a": _host("a"), "b": _host("b", b_active), "c": _host("c")}, links, ("a", "b", "c"), True)


def test_the_active_cable_wins_when_a_pair_has_two():
    inv = parse_inventory(TRIO, "inv.yaml")
    # b's en1 is PORT_DOWN: of the two a<->b cables, the matrix takes en2.
    down = _trio({"rdma_en1": False, "rdma_en2": True, "rdma_en3": True})
    hf = generate_mlx_hostfile(inv, "jaccl", down)
    assert hf.hosts[0].rdma == (None, "rdma_en2", "rdma_en3")
    assert hf.hosts[1].rdma == ("rdma_en2", None, "rdma_en3")
    assert rdma_port_notes(inv, down, hf) == [
        "skipped rdma_en1 on b (cable a <-> b): PORT_DOWN in ibv_devinfo"]
    # Without ibv_devinfo (or with every port up) the first cable is used, nothing said.
    for active in (None, {"rdma_en1": True, "rdma_en2": True, "rdma_en3": True}):
        hf = generate_mlx_hostfile(inv, "jaccl", _trio(active))
        assert hf.hosts[0].rdma == (None, "rdma_en1", "rdma_en3")
        assert rdma_port_notes(inv, _trio(active), hf) == []
