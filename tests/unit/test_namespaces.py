"""The integration tests' topics and keyspaces are made a test ahead and dropped behind."""

from __future__ import annotations

import threading

import pytest

from tests.integration.namespaces import Namespaces


def test_the_next_name_is_made_while_a_test_runs_and_every_one_is_dropped() -> None:
    made: list[str] = []
    dropped: list[str] = []
    ahead = threading.Event()

    def make(name: str) -> str:
        made.append(name)
        if len(made) == 2:
            ahead.set()
        return name

    namespaces = Namespaces(make, dropped.append)
    first = namespaces.take()
    assert ahead.wait(5), "the second name is made before it is asked for"
    assert made == [first, made[1]]
    namespaces.drop(first)
    second = namespaces.take()
    assert second == made[1]
    namespaces.drop(second)
    namespaces.close()
    assert len(made) == 3 and dropped == [first, second, made[2]]  # the one made ahead too


def test_a_name_whose_making_failed_raises_in_the_test_that_takes_it() -> None:
    def make(name: str) -> str:
        raise AssertionError(f"scheduler init of {name} failed")

    namespaces = Namespaces(make, lambda name: None)
    with pytest.raises(AssertionError, match="scheduler init of t_"):
        namespaces.take()
    namespaces.close()
