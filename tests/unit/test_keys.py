from __future__ import annotations

import copy
import datetime as dt
import os
import pickle
import subprocess
import sys
import uuid
import zoneinfo

import pytest

from celery_scheduler.errors import ScheduleTimeError
from celery_scheduler.keys import TASK_ID_NAMESPACE, TaskKey, from_epoch_ms, to_epoch_ms

UTC = dt.timezone.utc


def test_aware_datetimes_convert_exactly_to_milliseconds() -> None:
    when = dt.datetime(2030, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
    assert to_epoch_ms(when, UTC) == 1_893_456_000_123
    assert from_epoch_ms(1_893_456_000_123) == when


@pytest.mark.parametrize("microsecond", [122_001, 122_500, 122_999])
def test_a_fraction_of_a_millisecond_rounds_up_so_a_task_is_never_early(microsecond: int) -> None:
    when = dt.datetime(2030, 1, 1, 0, 0, 0, microsecond, tzinfo=UTC)
    assert to_epoch_ms(when, UTC) == 1_893_456_000_123
    assert from_epoch_ms(to_epoch_ms(when, UTC)) > when


def test_naive_datetimes_are_read_in_the_given_zone() -> None:
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    naive = dt.datetime(2030, 7, 1, 12, 0)
    assert to_epoch_ms(naive, berlin) == to_epoch_ms(dt.datetime(2030, 7, 1, 10, 0, tzinfo=UTC), UTC)


def test_zones_with_localize_are_localized_not_replaced() -> None:
    # pytz zones must be attached with localize(); replace(tzinfo=...) gives LMT offsets
    class LocalizingZone(dt.tzinfo):
        def localize(self, naive: dt.datetime) -> dt.datetime:
            return naive.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5)))

        def utcoffset(self, value: object) -> dt.timedelta:
            return dt.timedelta(hours=-4, minutes=-56)  # what replace() would wrongly use

    naive = dt.datetime(2030, 1, 1, 12, 0)
    assert to_epoch_ms(naive, LocalizingZone()) == to_epoch_ms(
        dt.datetime(2030, 1, 1, 17, 0, tzinfo=UTC), UTC)


@pytest.mark.parametrize("when", [dt.datetime(1960, 1, 1, tzinfo=UTC), dt.date(2030, 1, 1), "2030",
                                  dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)])
def test_unusable_times(when: object) -> None:
    with pytest.raises(ScheduleTimeError):
        to_epoch_ms(when, UTC)


def test_task_id_is_deterministic_and_distinct_per_key() -> None:
    a = TaskKey("o", 1, "u")
    assert a.task_id == TaskKey("o", 1, "u").task_id
    assert len({a.task_id, TaskKey("o", 2, "u").task_id, TaskKey("o", 1, "v").task_id,
                TaskKey("o\x1f1", 1, "u").task_id}) == 4
    assert str(a) == "o@1970-01-01T00:00:00.001000+00:00#u"


@pytest.mark.parametrize("key", [
    TaskKey("o", 1, "u"), TaskKey("o-17", 1_893_456_000_123, "seq-4"),
    TaskKey("ordre\u00e9\u4e2d", 253402300799999, "\U0001f600" * 40), TaskKey("x" * 512, 0, "y" * 512),
])
def test_task_id_is_the_uuid5_of_the_key_within_the_projects_namespace(key: TaskKey) -> None:
    # ids of tasks already released must not change from one version to the next
    name = f"{key.ordering_id}\x1f{key.scheduled_ms}\x1f{key.uniqueness_key}"
    assert key.task_id == str(uuid.uuid5(TASK_ID_NAMESPACE, name))


def test_a_key_sent_to_another_process_hashes_as_that_process_hashes_it() -> None:
    # the hash a key keeps is of its strings, which another interpreter hashes differently
    key = TaskKey("customer-42", 1_893_456_000_000, "welcome")
    assert hash(key) == hash(TaskKey("customer-42", 1_893_456_000_000, "welcome"))
    key.task_id  # noqa: B018 - kept on the key too
    code = ("import pickle, sys; key = pickle.loads(sys.stdin.buffer.read()); "
            "from celery_scheduler.keys import TaskKey; "
            "fresh = TaskKey('customer-42', 1_893_456_000_000, 'welcome'); "
            "print(hash(key) == hash(fresh), {fresh: 1}.get(key), key == fresh)")
    result = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(key), capture_output=True,
                            check=True, env={**os.environ, "PYTHONHASHSEED": "random"})
    assert result.stdout.split() == [b"True", b"1", b"True"]
    assert copy.copy(key) == key and hash(copy.deepcopy(key)) == hash(key)
    assert repr(key) == ("TaskKey(ordering_id='customer-42', scheduled_ms=1893456000000, "
                         "uniqueness_key='welcome')")
