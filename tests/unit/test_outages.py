"""An outage is logged once when it starts and once when it ends, with what was not shown."""

from __future__ import annotations

import logging
import time

import pytest

from celery_scheduler.outages import Outages
from celery_scheduler.repeats import QuietRepeats
from celery_scheduler.tasklog.kafka_log import KafkaLog
from tests.unit.fakes import SecondsClock

REFUSED = ("[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to "
           "ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)")
REFUSED_BY_ID = REFUSED.replace("/bootstrap", "/1")
FORMAT = "%s [%s] %s"  # what confluent-kafka calls log() with


def test_the_first_failure_is_shown_the_rest_counted_and_the_end_says_so() -> None:
    outages: Outages[str] = Outages(quiet=5, remind=300)
    assert outages.failed("store", 0.0)
    assert [outages.failed("store", t) for t in (1.0, 2.0, 3.0)] == [False] * 3
    assert outages.failed("broker", 2.5)  # another source has an outage of its own
    ended = outages.recovered("store", 4.0)
    assert ended is not None and (ended.lasted, ended.hidden) == (4.0, 3)
    assert ended.describe("it failed") == "it failed after 4.0s; 3 repeated failure(s) not shown"
    assert outages.recovered("store", 5.0) is None  # over already
    assert outages.failed("store", 6.0)  # a new outage
    assert sorted(e.key for e in outages.all_recovered(7.0)) == ["broker", "store"]
    assert not outages


def test_a_source_that_reports_only_failures_ends_once_quiet_and_a_long_one_is_reminded() -> None:
    outages: Outages[str] = Outages(quiet=5, remind=60)
    assert outages.failed("kafka", 0.0)
    shown = [outages.failed("kafka", float(t)) for t in range(1, 121)]
    assert shown.count(True) == 2 and shown[59] and shown[119]  # at 60 s and 120 s
    assert outages.quieted(124.0) == []
    [ended] = outages.quieted(125.0)
    assert (ended.lasted, ended.hidden) == (120.0, 118)


@pytest.fixture
def kafka_log(caplog: pytest.LogCaptureFixture) -> tuple[KafkaLog, SecondsClock]:
    caplog.set_level(logging.DEBUG, logger="test.kafka")
    clock = SecondsClock()
    return KafkaLog(logging.getLogger("test.kafka"), clock, quiet=5), clock


def test_librdkafka_lines_of_an_outage_shown_once_per_client_and_broker(
        kafka_log: tuple[KafkaLog, SecondsClock], caplog: pytest.LogCaptureFixture) -> None:
    log, clock = kafka_log
    for second in range(10):  # two clients, each trying the broker every second
        clock.now = float(second)
        log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#producer-1", REFUSED)
        log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#producer-1", REFUSED_BY_ID)
        log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#consumer-2", REFUSED)
    log.log(logging.ERROR, FORMAT, "ERROR", "rdkafka#consumer-2", "1/1 brokers are down")
    log.log(logging.WARNING, FORMAT, "CONFWARN", "rdkafka#producer-1", "a setting is odd")
    log.log(logging.INFO, FORMAT, "INFO", "rdkafka#producer-1", "Disconnected (after 10ms)")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines  # each client once, the brokers-down line, and the others
    assert lines[0].startswith("FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9092/bootstrap]")
    assert lines[0].endswith("counted, not shown, until they stop)")
    assert "a setting is odd" in lines[3] and "Disconnected" in lines[4]  # passed as they are

    clock.now = 13.0
    log.flush()
    assert len(caplog.records) == 5  # not quiet for 5 s yet
    clock.now = 14.0
    log.flush()
    ended = sorted(r.getMessage() for r in caplog.records[5:])
    assert ended == [
        "rdkafka#consumer-2: no connection failure to 127.0.0.1:9092 for 5s: the failures stopped"
        " after 9.0s; 9 repeated failure(s) not shown",
        "rdkafka#producer-1: no connection failure to 127.0.0.1:9092 for 5s: the failures stopped"
        " after 9.0s; 19 repeated failure(s) not shown",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records[5:])  # a lone failure: no end line
    clock.now = 20.0
    log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#producer-1", REFUSED)  # a new outage
    assert caplog.records[-1].getMessage().endswith("until they stop)")


def test_the_watcher_thread_ends_a_quiet_outage_on_its_own(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.kafka.watched")
    log = KafkaLog(logging.getLogger("test.kafka.watched"), quiet=0.5)
    log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#producer-9", REFUSED)
    log.log(logging.ERROR, FORMAT, "FAIL", "rdkafka#producer-9", REFUSED)
    deadline = time.monotonic() + 10
    while len(caplog.records) < 2:
        assert time.monotonic() < deadline, caplog.records
        time.sleep(0.1)
    assert "the failures stopped after" in caplog.records[1].getMessage()
    assert not log.repeats.outages


def test_another_librarys_repeated_warnings_are_shown_once_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    quiet = QuietRepeats(quiet=5.0)
    clock = SecondsClock()
    quiet.repeats.clock = clock
    record = logging.LogRecord  # what a handler's filter is given

    def line(name: str, level: int, msg: str, *args: object) -> bool:
        return quiet.filter(record(name, level, __file__, 1, msg, args, None))

    reconnect = "Error attempting to reconnect to %s, scheduling retry in %s seconds: %s"
    shown = [line("cassandra.pool", logging.WARNING, reconnect, "127.0.0.1:9042", 1.0, "refused")
             for _ in range(8)]
    assert shown == [True] + [False] * 7
    assert line("cassandra.cluster", logging.WARNING, "Host %s has been marked down", "h")
    assert line("cassandra.pool", logging.INFO, reconnect, "h", 1.0, "x")  # below WARNING: all
    assert all(line("celery_scheduler.dispatcher.engine", logging.WARNING, "own %s", n)
               for n in range(3))  # the package's own lines say an outage once themselves
    caplog.set_level(logging.INFO, logger="cassandra.pool")
    clock.now = 10.0
    quiet.repeats.flush()
    [summary] = [r for r in caplog.records if r.name == "cassandra.pool"]
    assert summary.levelno == logging.INFO and summary.getMessage().startswith(
        "7 more line(s) like 'Error attempting to reconnect to %s")
