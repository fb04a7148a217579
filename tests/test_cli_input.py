"""Bad input to smoke, train and demo is refused with exit 2 and a message
naming the problem, before anything is launched (no traceback)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("sizes,needle", [("inf", "not a finite number"),
                                          ("1e400", "not a finite number"),
                                          ("1K:inf", "not a finite number"),
                                          ("99999999999999999999G", "above the limit of 16G")])
def test_smoke_sizes_out_of_range(sizes, needle):
    result = invoke("smoke", "--local", "2", "--sizes", sizes)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "smoke ring" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
