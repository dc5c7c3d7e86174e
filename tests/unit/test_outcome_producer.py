"""A worker's outcome producer that stops delivering is replaced; outcomes go on through the new one.

Long chaos runs left some workers' producers, after a Kafka restart, failing every outcome
for many minutes while other processes wrote to the same broker: each of those tasks ran a
second time once its lease ended. The producers here are fakes that report each record when
polled, as the Kafka client does; the clock is the test's.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from celery_scheduler.config import Settings
from celery_scheduler.keys import TaskKey
from celery_scheduler.tasklog import outcome_producer
from celery_scheduler.wire import Outcome
from tests.unit.fakes import FakeProducer, SecondsClock

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)


def _outcome(n: int) -> Outcome:
    return Outcome(TaskKey("o1", 1_700_000_000_000 + n, "u"), 3, 1, True, None)


class Made(list[FakeProducer]):
    """The producers made so far; each new one fails every record with ``error``."""

    error: KafkaError | None = None


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    made = Made()

    def new(self: outcome_producer.OutcomeProducer) -> FakeProducer:
        made.append(FakeProducer(error=made.error))
        return made[-1]

    monkeypatch.setattr(outcome_producer.OutcomeProducer, "_new_producer", new)
    return made


def test_a_producer_whose_outcomes_keep_failing_is_replaced(made: Made) -> None:
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    first = made[0]
    first.error = TIMED_OUT
    producer.send(_outcome(1))  # reported at once: failing from now
    producer.send(_outcome(2))
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS / 2
    producer.send(_outcome(3))
    assert producer.replaced == 0  # failing, but not for long yet
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS
    producer.send(_outcome(4))
    assert producer.replaced == 1 and first.purged and len(made) == 2
    # what the first did not deliver goes again, before the new outcome
    assert made[1].values() == [_outcome(n).encode() for n in (1, 2, 3, 4)]
    # the replaced producer's late failures do not count against the new one
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS * 2
    producer.send(_outcome(5))
    producer.send(_outcome(6))
    assert producer.replaced == 1 and len(made[1].produced) == 6


def test_one_success_ends_a_run_of_failures(made: Made) -> None:
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    made[0].error = TIMED_OUT
    producer.send(_outcome(1))  # reported at once: failing from now
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS / 2
    made[0].error = None
    producer.send(_outcome(2))  # delivered
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS * 2
    producer.send(_outcome(3))
    assert producer.replaced == 0 and len(made) == 1


def test_a_producer_that_reports_nothing_while_records_wait_is_replaced(made: Made) -> None:
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    first = made[0]
    first.silent = True
    producer.send(_outcome(1))
    clock.now += outcome_producer.STUCK_AFTER_SECONDS / 2
    producer.send(_outcome(2))
    producer.poll()
    assert producer.replaced == 0  # waiting, but not for long yet
    clock.now += outcome_producer.STUCK_AFTER_SECONDS
    producer.poll()  # the beats' thread polls: no outcome needed to find it stuck
    assert producer.replaced == 1 and first.purged and len(made) == 2
    assert made[1].values() == [_outcome(n).encode() for n in (1, 2)]  # sent again


def test_a_producer_idle_for_long_is_not_stuck(made: Made) -> None:
    """Its last reports were only not served yet: nothing waits once they are."""
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    producer.send(_outcome(1))  # served at the next poll
    clock.now += outcome_producer.STUCK_AFTER_SECONDS * 10
    producer.send(_outcome(2))
    producer.poll()
    assert producer.replaced == 0 and len(made) == 1


def test_a_fatal_error_replaces_the_producer_at_the_next_outcome(made: Made) -> None:
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=SecondsClock(1000.0))
    producer._on_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    producer.send(_outcome(1))
    assert producer.replaced == 1 and made[0].purged and made[1].values() == [_outcome(1).encode()]


def test_an_outcome_goes_once_more_through_the_next_producer_not_again_and_again(made: Made,
                                                                               ) -> None:
    made.error = TIMED_OUT  # Kafka delivers nothing
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    producer.send(_outcome(1))
    producer.send(_outcome(2))
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS + 1
    producer.send(_outcome(3))
    assert producer.replaced == 1
    assert made[1].values() == [_outcome(n).encode() for n in (1, 2, 3)]
    clock.now += outcome_producer.REPLACE_AFTER_SECONDS + 1
    producer.send(_outcome(4))
    # 1 and 2 failed their second try: lost (their tasks run again at lease end); 3 goes on
    assert producer.replaced == 2
    assert made[2].values() == [_outcome(n).encode() for n in (3, 4)]


def test_an_outcome_that_timed_out_goes_again_as_soon_as_the_producer_delivers(made: Made) -> None:
    """A broker restart longer than the delivery timeout: the producer recovers, so it is
    not replaced, and the outcome it dropped meanwhile is sent again by it."""
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=SecondsClock(1000.0))
    made[0].error = TIMED_OUT
    producer.send(_outcome(1))  # timed out
    assert made[0].values() == [_outcome(1).encode()]
    made[0].error = None  # the broker is back
    producer.send(_outcome(2))  # delivered: 1 goes again
    assert made[0].values() == [_outcome(n).encode() for n in (1, 2, 1)]
    producer.send(_outcome(3))
    producer.flush(0)
    assert made[0].values() == [_outcome(n).encode() for n in (1, 2, 1, 3)]
    assert producer.replaced == 0 and len(made) == 1


def test_an_outcome_that_fails_its_second_send_is_not_sent_a_third_time(made: Made) -> None:
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=SecondsClock(1000.0))
    made[0].error = TIMED_OUT
    producer.send(_outcome(1))
    made[0].error = None
    producer.send(_outcome(2))  # 1 goes again ...
    made[0].error = TIMED_OUT
    producer.flush(0)  # ... and times out again: lost (its task runs again at lease end)
    made[0].error = None
    producer.send(_outcome(3))
    producer.flush(0)
    assert made[0].values() == [_outcome(n).encode() for n in (1, 2, 1, 3)]


def test_outcomes_gather_into_requests_unless_the_options_say_otherwise(made: Made) -> None:
    default = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=SecondsClock(1000.0))
    assert default._config["linger.ms"] == outcome_producer.OUTCOME_LINGER_MS == 50
    told = outcome_producer.OutcomeProducer(Settings(kafka_topic="t", kafka_options={"linger.ms": 2}),
                                  clock=SecondsClock(1000.0))
    assert told._config["linger.ms"] == 2
    # the delivery guarantees are not the options' to weaken
    assert told._config["acks"] == "all" and told._config["enable.idempotence"] is True


def test_an_outcome_purged_by_replacements_is_not_lost_however_often(made: Made) -> None:
    """A stalled Kafka controller: each new producer waits for a producer id, is found stuck
    and replaced in turn. What the replaced ones purged was never given to Kafka: it goes on
    through the next producer, as many times as that takes."""
    made.error = None
    clock = SecondsClock(1000.0)
    producer = outcome_producer.OutcomeProducer(Settings(kafka_topic="t"), clock=clock)
    made[0].silent = True
    producer.send(_outcome(1))
    for _ in range(4):  # four producers in a row report nothing and are replaced
        made[-1].silent = True
        clock.now += outcome_producer.STUCK_AFTER_SECONDS + 1
        producer.poll()
    assert producer.replaced == 4 and all(p.purged for p in made[:4])
    assert made[4].values() == [_outcome(1).encode()]  # still on its way, once
    producer.flush(0)  # the controller is back: delivered
    producer.send(_outcome(2))
    producer.flush(0)
    assert made[4].values() == [_outcome(n).encode() for n in (1, 2)]
