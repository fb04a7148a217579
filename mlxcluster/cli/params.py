"""Flag types and flags shared by the commands."""

from __future__ import annotations

import math

import click

from mlxcluster.errors import InputError
from mlxcluster.inventory import Inventory, load_inventory
from mlxcluster.inventory_search import InventoryChoice, find_inventory


class Seconds(click.FloatRange):
    """A duration in seconds within a range. click's FloatRange lets 'nan'
    through (every comparison with NaN is false), and a NaN deadline never
    expires: refuse it."""

    name = "seconds"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


class Duration(click.ParamType):
    """A duration: '90' or '90s' (seconds), '5m', '2h', '1.5m'; positive and
    finite. Converts to seconds (float). Self-contained on purpose."""

    name = "duration"
    UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}

    def __init__(self, min_s: float = 0.0, max_s: float = math.inf):
        self.min_s, self.max_s = min_s, max_s

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            unit = text[-1:] if text[-1:] in ("s", "m", "h") else ""
            try:
                seconds = float(text[:len(text) - len(unit)]) * self.UNITS[unit]
            except ValueError:
                self.fail(f"{value!r} is not a duration (e.g. 90, 90s, 5m, 2h)", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive duration", param, ctx)
        if not self.min_s <= seconds <= self.max_s:
            self.fail(f"{value!r} is outside {self.min_s:g}..{self.max_s:g} seconds", param, ctx)
        return seconds


INVENTORY_HELP = ("Inventory YAML (default: $MLXCLUSTER_INVENTORY, else ./cluster.yaml, else "
                  "~/.config/mlxcluster/cluster.yaml).")


def inventory_option(help_text: str = INVENTORY_HELP):
    """The -i/--inventory flag of every command that reads an inventory; the
    value is None when not given (``load_chosen_inventory`` finds the default)."""
    return click.option("-i", "--inventory", "inventory_path", type=click.Path(dir_okay=False),
                        default=None, help=help_text)


def choose_inventory(given: str | None, *, other_sources: str = "") -> InventoryChoice:
    """-i, or the default inventory, naming on stderr the file found by
    default (stdout stays clean for --json). ``other_sources`` ("--hostfile
    FILE or --local N") joins the hint when there is no inventory at all."""
    try:
        choice = find_inventory(given)
    except InputError as err:
        if other_sources:
            err.hint = f"{err.hint}; or give {other_sources}"
        raise
    if not choice.given:
        click.echo(choice.describe(), err=True)
    return choice


def load_chosen_inventory(given: str | None, *, other_sources: str = "") -> Inventory:
    """``choose_inventory``, loaded."""
    return load_inventory(choose_inventory(given, other_sources=other_sources).path)
