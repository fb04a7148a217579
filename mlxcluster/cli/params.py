"""Flag types shared by the commands."""

from __future__ import annotations

import math

import click


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
