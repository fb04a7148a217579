"""reference_train's modules: what each imports, so that none needs a circle or a hidden import."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import reference_train

PACKAGE = Path(reference_train.__file__).parent


def local_imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(module of reference_train, imported inside a function?) for every relative import."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.level == 1:
                names = [child.module] if child.module else [a.name for a in child.names]
                found.extend((name.split(".")[0], inner) for name in names)
            visit(child, inner)

    visit(tree, False)
    return found


def test_every_module_imports_only_those_listed_before_it():
    """The module map in reference_train/__init__.py is an order: each module imports only
    modules above it (so there is no circle), and none imports one inside a function."""
    listed = re.findall(r"^    (\w+)\.py ", reference_train.__doc__, re.MULTILINE)
    on_disk = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(listed) == on_disk
    for i, name in enumerate(listed):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for imported, in_function in local_imports(tree):
            assert not in_function, f"{name}.py imports {imported} inside a function"
            assert imported in listed[:i], f"{name}.py imports {imported}, listed after it"


def test_metrics_imports_no_mlx_and_holds_the_launcher_marks():
    """mlxcluster draws the loss curve from the record it kept without loading MLX,
    and reads the heartbeat and record lines the marks here begin."""
    code = ("import sys, reference_train.metrics as m\n"
            "assert not [n for n in sys.modules if n.split('.')[0] == 'mlx'], 'mlx imported'\n"
            "print(m.HEARTBEAT_MARK, m.RECORD_MARK, m.HEARTBEAT_ENV, m.RECORD_ENV)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["@@mlxcluster-heartbeat", "@@mlxcluster-record",
                                   "MLXCLUSTER_HEARTBEAT", "MLXCLUSTER_RECORD"]
