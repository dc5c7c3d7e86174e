"""RabbitMQ publisher confirms for a batch of releases.

Without confirms, a message RabbitMQ had not yet taken when it died is gone, and the task
waits for its lease to be released again. In confirm mode (``confirm.select``), RabbitMQ
numbers the messages published on a channel 1, 2, 3, ... and acknowledges each (or several
at once, ``multiple``) once it has taken responsibility for it, or refuses it (``nack``).
The dispatcher publishes a step's releases one after the other without waiting, then waits
once for all of them: a release counts as sent only when its acknowledgement came back.

This is kombu's ``confirm_publish`` transport option done per batch: that option waits for
each message before sending the next, a round trip each.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Confirms", "supports_confirms"]


def supports_confirms(channel: Any) -> bool:
    """Whether *channel* is a py-amqp channel, which RabbitMQ's confirm mode works on."""
    return hasattr(channel, "confirm_select") and hasattr(channel, "events")


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
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.confirm_select()
        channel._confirm_selected = True  # py-amqp's own flag: never select twice

    def published(self) -> int:
        """Note one message published on the channel; its delivery tag."""
        self._last_tag += 1
        self._pending.add(self._last_tag)
        return self._last_tag

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
            self._settled[tag] = taken
