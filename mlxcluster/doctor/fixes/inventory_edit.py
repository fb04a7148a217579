"""Setting one ``env`` variable in an inventory file, every other byte kept.

The edit is made on the text, at the places PyYAML's node marks give, so
comments, key order, quoting and blank lines stay as the user wrote them
(a YAML round trip would reformat them). For example, on

    python: /opt/venv/bin/python   # the same path everywhere
    hosts:
      - name: a
        ssh: 10.0.0.1   # first

``set_env(text, "a", "MLX_MPI_LIBNAME", "/x/libmpi.so.40")`` gives

    python: /opt/venv/bin/python   # the same path everywhere
    hosts:
      - name: a
        ssh: 10.0.0.1   # first
        env:
          MLX_MPI_LIBNAME: "/x/libmpi.so.40"

and ``host=None`` writes the cluster's ``env`` (before ``hosts:``). A key
already there has its value replaced in place.
"""

from __future__ import annotations

import json

import yaml

from mlxcluster.errors import InputError


def _quoted(value: str) -> str:
    # A JSON string is a YAML double-quoted scalar.
    return json.dumps(value)


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _line_end(text: str, index: int) -> int:
    """Index just past the end of the line holding ``index`` (its newline included)."""
    end = text.find("\n", index)
    return len(text) if end < 0 else end + 1


def _last_leaf(node):
    """The last scalar or flow collection under ``node`` (where its text ends)."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(node, yaml.MappingNode) else last
    return node


def _key(mapping, name: str):
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == name:
            return k, v
    return None


def _mapping_of(root, host: str | None, source: str):
    if not isinstance(root, yaml.MappingNode):
        raise InputError(f"{source}: not a YAML mapping", "fix the inventory first (mlxcluster doctor -i ...)")
    if host is None:
        return root
    found = _key(root, "hosts")
    if found and isinstance(found[1], yaml.SequenceNode):
        for item in found[1].value:
            name = _key(item, "name") if isinstance(item, yaml.MappingNode) else None
            if name and isinstance(name[1], yaml.ScalarNode) and name[1].value == host:
                return item
    raise InputError(f"{source}: no host named {host}", "fix the inventory first (mlxcluster doctor -i ...)")


def set_env(text: str, host: str | None, key: str, value: str, source: str = "<inventory>") -> str:
    """``text`` with ``env[key] = value`` set for ``host`` (None: the cluster's env)."""
    nl = _newline(text)
    root = yaml.compose(text)
    mapping = _mapping_of(root, host, source)
    env = _key(mapping, "env")
    if env is not None:
        env_node = env[1]
        if isinstance(env_node, yaml.ScalarNode) and env_node.value in ("", "~", "null"):
            env_node = None  # "env:" with nothing: filled below as a new block
            mapping_env_key = env[0]
        elif not isinstance(env_node, yaml.MappingNode):
            raise InputError(f"{source}: env is not a mapping", "fix the inventory first")
        else:
            mapping_env_key = None
        if env_node is not None:
            existing = _key(env_node, key)
            if existing is not None:
                v = existing[1]
                return text[:v.start_mark.index] + _quoted(value) + text[v.end_mark.index:]
            if env_node.flow_style or not env_node.value:
                pairs = [(k.value, text[vv.start_mark.index:vv.end_mark.index]) for k, vv in env_node.value]
                pairs.append((key, _quoted(value)))
                flow = "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
                return text[:env_node.start_mark.index] + flow + text[env_node.end_mark.index:]
            column = env_node.value[0][0].start_mark.column
            at = _line_end(text, _last_leaf(env_node).end_mark.index)
            line = " " * column + f"{key}: {_quoted(value)}" + nl
            return _insert(text, at, line, nl)
        # "env:" present but empty: its entry goes on the next line.
        column = mapping_env_key.start_mark.column + 2
        at = _line_end(text, mapping_env_key.end_mark.index)
        return _insert(text, at, " " * column + f"{key}: {_quoted(value)}" + nl, nl)
    if mapping.flow_style:  # "- {name: a, ssh: h}": the env joins the braces
        close = mapping.end_mark.index - 1
        return text[:close] + f", env: {{{key}: {_quoted(value)}}}" + text[close:]
    column = mapping.value[0][0].start_mark.column if mapping.value else 0
    block = (" " * column + "env:" + nl + " " * (column + 2) + f"{key}: {_quoted(value)}" + nl)
    if host is None:
        hosts = _key(mapping, "hosts")
        if hosts is not None:  # the cluster's env reads best before the hosts
            at = _above_comments(text, hosts[0].start_mark.index - hosts[0].start_mark.column)
            return text[:at] + block + text[at:]
    at = _line_end(text, _last_leaf(mapping).end_mark.index)
    return _insert(text, at, block, nl)


def _above_comments(text: str, line_start: int) -> int:
    """The start of the comment lines right above the line at ``line_start``
    (they describe it: what is inserted before it goes above them); comments
    that open the file are its header and stay first."""
    at = line_start
    while at > 0:
        previous = text.rfind("\n", 0, at - 1) + 1
        if not text[previous:at].lstrip().startswith("#"):
            return at
        at = previous
    return line_start


def _insert(text: str, at: int, piece: str, nl: str) -> str:
    if at == len(text) and text and not text.endswith("\n"):
        piece = nl + piece  # a last line without its newline
    return text[:at] + piece + text[at:]
