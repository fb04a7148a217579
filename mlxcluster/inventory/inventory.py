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

import difflib
import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mlxcluster.errors import InventoryError

# A host name becomes a folder name (capture dirs) and a table key: keep it plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
# ssh target: Host alias, DNS name, IPv4, or IPv6 (optionally bracketed / with %zone).
_TARGET_RE = re.compile(r"^[A-Za-z0-9_\[][A-Za-z0-9._:%\[\]-]{0,252}\Z")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}\Z")
# An absolute path with no shell metacharacters or spaces.
_PATH_RE = re.compile(r"^/[A-Za-z0-9._+/@-]*\Z")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

# An IPv6 zone (fe80::1%en0) names an interface; ipaddress accepts any text there.
_ZONE_RE = re.compile(r"^[A-Za-z0-9]{1,32}\Z")


def ssh_target_ok(value: object) -> bool:
    """``[user@]target`` that ssh cannot read as an option (no leading '-')
    and a shell cannot read as code (no spaces, quotes or metacharacters)."""
    if not isinstance(value, str):
        return False
    user, at, target = value.rpartition("@")
    return bool(_TARGET_RE.match(target)) and (not at or bool(_USER_RE.match(user)))


def name_ok(value: object) -> bool:
    """A plain name (cluster, host): letters, digits, '.', '_', '-'."""
    return isinstance(value, str) and bool(_NAME_RE.match(value))


def user_ok(value: object) -> bool:
    """A user name ssh may log in as."""
    return isinstance(value, str) and bool(_USER_RE.match(value))


def abs_path_ok(value: object) -> bool:
    """An absolute path without spaces or shell characters (python, libmpi)."""
    return isinstance(value, str) and bool(_PATH_RE.match(value))


def env_name_ok(value: object) -> bool:
    """An environment variable name: letters, digits, '_', not starting with a digit."""
    return isinstance(value, str) and bool(_ENV_KEY_RE.match(value))


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


# Inventories nest four levels (top, hosts, host, ips/env); deeper is an error,
# found before yaml.compose, whose recursion a deep file would exhaust.
_MAX_DEPTH = 16
# Echoed values are cut here: a message must not repeat a 5 MB value.
_SHOW_MAX = 80
_PORT_RE = re.compile(r"^[0-9]{1,5}\Z")


def shorten(text: str, limit: int = _SHOW_MAX) -> str:
    """``text`` cut to ``limit`` characters, with '...' when it was longer."""
    return text if len(text) <= limit else text[:limit] + "..."


def show(value: object) -> str:
    """A value as a message shows it: its repr, at most 80 characters."""
    if isinstance(value, str) and len(value) > _SHOW_MAX:
        value = value[: _SHOW_MAX + 1]  # repr of the head only: never of 5 MB
    return shorten(repr(value))


def _node_tokens(node):
    """The text of a YAML node as the user wrote it, in pieces (see show_node)."""
    if isinstance(node, yaml.ScalarNode):
        value = node.value[: _SHOW_MAX + 1]
        if node.tag.endswith(":null"):
            yield value or "null"
        elif node.tag.endswith((":int", ":float", ":bool")):
            yield value
        else:
            yield repr(value)
    elif isinstance(node, yaml.SequenceNode):
        yield "["
        for i, item in enumerate(node.value):
            yield ", " if i else ""
            yield from _node_tokens(item)
        yield "]"
    elif isinstance(node, yaml.MappingNode):
        yield "{"
        for i, (key, value) in enumerate(node.value):
            yield ", " if i else ""
            yield from _node_tokens(key)
            yield ": "
            yield from _node_tokens(value)
        yield "}"


def show_node(node) -> str:
    """A YAML node as a message shows it ('abc', 1, [1, 2], {a: 1}), at most
    80 characters: the user's value, never the parser's node objects."""
    text = ""
    for token in _node_tokens(node):
        text += token
        if len(text) > _SHOW_MAX:
            break
    return shorten(text)


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

    @property
    def ssh_target(self) -> str:
        """``user@ssh`` when the inventory sets a user (on the host or the
        cluster), as a hostfile names the host: mlx.launch and mpirun log in
        as that user only when the target says so."""
        return f"{self.user}@{self.ssh}" if self.user else self.ssh


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
        data = p.read_bytes()
    except FileNotFoundError:
        raise InventoryError(str(p), ["file not found"], "pass -i PATH to an inventory YAML; see inventory/example.yaml") from None
    except OSError as exc:
        raise InventoryError(str(p), [f"cannot read: {exc.strerror}"]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InventoryError(
            str(p), [f"{p}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"],
            "pass an inventory YAML saved as UTF-8 text; see inventory/example.yaml",
        ) from None
    return parse_inventory(text, source=str(p), check_files=True)


# The only ssh name mlx.launch runs a rank at without ssh (local_inventory's hosts).
LOCAL_TARGETS = ("127.0.0.1",)


def local_inventory(n: int, python: str | None = None) -> Inventory:
    """N ranks on this machine (127.0.0.1 repeated), for demos and tests."""
    if n < 1:
        raise InventoryError("<local>", [f"--local needs at least 1 rank, got {n}"])
    py = python or sys.executable
    hosts = tuple(
        Host(name=f"local-{i}", ssh=LOCAL_TARGETS[0], ips=("127.0.0.1",), python=py) for i in range(n)
    )
    return Inventory(cluster="local", python=py, hosts=hosts, path=None)


def _nesting_too_deep(text: str) -> int | None:
    """The line where ``text`` nests deeper than _MAX_DEPTH, else None.
    yaml.parse is a loop (yaml.compose recurses once per level)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                return event.start_mark.line + 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


def _compose(text: str, source: str):
    """The YAML node tree of ``text``; every YAML problem as an InventoryError with its line."""
    try:
        deep = _nesting_too_deep(text)
        if deep is None:
            return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        raise InventoryError(source, [f"{source}:{line}: not valid YAML: control character "
                                      f"#x{exc.character:04x} is not allowed"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}: " if mark is not None else f"{source}: "
        why = ", ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None))))
        raise InventoryError(source, [f"{where}not valid YAML: {why or exc}"]) from None
    except RecursionError:
        deep = 0
    where = f"{source}:{deep}: " if deep else f"{source}: "
    raise InventoryError(source, [f"{where}values nest more than {_MAX_DEPTH} levels deep; "
                                  "an inventory nests four (top, hosts, host, ips)"])


def parse_inventory(text: str, source: str = "<string>", *, check_files: bool = False) -> Inventory:
    """Validate inventory YAML text. Pure (no file or network access) unless
    ``check_files``: then an ``ssh_config`` that is a directory is a problem too."""
    root = _compose(text, source)
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
        if check_files and os.path.isdir(ssh_config):
            v.problem(top["ssh_config"], f"'ssh_config' = {show(ssh_config)} is a directory, "
                                         "not an OpenSSH config file (e.g. ~/.ssh/config)")
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
        # Plain decimal only: int() would also take '2_2', ' 22 ', '+22' and non-ASCII digits.
        value = port_node.value if isinstance(port_node, yaml.ScalarNode) else ""
        if _PORT_RE.match(value) and 1 <= int(value) <= 65535:
            port = int(value)
        else:
            v.problem(port_node, f"{label}.port must be a TCP port number 1-65535, got {show_node(port_node)}")
    ips: list[str] = []
    ips_node = fields.get("ips")
    if ips_node is not None:
        if not isinstance(ips_node, yaml.SequenceNode):
            v.problem(ips_node, f"{label}.ips must be a list like [192.168.1.21]")
        else:
            for ip_node in ips_node.value:
                ip = parse_ip(ip_node.value) if isinstance(ip_node, yaml.ScalarNode) else None
                if ip is None:
                    v.problem(ip_node, f"{label}.ips: {show_node(ip_node)} is not an IP address")
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

    def keys(self, node, label: str):
        """(key, key node, value node) of a mapping's plain keys; a key that is
        a list or mapping, or given twice, is a problem (YAML would let the
        last one win silently)."""
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problem(key_node, f"{label}: a field name must be a plain name, got {show_node(key_node)}")
                continue
            key = key_node.value
            if key in first:
                self.problem(key_node, f"{label}: {show(key)} is given twice (first at line {first[key]}); keep one")
                continue
            first[key] = key_node.start_mark.line + 1
            yield key, key_node, value_node

    def mapping(self, node, allowed: set[str], label: str) -> dict:
        out = {}
        for key, key_node, value_node in self.keys(node, label):
            if key not in allowed:
                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                meant = f"; did you mean '{close[0]}'?" if close else ""
                self.problem(key_node, f"{label}: unknown field {show(key)}{meant} "
                                       f"(allowed: {', '.join(sorted(allowed))})")
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
            self.problem(node, f"'{name}' = {show(value)} is not {what}")
            return None
        return value

    def env(self, node, label: str) -> dict[str, str]:
        if node is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, f"{label} must be a mapping of NAME: value")
            return {}
        out = {}
        for key, key_node, value_node in self.keys(node, label):
            if not _ENV_KEY_RE.match(key):
                self.problem(key_node, f"{label}: {show(key)} is not a valid environment variable name")
            elif not isinstance(value_node, yaml.ScalarNode):
                self.problem(value_node, f"{label}.{key} must be a single value")
            else:
                out[key] = value_node.value
        return out
