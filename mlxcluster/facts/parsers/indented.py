"""Parse the indented ``Key: value`` outline that ``system_profiler`` prints
in its plain-text form (shared by the Thunderbolt and hardware parsers)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Node:
    """One outline line: ``key: value`` with the lines indented below it."""

    key: str
    value: str = ""
    indent: int = -1
    children: list[Node] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        """The value of the first direct child named ``key`` (case-insensitive)."""
        wanted = key.lower()
        for child in self.children:
            if child.key.lower() == wanted:
                return child.value
        return None

    def find(self, key: str) -> Node | None:
        """The first direct child named ``key``, or None."""
        wanted = key.lower()
        return next((c for c in self.children if c.key.lower() == wanted), None)

    def walk(self):
        """Every node below this one, depth first."""
        for child in self.children:
            yield child
            yield from child.walk()


def parse_outline(text: str) -> Node:
    """Build the outline tree; lines without a colon are ignored.

    Tabs count as 8 columns (some captures were pasted with tabs, others with
    spaces); only relative indentation matters.
    """
    root = Node("", "", -1)
    stack = [root]
    for raw in (text or "").splitlines():
        line = raw.expandtabs(8).rstrip()
        if not line.strip() or ":" not in line:
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        node = Node(key.strip(), value.strip(), indent)
        while len(stack) > 1 and stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root
