"""The Trainer holds its parallelism and never asks which (reference_train/parallelism.py):
train.py names neither data-parallel nor a pipeline, stays under 550 lines and imports at
most 20 of reference_train's modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import reference_train

TRAIN = Path(reference_train.__file__).parent / "train.py"
# What naming a parallelism looks like: pipe, pipeline, stage(s), replica(s), data_parallel,
# DataParallel, PipelineStep, micro_batches ... (as a name, an attribute, a keyword or an
# imported module); --pipeline's field itself (cfg.pipeline) is the choice, parallelism.py's.
PARALLEL = re.compile(r"pipe|stage|replica|data_?parallel|micro_batches|resplit|shard_optimizer"
                      r"|ShardedOptimizer|sharded_optimizer",
                      re.IGNORECASE)


def identifiers(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(a.asname or a.name for a in node.names)
    return names


def test_train_names_no_parallelism():
    """No `pipe is None` branch, nor any name of one parallelism, in train.py."""
    tree = ast.parse(TRAIN.read_text())
    assert sorted(n for n in identifiers(tree) if PARALLEL.search(n)) == []
    compares = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and "None" in ast.unparse(node)]
    assert not [c for c in compares if PARALLEL.search(c)]
    isinstances = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and ast.unparse(n.func) == "isinstance"]
    assert isinstances == []


def test_train_is_short_and_imports_few_modules():
    source = TRAIN.read_text()
    assert len(source.splitlines()) < 550
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            imported.update([node.module] if node.module else [a.name for a in node.names])
    assert len(imported) <= 20, sorted(imported)
