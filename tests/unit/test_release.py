from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from celery_scheduler.envelope import ScheduleEnvelope, encode_arguments
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import CELERY_RETRIES_EXHAUSTED, publish
from celery_scheduler.release.message import _tagged
from celery_scheduler.release.redis_push import _plain
from celery_scheduler.wire import HEADER, Release, parse_header

KEY = TaskKey("customer-42", 1_893_456_000_000, "welcome")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


class RecordingApp:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append((name, options))


def released(options: dict[str, Any], args: list[Any] | None = None,
             now: dt.datetime = NOW) -> dict[str, Any]:
    encoded_args, encoded_kwargs = encode_arguments(args or ["customer-42"], {"kind": "welcome"})
    envelope = ScheduleEnvelope(KEY, "proj.remind", encoded_args, encoded_kwargs, options)
    app = RecordingApp()
    publish(app, envelope, Release(KEY, 3, 2, 7), now=now)
    [(name, sent)] = app.sent
    assert name == "proj.remind"
    return sent


def test_release_carries_key_attempt_and_deterministic_id() -> None:
    sent = released({"queue": "mail", "priority": 5, "headers": {"trace": "abc"}})
    assert sent["task_id"] == KEY.task_id
    assert (sent["queue"], sent["priority"]) == ("mail", 5)
    assert sent["headers"]["trace"] == "abc"
    assert parse_header(sent["headers"][HEADER]) == Release(KEY, 3, 2, 7)
    assert sent["retries"] == CELERY_RETRIES_EXHAUSTED  # Celery's own retry defers to ours
    assert (sent["args"], sent["kwargs"]) == (["customer-42"], {"kind": "welcome"})


def test_a_chosen_task_id_is_the_runs_id() -> None:
    sent = released({"task_id": "my-own-id", "queue": "mail"})
    assert sent["task_id"] == "my-own-id" and "task_id" not in sent["headers"]
    assert parse_header(sent["headers"][HEADER]) == Release(KEY, 3, 2, 7)  # the key still rules


def test_release_is_json_even_when_the_app_pickles() -> None:
    # the app's task_serializer (pickle, say) never applies to a released task
    assert released({})["serializer"] == "json"


def test_time_limits_are_the_users_own() -> None:
    # a running task beats to keep its lease: no limit is put on it, and the user's stand
    assert "time_limit" not in released({}) and "soft_time_limit" not in released({})
    assert released({"time_limit": 3600})["time_limit"] == 3600
    assert released({"soft_time_limit": 900})["soft_time_limit"] == 900


def test_expires_counts_from_the_scheduled_time_whenever_the_release_goes() -> None:
    # KEY is due at NOW: a late release carries the same deadline, which the worker keeps
    assert released({"expires": 30})["expires"] == NOW + dt.timedelta(seconds=30)
    late = released({"expires": 30}, now=NOW + dt.timedelta(seconds=20))
    assert late["expires"] == NOW + dt.timedelta(seconds=30)


def test_tagged_arguments_arrive_as_objects() -> None:
    ident = uuid.UUID(int=5)
    sent = released({}, args=[NOW, ident])
    assert sent["args"] == [NOW, ident]


def test_foreign_headers_are_not_ours() -> None:
    assert parse_header(None) is None
    assert parse_header("not json") is None
    assert parse_header('{"o": "x"}') is None


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_only_json_types_are_plain_however_deep() -> None:
    assert _plain(nested(50, "text")) and _plain(nested(50, None)) and _plain([1, 2.5, True, ()])
    assert not _plain(nested(50, uuid.UUID(int=5)))  # kombu tags it; orjson would not
    assert not _plain(nested(3, b"bytes")) and not _plain({"a": {1: "a number as a key"}})
    class Text(str):
        pass
    assert not _plain({"a": [Text("a subclass")]})
    assert not _plain(nested(100_000, "deeper than the interpreter recurses"))


def test_a_tag_is_found_however_deep_and_only_in_dicts_and_lists() -> None:
    assert _tagged(nested(50, {"__type__": "datetime", "__value__": "2030-01-01T00:00:00"}))
    assert not _tagged(nested(50, "__type__")) and not _tagged(nested(50, {"type": 1}))
    assert not _tagged(("a tuple is not decoded JSON", {"__type__": "uuid"}))
