"""A release sent through the dispatcher's producer is the message ``app.send_task`` sends.

``send_release`` skips what only a caller waiting for a result needs; everything a worker,
Flower or a ``before_task_publish`` handler sees must stay the same. Both paths publish
to Celery's in-memory transport here and every published field is compared.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import after_task_publish, before_task_publish

from celery_scheduler.envelope import ScheduleEnvelope, encode_arguments
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import publish
from celery_scheduler.wire import Release

KEY = TaskKey("customer-42", 1_893_456_000_000, "welcome")
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
RELEASE = Release(KEY, 3, 2, 7)

app = Celery("release-message", broker="memory://", backend="cache+memory://",
             set_as_current=False)
app.conf.task_routes = {"proj.routed": {"queue": "routed-by-app"}}


@app.task(name="proj.defaults", time_limit=60,
          soft_time_limit=50)
def defaults(customer: str, kind: str = "") -> None:
    pass


@app.task(name="proj.routed")
def routed(customer: str, kind: str = "") -> None:
    pass


@app.task(name="proj.expiring", expires=600)
def expiring(customer: str, kind: str = "") -> None:
    pass


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def before(sender: str, body: Any, exchange: str, routing_key: str, headers: dict[str, Any],
               properties: dict[str, Any], declare: Any, retry_policy: Any, **_: Any) -> None:
        seen.append({"task": sender, "body": body, "exchange": exchange,
                     "routing_key": routing_key, "headers": dict(headers),
                     "properties": dict(properties), "declare": list(declare or []),
                     "retry_policy": retry_policy})

    def after(sender: str, **_: Any) -> None:
        seen.append({"after": sender})

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    yield seen
    before_task_publish.disconnect(before)
    after_task_publish.disconnect(after)


def both_ways(published: list[dict[str, Any]], task: str, options: dict[str, Any],
              release: Release = RELEASE) -> tuple[dict[str, Any], dict[str, Any]]:
    """The message Celery's send_task sends, then the one the dispatcher's path sends."""
    args, kwargs = encode_arguments(["customer-42"], {"kind": "welcome"})
    envelope = ScheduleEnvelope(KEY, task, args, kwargs, options)
    with app.producer_or_acquire() as producer:
        original = app.send_task
        try:
            # the same publish(), once forced through Celery's own send_task
            app.send_task = lambda *a, **kw: original(*a, **dict(kw, producer=producer))  # type: ignore[method-assign]
            publish(app, envelope, release, now=NOW, producer=None)
        finally:
            del app.send_task
        publish(app, envelope, release, now=NOW, producer=producer)
    before_celery, after_celery, before_ours, after_ours = published
    assert after_celery == after_ours == {"after": task}
    return before_celery, before_ours


def comparable(sent: dict[str, Any]) -> dict[str, Any]:
    sent = dict(sent, headers=dict(sent["headers"]), properties=dict(sent["properties"]))
    expires = sent["headers"].pop("expires", None)
    expiration = sent["properties"].pop("expiration", None)
    return dict(sent, expires=expires, expiration=None if expiration is None else round(expiration))


@pytest.mark.parametrize(("task", "options"), [
    ("proj.unregistered", {}),
    ("proj.unregistered", {"queue": "mail", "priority": 5, "headers": {"trace": "abc"}}),
    ("proj.unregistered", {"exchange": "jobs", "routing_key": "jobs.mail"}),
    ("proj.unregistered", {"shadow": "shown-as", "soft_time_limit": 30, "time_limit": 40}),
    ("proj.unregistered", {"expires": 600}),
    ("proj.defaults", {}),
    ("proj.defaults", {"queue": "chosen", "time_limit": 20}),
    ("proj.routed", {}),
])
def test_the_dispatchers_message_is_celerys(published: list[dict[str, Any]], task: str,
                                            options: dict[str, Any]) -> None:
    celery, ours = both_ways(published, task, options)
    assert comparable(ours) == comparable(celery)
    assert ours["headers"]["id"] == KEY.task_id


def test_an_expiring_release_says_when_in_the_header_and_to_the_broker(
        published: list[dict[str, Any]]) -> None:
    celery, ours = both_ways(published, "proj.unregistered", {"expires": 600})
    assert ours["headers"]["expires"] == celery["headers"]["expires"] == (
        NOW + dt.timedelta(seconds=600)).isoformat()
    # the broker's TTL counts from the send, and NOW is years ahead
    assert ours["properties"]["expiration"] == pytest.approx(
        celery["properties"]["expiration"], abs=5)


def test_the_decorators_options_apply_unless_the_schedule_call_chose_others(
        published: list[dict[str, Any]]) -> None:
    _, chosen = both_ways(published, "proj.defaults", {"queue": "chosen", "time_limit": 20})
    assert chosen["routing_key"] == "chosen"
    # the call's hard limit, the decorator's soft one
    assert chosen["headers"]["timelimit"] == [20.0, 50]


def test_a_release_sent_ahead_of_its_due_time_carries_it_as_celerys_eta(
        published: list[dict[str, Any]]) -> None:
    due = NOW + dt.timedelta(milliseconds=250)
    ahead = Release(KEY, 3, 2, 7, 0, int(due.timestamp() * 1000))
    celery, ours = both_ways(published, "proj.unregistered", {"expires": 600}, ahead)
    assert comparable(ours) == comparable(celery)
    assert ours["headers"]["eta"] == due.isoformat()
    # an expiry counts from the scheduled time (KEY's is NOW), however early it is sent
    assert ours["headers"]["expires"] == (NOW + dt.timedelta(seconds=600)).isoformat()
    # one already due is sent without: the worker runs it at once
    late = Release(KEY, 3, 2, 7, 0, int(NOW.timestamp() * 1000) - 1)
    published.clear()
    _, now = both_ways(published, "proj.unregistered", {}, late)
    assert now["headers"]["eta"] is None


def test_a_tasks_own_expiry_in_seconds_counts_from_the_send_as_celerys_does(
        published: list[dict[str, Any]]) -> None:
    celery, ours = both_ways(published, "proj.expiring", {})
    ours_at, celery_at = (dt.datetime.fromisoformat(sent["headers"]["expires"]) for sent in (ours, celery))
    assert abs((ours_at - celery_at).total_seconds()) < 5
    assert abs((ours_at - dt.datetime.now(dt.timezone.utc)).total_seconds() - 600) < 5
    assert ours["properties"]["expiration"] == pytest.approx(
        celery["properties"]["expiration"], abs=5)
