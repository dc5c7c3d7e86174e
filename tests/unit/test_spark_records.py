"""The executor side of bulk scheduling: a row becomes a record, or says why not (no Spark)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from celery_scheduler.client import get_client
from celery_scheduler.decoding import decode
from celery_scheduler.partitioner import partition_for
from celery_scheduler.spark.bulk import _AT_US, _Plan, _records
from tests.unit.apps import app, remind


class Row(dict[str, Any]):
    def asDict(self) -> dict[str, Any]:
        return dict(self)


def test_rows_become_the_records_a_schedule_call_would_produce_or_their_errors() -> None:
    # a time between two milliseconds: both paths round it up to the same key
    later = dt.datetime.now(dt.timezone.utc).replace(microsecond=123_456) + dt.timedelta(hours=1)
    at_us = int(later.timestamp()) * 1_000_000 + 123_456
    plan = _Plan(remind, get_client(app).settings, 12, "when", ["who"], {"kind": "what"},
                 None, None, None)
    rows = [Row(who="c1", what="welcome", when=later, **{_AT_US: at_us}),
            Row(who="", what="x", when=later, **{_AT_US: at_us}),
            Row(who="c3", what="x", when="soon", **{_AT_US: None})]
    good, empty, timeless = list(_records(plan, iter(rows)))

    key, value, partition, headers, *errors = good
    envelope = decode(value)
    expected = remind.build(["c1"], {"kind": "welcome"}, at=later)  # what schedule_at sends
    assert envelope == dataclasses.replace(expected, enqueued_ms=envelope.enqueued_ms)
    assert envelope.key.scheduled_ms == at_us // 1000 + 1
    assert key == b"c1" and partition == partition_for("c1", 12) and headers is None
    assert errors == [None, None, None]
    assert empty[:4] == (None, None, None, None) and empty[5] == "InvalidKeyError"
    assert '"who": ""' in empty[4]
    assert timeless[5] == "ScheduleTimeError" and "'soon' is not a time" in timeless[6]
