"""Where a release goes: a Celery task to the broker
(:class:`~celery_scheduler.release.Publisher`), a delayed Kafka message
(``schedule_message``) to Kafka (:class:`~celery_scheduler.tasklog.delivery.KafkaDelivery`).
Each batch is split between them by kind and its results put back in order; traced tasks
get their release spans here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from celery_scheduler import wire
from celery_scheduler.clock import now_ms
from celery_scheduler.dispatcher.timetable import Loaded
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.messages import MESSAGE_TASK
from celery_scheduler.release import Publisher
from celery_scheduler.release.confirms import Unconfirmed
from celery_scheduler.tracing import DispatcherSpans

__all__ = ["Delivery", "Router", "held_by_worker"]


class Delivery(Protocol):
    """Releases delayed Kafka messages (see ``tasklog/delivery.py``)."""

    def deliver(self, items: list[tuple[ScheduleEnvelope, wire.Release]]) -> list[Exception | None]: ...


def held_by_worker(task: Loaded) -> bool:
    """Whether *task*'s release may go to the broker before it is due: a Celery task's
    worker holds it until its ``eta``; a delayed message's reader of the topic would not."""
    return task.envelope.task != MESSAGE_TASK


class Router:
    """Routes each release of a batch to the Celery *publisher* or to :attr:`delivery`."""

    def __init__(self, publisher: Publisher, spans: DispatcherSpans,
                 delivery: Delivery | None = None) -> None:
        self.publisher = publisher
        self.spans = spans
        self.delivery = delivery  # set once the engine it reports to is made

    def publish(self, task: Loaded, release: wire.Release) -> None:
        [error] = self.publish_many([(task, release)])
        if error is not None:
            raise error

    def prepare_many(self, items: list[tuple[Loaded, wire.Release]]) -> list[Any]:
        """Each Celery release's message built ahead (see ``Publisher.prepare_many``)."""
        tasks = [i for i, (task, _) in enumerate(items) if task.envelope.task != MESSAGE_TASK]
        prepared: list[Any] = [None] * len(items)
        built = self.publisher.prepare_many([(items[i][0].envelope, items[i][1]) for i in tasks])
        for i, message in zip(tasks, built, strict=True):
            prepared[i] = message
        return prepared

    def send_prepared(self, items: list[tuple[Loaded, wire.Release]], prepared: list[Any]
                       ) -> list[Exception | Unconfirmed | None]:
        """The on-time sender's publish: RabbitMQ's confirms are collected while it waits."""
        return self._publish_mixed(items, prepared, confirm_later=True)

    def publish_many(self, items: list[tuple[Loaded, wire.Release]]) -> list[Exception | None]:
        # without confirm_later every result is final
        return cast(list[Exception | None], self._publish_mixed(items, None, confirm_later=False))

    def _publish_mixed(self, items: list[tuple[Loaded, wire.Release]], prepared: list[Any] | None,
                       confirm_later: bool) -> list[Exception | Unconfirmed | None]:
        """Each release to Celery, or for a delayed message to Kafka; results in *items*' order.

        *prepared* holds what :meth:`prepare_many` built for each (or None); with
        *confirm_later*, see ``Publisher.publish_many``."""
        if not self.spans.enabled:
            return self._publish_routed(items, prepared, confirm_later)
        started = now_ms()
        results = self._publish_routed(items, prepared, confirm_later)
        self.spans.released([(task.envelope, release, result if isinstance(result, Exception) else None)
                             for (task, release), result in zip(items, results, strict=True)],
                            started, now_ms())
        return results

    def _publish_routed(self, items: list[tuple[Loaded, wire.Release]], prepared: list[Any] | None,
                        confirm_later: bool) -> list[Exception | Unconfirmed | None]:
        messages = [i for i, (task, _) in enumerate(items) if task.envelope.task == MESSAGE_TASK]
        if not messages:
            return self.publisher.publish_many([(task.envelope, release) for task, release in items],
                                               prepared, confirm_later=confirm_later)
        results: list[Exception | Unconfirmed | None] = [None] * len(items)
        tasks = [i for i in range(len(items)) if i not in set(messages)]

        def chosen(indexes: list[int]) -> list[tuple[ScheduleEnvelope, wire.Release]]:
            return [(items[i][0].envelope, items[i][1]) for i in indexes]

        assert self.delivery is not None, "a delayed message is released before delivery is set"
        sent: list[tuple[list[int], Sequence[Exception | Unconfirmed | None]]] = [
            (messages, self.delivery.deliver(chosen(messages)))]
        if tasks:
            sent.append((tasks, self.publisher.publish_many(
                chosen(tasks), None if prepared is None else [prepared[i] for i in tasks],
                confirm_later=confirm_later)))
        for indexes, outcomes in sent:
            for i, result in zip(indexes, outcomes, strict=True):
                results[i] = result
        return results
