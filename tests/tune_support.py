"""What the tune tests share: the files `mlxcluster tune` writes for a winning candidate
(written by tune's own writer, for two Macs), and questions about the Open MPI arguments
a launch gets (tests/test_tuned_settings.py, tests/test_tune_mpi_allreduce.py and the lab's
tests/lab/test_tune_lab.py)."""

from __future__ import annotations

from pathlib import Path

from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.tune.candidates import Candidate
from mlxcluster.tune.files import winner_files
from tests.inventory_support import inventory_text

# Two Macs at 10.0.0.1 and 10.0.0.2, each address its data IP too.
TUNED_INVENTORY = parse_inventory(inventory_text(["mac1", "mac2"], cluster="lab",
                                                 python="/opt/venv/bin/python", subnet="10.0.0"))


def write_tune_output(tmp_path: Path, candidate: Candidate, name: str) -> Path:
    """The files tune writes for ``candidate`` (its own writer, not a copy)."""
    out = tmp_path / name
    for path, text in winner_files(TUNED_INVENTORY, candidate, str(out)).items():
        Path(path).write_text(text)
    return out


def mca(argv: list[str] | tuple[str, ...], name: str) -> list[str]:
    """Every value ``argv`` gives the MCA parameter ``name`` (mpirun refuses two different ones)."""
    return [argv[i + 2] for i, a in enumerate(argv[:-2]) if a in ("--mca", "-mca") and argv[i + 1] == name]


def forced_ring(argv) -> bool:
    """Whether ``argv`` forces Open MPI's ring allreduce: each of the two pairs once."""
    return (mca(argv, "coll_tuned_use_dynamic_rules"), mca(argv, "coll_tuned_allreduce_algorithm")) == (["1"], ["4"])
