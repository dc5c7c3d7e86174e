"""The soak's memory verdict: growth is taken from the first window's end to the largest
after it, so a dispatcher that grows and then shrinks a little is still caught."""

from __future__ import annotations

import pytest

from benchmarks.soak import GROWTH_TARGET, growth


def test_a_steady_dispatcher_meets_the_bound() -> None:
    assert growth([100.0, 104.0, 103.0, 105.0]) == pytest.approx(0.05)
    assert growth([100.0, 104.0, 103.0, 105.0]) <= GROWTH_TARGET


def test_a_dispatcher_that_keeps_growing_fails_it_even_if_it_shrinks_at_the_end() -> None:
    assert growth([100.0, 108.0, 115.0, 109.0]) == pytest.approx(0.15)
    assert growth([100.0, 108.0, 115.0, 109.0]) > GROWTH_TARGET


def test_one_window_has_no_growth() -> None:
    assert growth([100.0]) == 0
