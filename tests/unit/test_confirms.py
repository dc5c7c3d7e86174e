"""RabbitMQ's confirms settle each message once, whenever py-amqp happens to read them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from celery_scheduler.errors import ReleaseNotSentError
from celery_scheduler.release.confirms import Confirms


class Channel:
    """py-amqp's channel as Confirms uses it: events fired as frames are read."""

    def __init__(self) -> None:
        self.events: dict[str, set[Any]] = defaultdict(set)
        self.connection = self
        self.frames: list[tuple[str, int, bool]] = []  # read at the next drain_events

    def confirm_select(self) -> None:
        pass

    def answer(self, method: str, tag: int, multiple: bool = False) -> None:
        for callback in self.events[method]:
            callback(tag, multiple)

    def drain_events(self, timeout: float) -> None:
        frames, self.frames = self.frames, []
        if not frames:
            raise TimeoutError
        for method, tag, multiple in frames:
            self.answer(method, tag, multiple)


def test_an_answer_read_before_the_message_is_given_later_settles_it() -> None:
    channel = Channel()
    confirms = Confirms(channel)
    first, second = confirms.published(), confirms.published()
    # py-amqp read the answers while the batch was published, before later() was called
    channel.answer("basic_ack", first)
    channel.answer("basic_nack", second)
    taken, refused = confirms.later(first), confirms.later(second)
    assert taken.done and taken.result is None
    assert refused.done and isinstance(refused.result, ReleaseNotSentError)
    assert confirms.unsettled == 0


def test_answers_read_later_settle_each_message_once_with_multiple_acks() -> None:
    channel = Channel()
    confirms = Confirms(channel)
    tags = [confirms.published() for _ in range(3)]
    later = [confirms.later(tag) for tag in tags]
    assert confirms.unsettled == 3 and not any(u.done for u in later)
    channel.frames = [("basic_ack", 2, True), ("basic_nack", 3, False)]
    confirms.drain(0.0)
    assert [u.result for u in later[:2]] == [None, None]
    assert isinstance(later[2].result, ReleaseNotSentError)
    assert confirms.unsettled == 0 and confirms.oldest() is None


def test_waited_tags_are_settled_from_answers_read_before_the_wait() -> None:
    channel = Channel()
    confirms = Confirms(channel)
    tags = [confirms.published() for _ in range(2)]
    channel.answer("basic_ack", tags[0])
    channel.frames = [("basic_nack", tags[1], False)]
    assert confirms.wait(tags, 1.0) == {tags[0]: True, tags[1]: False}
