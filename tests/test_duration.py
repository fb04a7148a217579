"""Durations as people write them: the parser and the click type train uses."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from mlxcluster.cli.params import Duration, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("90s", 90.0), ("2.5s", 2.5), ("30m", 1800.0), ("2h", 7200.0),
    ("1h30m", 5400.0), ("1m30s", 90.0), ("500ms", 0.5), (" 20S ", 20.0), ("0.5", 0.5),
    ("1h 30m", 5400.0), (".5m", 30.0),
])
def test_durations_read_as_written(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "m30", "-5", "90x", "1 30m", "5m5m", "nan", "inf",
                                  "1e400", "30 minutes", "1h30"])
def test_not_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@click.command()
@click.option("--timeout", type=Duration(1, 3600))
def _echo(timeout):
    click.echo(repr(timeout))


@pytest.mark.parametrize("given, shown", [("20s", "20.0"), ("2m", "120.0"), ("45", "45.0")])
def test_the_click_type_gives_seconds(given, shown):
    result = CliRunner().invoke(_echo, ["--timeout", given], catch_exceptions=False)
    assert result.exit_code == 0 and result.output.strip() == shown


@pytest.mark.parametrize("given, said", [("0.5s", "below the minimum of 1 s"),
                                         ("2h", "above the maximum of 3600 s"),
                                         ("soon", "is not a duration")])
def test_the_click_type_refuses_with_the_reason(given, said):
    result = CliRunner().invoke(_echo, ["--timeout", given])
    assert result.exit_code == 2 and said in result.output
