"""The acknowledgement a task log returns for a record published without waiting."""

from __future__ import annotations

import threading
import time

import pytest

from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.tasklog.base import Ack, Position


def test_a_waiter_on_another_thread_gets_the_position_once_it_comes() -> None:
    ack = Ack()
    got: list[Position] = []
    waiter = threading.Thread(target=lambda: got.append(ack.result(timeout=10)))
    waiter.start()
    time.sleep(0.05)  # the waiter is waiting, with its event made
    assert not ack.done() and got == []
    assert ack.settle(Position(3, 41))
    waiter.join(timeout=10)
    assert got == [Position(3, 41)] and ack.done() and ack.exception() is None


def test_the_first_outcome_counts() -> None:
    ack = Ack()
    error = TaskLogUnavailableError("producer replaced")
    assert ack.settle(None, error)
    assert not ack.settle(Position(0, 1))  # a report that comes after is ignored
    assert ack.exception(timeout=0) is error
    with pytest.raises(TaskLogUnavailableError, match="producer replaced"):
        ack.result(timeout=0)


def test_waiting_longer_than_the_timeout_raises_timeout_error() -> None:
    ack = Ack()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0\.05s"):
        ack.result(timeout=0.05)
    assert time.monotonic() - started >= 0.05 and not ack.done()
    ack.settle(Position(1, 2))  # the event the waiter made is set; a later wait returns
    assert ack.result(timeout=0) == Position(1, 2)


def test_many_acks_settled_while_their_waiters_arrive() -> None:
    # every interleaving of settle and a waiter's first look ends with the waiter returning
    acks = [Ack() for _ in range(2_000)]
    results: list[Position] = []

    def wait_all() -> None:
        results.extend(ack.result(timeout=10) for ack in acks)

    waiter = threading.Thread(target=wait_all)
    waiter.start()
    for index, ack in enumerate(acks):
        ack.settle(Position(0, index))
    waiter.join(timeout=20)
    assert results == [Position(0, index) for index in range(2_000)]


def test_of_is_already_settled() -> None:
    ack = Ack.of(Position(2, 7))
    assert ack.done() and ack.result() == Position(2, 7) and "Position" in repr(ack)
