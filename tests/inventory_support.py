"""Small inventories for the unit tests: the YAML text of the hosts a test names, host i
reached by SSH at the (i+1)th address of a subnet; the doctor --fix tests' form of it,
as text or parsed; and one whose hosts have the data IPs a test gives them.

The inventory file a test edits and compares byte for byte is the ``inventory_file``
fixture (tests/conftest.py): it writes the test module's own INVENTORY text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mlxcluster.inventory.inventory import Inventory, parse_inventory

FIX_PYTHON = "/opt/venv/bin/python"


def inventory_text(hosts: Iterable[str], *, cluster: str = "c", python: str = "/usr/bin/python3",
                   subnet: str = "10.9.0", data_ips: bool | Mapping[str, Sequence[str]] = True,
                   env: str = "") -> str:
    """An inventory of ``hosts`` (names), host i reached by SSH at <subnet>.<i+1>.
    ``data_ips``: True, that address is its data IP too; False, no data IPs; a mapping,
    each host's own. ``env``: a top-level env block, written before the hosts."""
    lines = []
    for i, name in enumerate(hosts):
        address = f"{subnet}.{i + 1}"
        lines.append(f"  - name: {name}\n    ssh: {address}\n")
        ips = data_ips.get(name) if isinstance(data_ips, Mapping) else [address] if data_ips else None
        if ips is not None:
            lines.append(f"    ips: [{', '.join(ips)}]\n")
    return f"cluster: {cluster}\npython: {python}\n{env}hosts:\n{''.join(lines)}"


def fix_inventory_text(hosts: Iterable[str], python: str = FIX_PYTHON) -> str:
    """The doctor --fix tests' inventory: cluster lab, host i at 10.0.0.<i+1>, no data IPs."""
    return inventory_text(hosts, cluster="lab", python=python, subnet="10.0.0", data_ips=False)


def inventory_of(hosts: Iterable[str], python: str = FIX_PYTHON) -> Inventory:
    """``fix_inventory_text(hosts, python)`` parsed, as if read from /tmp/x/cluster.yaml
    (FakeSsh.local(root, inventory_of(names)) knows each host by its address there)."""
    return parse_inventory(fix_inventory_text(hosts, python), source="/tmp/x/cluster.yaml")


def inventory_with_ips(**ips: Sequence[str]) -> Inventory:
    """An inventory of the hosts named by the keywords, each with the data IPs given."""
    return parse_inventory(inventory_text(ips, data_ips=ips), source="inv.yaml")
