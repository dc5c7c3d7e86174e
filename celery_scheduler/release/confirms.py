"""RabbitMQ publisher confirms for a batch of releases.

Without confirms, a message RabbitMQ had not yet taken when it died is gone, and the task
waits for its lease to be released again. In confirm mode (``confirm.select``), RabbitMQ
numbers the messages published on a channel 1, 2, 3, ... and acknowledges each (or several
at once, ``multiple``) once it has taken responsibility for it, or refuses it (``nack``).
The dispatcher publishes a step's releases one after the other without waiting, then waits
once for all of them: a release counts as sent only when its acknowledgement came back.

This is kombu's ``confirm_publish`` transport option done per batch: that option waits for
each message before sending the next, a round trip each.

The dispatcher's on-time sender does not wait at all: each message it publishes is an
:class:`Unconfirmed` until its acknowledgement comes back, and the sender reads the
acknowledgements (:meth:`Confirms.drain`) while it waits for the next due time. A release
due meanwhile is published at its time instead of after the earlier ones' round trip.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from celery_scheduler.errors import ReleaseNotSentError

__all__ = ["Confirms", "Unconfirmed", "supports_confirms"]


def supports_confirms(channel: Any) -> bool:
    """Whether *channel* is a py-amqp channel, which RabbitMQ's confirm mode works on."""
    return hasattr(channel, "confirm_select") and hasattr(channel, "events")


class Unconfirmed:
    """A message published in confirm mode, until RabbitMQ settles it.

    Once :attr:`done`, :attr:`result` is None (RabbitMQ took it), ``ReleaseNotSentError``
    (it refused it) or another error (the connection failed, or no answer came in time:
    whether RabbitMQ took it is unknown).
    """

    __slots__ = ("done", "published", "result")

    def __init__(self, published: float) -> None:
        self.published = published  # monotonic
        self.done = False
        self.result: Exception | None = None

    def settle(self, result: Exception | None) -> None:
        self.done, self.result = True, result


def refused() -> ReleaseNotSentError:
    return ReleaseNotSentError("RabbitMQ refused the message (basic.nack): it did not take it")


class Confirms:
    """The delivery tags published on one channel in confirm mode, and how each was settled.

    The channel must be this object's alone: every message published on it takes a delivery
    tag, and :meth:`published` must be called for each, in order.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._last_tag = 0
        self._pending: set[int] = set()
        self._settled: dict[int, bool] = {}  # tag -> acknowledged (False: refused)
        self._later: dict[int, Unconfirmed] = {}  # tag -> its message, settled as it is confirmed
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.confirm_select()
        channel._confirm_selected = True  # py-amqp's own flag: never select twice

    def published(self) -> int:
        """Note one message published on the channel; its delivery tag."""
        self._last_tag += 1
        self._pending.add(self._last_tag)
        return self._last_tag

    def later(self, tag: int) -> Unconfirmed:
        """The message of *tag* (just :meth:`published`), settled once RabbitMQ answers, by
        :meth:`drain` or :meth:`wait`, instead of waited for.

        RabbitMQ may have answered already: py-amqp's ``basic_publish`` reads what has come
        in (it drains the connection without waiting), so the next message of a batch can
        read this one's answer before this call, and that answer must settle it, or it
        waits for an answer that came.
        """
        unconfirmed = Unconfirmed(time.monotonic())
        taken = self._settled.pop(tag, None)
        if taken is None:
            self._later[tag] = unconfirmed
        else:
            unconfirmed.settle(None if taken else refused())
        return unconfirmed

    @property
    def unsettled(self) -> int:
        """How many messages given :meth:`later` wait for RabbitMQ's answer."""
        return len(self._later)

    def oldest(self) -> float | None:
        """When the longest-waiting of them was published (monotonic); None if none waits."""
        return min((u.published for u in self._later.values()), default=None)

    def drain(self, timeout: float) -> None:
        """Read what RabbitMQ sent, waiting up to *timeout* seconds for the first frame.

        Raises the connection's error if it failed: then whether RabbitMQ took the messages
        still unsettled is unknown (see :meth:`abandon`).
        """
        with contextlib.suppress(TimeoutError):  # socket.timeout: nothing came
            self.channel.connection.drain_events(timeout=max(timeout, 0.0))

    def abandon(self, error: Exception) -> None:
        """Settle every message still waiting for an answer with *error* (none will come)."""
        later, self._later = self._later, {}
        for unconfirmed in later.values():
            unconfirmed.settle(error)

    def wait(self, tags: list[int], timeout: float) -> dict[int, bool]:
        """Wait until each of *tags* is settled: for each, True (taken) or False (refused).

        Raises ``TimeoutError`` after *timeout* seconds, and the connection's own error if
        it fails meanwhile: then whether RabbitMQ took the unsettled ones is unknown.
        """
        deadline = time.monotonic() + timeout
        while any(tag not in self._settled for tag in tags):
            left = deadline - time.monotonic()
            if left <= 0:
                unsettled = sorted(tag for tag in tags if tag not in self._settled)
                raise TimeoutError(f"RabbitMQ confirmed none of delivery tags {unsettled} "
                                   f"within {timeout:g}s")
            try:
                self.channel.connection.drain_events(timeout=left)
            except TimeoutError:  # socket.timeout: the loop says which tags are missing
                continue
        return {tag: self._settled.pop(tag) for tag in tags}

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, True)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, False)

    def _settle(self, delivery_tag: int, multiple: bool, taken: bool) -> None:
        tags = [t for t in self._pending if t <= delivery_tag] if multiple else [delivery_tag]
        for tag in tags:
            self._pending.discard(tag)
            unconfirmed = self._later.pop(tag, None)
            if unconfirmed is not None:
                unconfirmed.settle(None if taken else refused())
            else:
                self._settled[tag] = taken
