"""The cluster inventory: which hosts, how to reach them, which python.

Format (documented field by field in inventory/example.yaml and docs/inventory.md)::

    cluster: lab
    user: me                      # default ssh user
    python: /opt/venv/bin/python  # the same path on every host
    ssh_config: ~/.ssh/config     # optional
    hosts:
      - name: studio-1            # unique name
        ssh: studio-1.local       # ssh target: Host alias, hostname or IP
        ips: [192.168.1.21]       # optional data-path IPs

Loading validates everything at once and raises one ``InventoryError``
listing every problem with its file and line. Names, targets, users and
paths are checked against strict patterns so that nothing from an inventory
can smuggle shell syntax into a remote command (callers still quote).
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mlxcluster.errors import InventoryError

# A host name becomes a folder name (capture dirs) and a table key: keep it plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# ssh target: Host alias, DNS name, IPv4, or IPv6 (optionally bracketed / with %zone).
_TARGET_RE = re.compile(r"^[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]{0,252}$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
# An absolute path with no shell metacharacters or spaces.
_PATH_RE = re.compile(r"^/[A-Za-z0-9._+/@-]*$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# An IPv6 zone (fe80::1%en0) names an interface; ipaddress accepts any text there.
_ZONE_RE = re.compile(r"^[A-Za-z0-9]{1,32}$")


def ssh_target_ok(value: object) -> bool:
    """``[user@]target`` that ssh cannot read as an option (no leading '-')
    and a shell cannot read as code (no spaces, quotes or metacharacters)."""
    if not isinstance(value, str):
        return False
    user, at, target = value.rpartition("@")
    return bool(_TARGET_RE.match(target)) and (not at or bool(_USER_RE.match(user)))


def parse_ip(value: object) -> str | None:
    """``value`` as a normalized IP address, or None when it is not one (a
    zone must be a plain interface name)."""
    if not isinstance(value, str):
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    zone = getattr(address, "scope_id", None)
    if zone is not None and not _ZONE_RE.match(zone):
        return None
    return str(address)


_TOP_KEYS = {"cluster", "user", "python", "ssh_config", "hosts", "env"}
_HOST_KEYS = {"name", "ssh", "ips", "user", "python", "port", "env"}


@dataclass(frozen=True)
class Host:
    """One host, with cluster defaults already applied."""

    name: str
    ssh: str
    ips: tuple[str, ...] = ()
    user: str | None = None
    python: str = ""
    port: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def data_ip(self) -> str:
        """The first data-path IP, else the ssh target (which may be a name)."""
        return self.ips[0] if self.ips else self.ssh


@dataclass(frozen=True)
class Inventory:
    cluster: str
    python: str
    hosts: tuple[Host, ...]
    user: str | None = None
    ssh_config: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    path: str | None = None

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


def load_inventory(path: str | os.PathLike) -> Inventory:
    """Read and validate an inventory file; raise InventoryError with every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(str(p), ["file not found"], "pass -i PATH to an inventory YAML; see inventory/example.yaml") from None
    except OSError as exc:
        raise InventoryError(str(p), [f"cannot read: {exc.strerror}"]) from None
    return parse_inventory(text, source=str(p))


def local_inventory(n: int, python: str | None = None) -> Inventory:
    """N ranks on this machine (127.0.0.1 repeated), for demos and tests."""
    if n < 1:
        raise InventoryError("<local>", [f"--local needs at least 1 rank, got {n}"])
    py = python or sys.executable
    hosts = tuple(
        Host(name=f"local-{i}", ssh="127.0.0.1", ips=("127.0.0.1",), python=py) for i in range(n)
    )
    return Inventory(cluster="local", python=py, hosts=hosts, path=None)


def parse_inventory(text: str, source: str = "<string>") -> Inventory:
    """Validate inventory YAML text. Pure: no file or network access."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InventoryError(source, [f"{where}not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    v = _Validator(source)
    if not isinstance(root, yaml.MappingNode):
        raise InventoryError(source, ["the file must be a mapping with 'cluster', 'python' and 'hosts'"])
    top = v.mapping(root, _TOP_KEYS, "top level")

    cluster = v.scalar(top, "cluster", root, required=True, pattern=_NAME_RE, what="a plain name")
    user = v.scalar(top, "user", root, pattern=_USER_RE, what="a user name")
    python = v.scalar(top, "python", root, required=True, pattern=_PATH_RE, what="an absolute path without spaces or shell characters")
    ssh_config = v.scalar(top, "ssh_config", root)
    if ssh_config is not None:
        ssh_config = os.path.expanduser(ssh_config)
    env = v.env(top.get("env"), "env")

    hosts: list[Host] = []
    hosts_node = top.get("hosts")
    if hosts_node is None:
        v.problem(root, "'hosts' is missing: list at least one host")
    elif not isinstance(hosts_node, yaml.SequenceNode) or not hosts_node.value:
        v.problem(hosts_node, "'hosts' must be a non-empty list of hosts")
    else:
        seen: dict[str, int] = {}
        for i, node in enumerate(hosts_node.value):
            host = _parse_host(v, node, i, user, python, env)
            if host is None:
                continue
            if host.name in seen:
                v.problem(node, f"host name '{host.name}' is used twice (first at line {seen[host.name]}); names must be unique")
            else:
                seen[host.name] = node.start_mark.line + 1
                hosts.append(host)

    if v.problems:
        raise InventoryError(source, v.sorted_problems())
    return Inventory(
        cluster=cluster, python=python, hosts=tuple(hosts), user=user,
        ssh_config=ssh_config, env=env, path=source,
    )


def _parse_host(v: _Validator, node, index: int, user, python, cluster_env) -> Host | None:
    label = f"hosts[{index}]"
    if not isinstance(node, yaml.MappingNode):
        v.problem(node, f"{label} must be a mapping with at least 'name' and 'ssh'")
        return None
    fields = v.mapping(node, _HOST_KEYS, label)
    name = v.scalar(fields, "name", node, required=True, pattern=_NAME_RE,
                    what="letters, digits, '.', '_' or '-'", label=label)
    ssh = v.scalar(fields, "ssh", node, required=True, pattern=_TARGET_RE,
                   what="a Host alias, hostname or IP (no spaces, quotes or shell characters)", label=label)
    host_user = v.scalar(fields, "user", node, pattern=_USER_RE, what="a user name", label=label)
    host_python = v.scalar(fields, "python", node, pattern=_PATH_RE, what="an absolute path", label=label)
    port_node = fields.get("port")
    port = None
    if port_node is not None:
        try:
            port = int(port_node.value)
            if not 1 <= port <= 65535:
                raise ValueError
        except (TypeError, ValueError):
            v.problem(port_node, f"{label}.port must be a TCP port number 1-65535, got {port_node.value!r}")
            port = None
    ips: list[str] = []
    ips_node = fields.get("ips")
    if ips_node is not None:
        if not isinstance(ips_node, yaml.SequenceNode):
            v.problem(ips_node, f"{label}.ips must be a list like [192.168.1.21]")
        else:
            for ip_node in ips_node.value:
                value = getattr(ip_node, "value", None)
                ip = parse_ip(value)
                if ip is None:
                    v.problem(ip_node, f"{label}.ips: {value!r} is not an IP address")
                else:
                    ips.append(ip)
    env = dict(cluster_env)
    env.update(v.env(fields.get("env"), f"{label}.env"))
    if name is None or ssh is None:
        return None
    return Host(
        name=name, ssh=ssh, ips=tuple(ips), user=host_user or user,
        python=host_python or python or "", port=port, env=env,
    )


class _Validator:
    """Collects problems with line numbers instead of stopping at the first."""

    def __init__(self, source: str):
        self.source = source
        self._found: list[tuple[int, str]] = []

    def problem(self, node, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 0
        self._found.append((line, f"{self.source}:{line}: {message}" if line else f"{self.source}: {message}"))

    @property
    def problems(self) -> list[str]:
        return [text for _, text in self._found]

    def sorted_problems(self) -> list[str]:
        return [text for _, text in sorted(self._found, key=lambda item: item[0])]

    def mapping(self, node, allowed: set[str], label: str) -> dict:
        out = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key not in allowed:
                self.problem(key_node, f"{label}: unknown field '{key}' (allowed: {', '.join(sorted(allowed))})")
                continue
            out[key] = value_node
        return out

    def scalar(self, fields: dict, key: str, parent, *, required=False, pattern=None, what="", label=None):
        node = fields.get(key)
        name = f"{label}.{key}" if label else key
        if node is None or (isinstance(node, yaml.ScalarNode) and node.value == "" and node.tag.endswith("null")):
            if required:
                self.problem(parent, f"'{name}' is missing")
            return None
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, f"'{name}' must be a single value")
            return None
        value = node.value
        if pattern is not None and not pattern.match(value):
            self.problem(node, f"'{name}' = {value!r} is not {what}")
            return None
        return value

    def env(self, node, label: str) -> dict[str, str]:
        if node is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, f"{label} must be a mapping of NAME: value")
            return {}
        out = {}
        for key_node, value_node in node.value:
            if not _ENV_KEY_RE.match(key_node.value):
                self.problem(key_node, f"{label}: {key_node.value!r} is not a valid environment variable name")
            elif not isinstance(value_node, yaml.ScalarNode):
                self.problem(value_node, f"{label}.{key_node.value} must be a single value")
            else:
                out[key_node.value] = value_node.value
        return out
