"""librdkafka's own lines, with each connection outage shown once per client and broker.

Every Kafka client of the package hands its lines to :data:`KAFKA_LOG` (librdkafka's
``logger`` setting), which writes them to the ``celery_scheduler.kafka`` logger. While a
broker is away, librdkafka writes a line for every attempt of every client to reach it,
about one a second each (``reconnect.backoff.max.ms``): a 10 s Kafka restart made two
dispatchers and two workers write about 2,000 of them. Here the first failure of a client to
reach a broker is written as it came, the next ones are counted, and once none came for a
few seconds one line says how long the failures lasted and how many were not shown (see
:mod:`celery_scheduler.outages`). Every other line passes as it is.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from celery_scheduler.outages import Ended
from celery_scheduler.repeats import Repeats

__all__ = ["KAFKA_LOG", "KafkaLog", "librdkafka_logger"]

# librdkafka's messages (a refused connection, a broker going away, ...) of every Kafka
# client of the package, producers, consumers and admin clients alike, so that an
# application silences or routes them by this one name.
librdkafka_logger = logging.getLogger("celery_scheduler.kafka")

# the lines that say a client cannot reach a broker (or any broker)
_UNREACHABLE = re.compile(
    r"Connect to .* failed|Connection refused|Disconnected|Receive failed|Send failed|"
    r"brokers are down|Failed to resolve|Connection reset|timed out|Broken pipe")
# "[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to ..." names the broker
_BROKER = re.compile(r"(?:\[thrd:[^\]]*\]: )?([^\s/\[]+)/[^\s:]+: ")
# no failure for this long from a client to a broker: that outage is over
QUIET_SECONDS = 5.0


class KafkaLog:
    """What librdkafka calls with each line: ``log(level, "%s [%s] %s", facility, client,
    text)``, as confluent-kafka hands them over."""

    def __init__(self, target: logging.Logger = librdkafka_logger,
                 clock: Callable[[], float] = time.monotonic, quiet: float = QUIET_SECONDS) -> None:
        self.target = target
        self.repeats: Repeats[tuple[str, str]] = Repeats(self._ended, quiet, clock)

    def log(self, level: int, msg: str, *args: Any) -> None:
        text = str(args[2]) if len(args) == 3 else ""
        if level < logging.WARNING or not _UNREACHABLE.search(text):
            self.target.log(level, msg, *args)
            return
        found = _BROKER.match(text)
        if self.repeats.failed((str(args[1]), found.group(1) if found else "all brokers")):
            self.target.log(level, msg + " (repeats from this client to this broker are counted, "
                                         "not shown, until they stop)", *args)

    def flush(self, now: float | None = None) -> None:
        """Write a line for each outage with no failure for the quiet time."""
        self.repeats.flush(now)

    def _ended(self, outage: Ended[tuple[str, str]]) -> None:
        if not outage.hidden:
            return  # a lone failure: its own line said it all
        client, broker = outage.key
        self.target.info("%s: no connection failure to %s for %.0fs: %s", client, broker,
                         self.repeats.outages.quiet, outage.describe("the failures stopped"))


KAFKA_LOG = KafkaLog()
