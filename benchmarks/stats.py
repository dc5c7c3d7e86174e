"""Summaries of repeated measurements: every figure is a median with its min and max."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Figure", "percentile", "ratio"]


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) of *values*, nearest-rank; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is zero or not a number."""
    if denominator == 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class Figure:
    """One measured quantity over several runs."""

    values: tuple[float, ...]
    unit: str = ""
    digits: int = 0  # decimals shown

    @classmethod
    def of(cls, values: Sequence[float], unit: str = "", digits: int = 0) -> Figure:
        return cls(tuple(float(v) for v in values), unit, digits)

    @property
    def measured(self) -> tuple[float, ...]:
        return tuple(v for v in self.values if not math.isnan(v))

    @property
    def median(self) -> float:
        measured = self.measured
        return statistics.median(measured) if measured else math.nan

    @property
    def low(self) -> float:
        return min(self.measured, default=math.nan)

    @property
    def high(self) -> float:
        return max(self.measured, default=math.nan)

    def _number(self, value: float) -> str:
        if math.isnan(value):
            return "n/a"
        if self.unit == "%":
            return f"{value * 100:.{self.digits}f}"
        return f"{value:,.{self.digits}f}"

    def __str__(self) -> str:
        """``1,234 /s (1,100 to 1,300, n=3)``: median (min to max, runs)."""
        unit = f" {self.unit}" if self.unit and self.unit != "%" else ("%" if self.unit == "%" else "")
        if math.isnan(self.median):
            unit = ""  # "n/a", not "n/a%"
        text = f"{self._number(self.median)}{unit}"
        count = len(self.values)
        if count > 1:
            text += f" ({self._number(self.low)} to {self._number(self.high)}, n={count})"
        elif count == 1:
            text += " (n=1)"
        return text
