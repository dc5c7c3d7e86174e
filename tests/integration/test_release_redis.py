"""Releases pushed straight onto Redis lists are the documents kombu would have pushed.

The publisher pushes a release's document itself (``release_redis.RedisPush``) once its
route is declared; each test publishes the same releases with that push turned off, through
kombu's producer, and compares what reached Redis, field by field (all but the delivery tag,
a fresh UUID per message). A real Celery worker then runs pushed releases. Past the route's
first two releases, the documents are built from a template (``release_template``): the
cases publish five.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.app import amqp as celery_amqp
from celery.contrib.testing.worker import start_worker

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import Publisher
from celery_scheduler.release import message as release_message
from celery_scheduler.release import publisher as release_publisher
from celery_scheduler.release import redis_push as release_redis
from celery_scheduler.wire import Release
from tests.integration.private_redis import PrivateRedis

pytestmark = [pytest.mark.redis]

NOW = 1_893_456_000_000
QUEUE = "pushed"


def _app(url: str, **conf: Any) -> Celery:
    app = Celery("release-redis", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, broker_connection_timeout=2, **conf)

    @app.task(name="pushed.record", soft_time_limit=30, shared=False)
    def record(*args: Any, **kwargs: Any) -> None:
        return None

    return app


def _release(n: int, *, args: list[Any] | None = None, options: dict[str, Any] | None = None,
             ahead_ms: int = 0) -> tuple[ScheduleEnvelope, Release]:
    key = TaskKey(f"o{n}", NOW + n, f"u{n}")
    envelope = ScheduleEnvelope(key, "pushed.record", args=[n, "text", 1.5, None, [1, {"a": 2}]]
                                if args is None else args, kwargs={"k": n}, options=options or {})
    not_before = 0 if not ahead_ms else int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000) + ahead_ms
    return envelope, Release(key, n % 12, 1, 1, NOW + 300_000, not_before)


# Each case: a release's schedule-call options (and arguments), as users set them.
CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "priority": {"options": {"priority": 7}},
    "expires": {"options": {"expires": 120}},
    "own queue": {"options": {"queue": "elsewhere"}},
    "own headers": {"options": {"headers": {"team": "billing"}}},
    "time limits": {"options": {"time_limit": 60, "soft_time_limit": 20}},
    "sent ahead (eta)": {"ahead_ms": 60_000},
    "unicode": {"args": ["é ✓ \u2028", {"nested": ["ü"]}]},
    "routed by name": {"conf": {"task_routes": {"pushed.*": {"queue": "routed", "priority": 3}}}},
    "router function": {"conf": {"task_routes": [lambda name, args, kwargs, options, task=None, **kw:
                                                  {"queue": f"q{args[0] % 2}"}]}},
}


def _queued(url: str) -> dict[str, list[dict[str, Any]]]:
    """Each list in Redis (but kombu's bindings), its documents decoded, oldest first."""
    client = redis.Redis.from_url(url)
    found = {}
    for key in client.keys("*"):
        name = key.decode()
        if name.startswith("_kombu") or client.type(key) != b"list":
            continue
        found[name] = [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]
    return found


def _comparable(document: dict[str, Any]) -> dict[str, Any]:
    document = json.loads(json.dumps(document))
    document["properties"].pop("delivery_tag")
    document["headers"].pop("origin")  # the publishing process's pid and host: the same here
    document["body"] = json.loads(base64.b64decode(document["body"]))
    return document


def _publish_all(app: Celery, url: str, items: list[tuple[ScheduleEnvelope, Release]], *,
                 push: bool) -> dict[str, list[dict[str, Any]]]:
    redis.Redis.from_url(url).flushdb()
    publisher = Publisher(app, redis_push=push)
    try:
        for envelope, release in items:  # one a step, as a dispatcher sends at light load
            assert publisher.publish_many([(envelope, release)]) == [None]
    finally:
        publisher.close()
    return _queued(url)


@pytest.fixture
def counted_kombu_sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The task names sent through kombu's producer (not pushed)."""
    sent: list[str] = []
    real = celery_amqp.AMQP.send_task_message  # a cached property: Celery builds it per app

    def counting(self: Any) -> Any:
        send = real.__get__(self)

        def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> Any:
            sent.append(name)
            return send(producer, name, message, **options)
        return send_task_message

    monkeypatch.setattr(celery_amqp.AMQP, "send_task_message", property(counting))
    yield sent


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pushed_release_is_the_document_kombu_pushes(private_redis: PrivateRedis, case: str) -> None:
    spec = CASES[case]
    # the first release of a route declares its queue through kombu; the rest are pushed
    items = [_release(n, args=spec.get("args"), options=spec.get("options"),
                      ahead_ms=spec.get("ahead_ms", 0)) for n in range(5)]
    # one app: its reply_to (a per-app id) is in every message
    app = _app(private_redis.url, **spec.get("conf", {}))
    pushed = _publish_all(app, private_redis.url, items, push=True)
    through_kombu = _publish_all(app, private_redis.url, items, push=False)
    _assert_same_documents(pushed, through_kombu, len(items))


def _assert_same_documents(ours: dict[str, list[dict[str, Any]]], theirs: dict[str, list[dict[str, Any]]],
                           count: int) -> None:
    """Each queue's documents the same but for the delivery tag, and for the times taken when
    each was built (eta, expires), which are the same within a second."""
    assert ours.keys() == theirs.keys() and ours
    assert sum(len(documents) for documents in ours.values()) == count
    for name in ours:
        assert len(ours[name]) == len(theirs[name])
        for one, other in zip(ours[name], theirs[name], strict=True):
            one, other = _comparable(one), _comparable(other)
            for field in ("eta", "expires"):
                if one["headers"].get(field) is not None or other["headers"].get(field) is not None:
                    one_at, other_at = (dt.datetime.fromisoformat(d["headers"].pop(field))
                                        for d in (one, other))
                    assert abs((one_at - other_at).total_seconds()) < 1
            if "expiration" in one["properties"] or "expiration" in other["properties"]:
                assert abs(int(one["properties"].pop("expiration"))
                           - int(other["properties"].pop("expiration"))) < 1000
            assert one == other


def test_only_the_routes_first_release_goes_through_kombu(private_redis: PrivateRedis,
                                                          counted_kombu_sends: list[str]) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        items = [_release(n) for n in range(20)]
        assert publisher.publish_many(items[:1]) == [None]
        assert publisher.publish_many(items[1:]) == [None] * 19
        assert counted_kombu_sends == ["pushed.record"]
        queued = _queued(private_redis.url)[QUEUE]
        assert [d["headers"]["id"] for d in queued] == [r.key.task_id for _, r in items]
    finally:
        publisher.close()


def test_what_the_push_leaves_to_kombu_goes_through_kombu(private_redis: PrivateRedis,
                                                          counted_kombu_sends: list[str]) -> None:
    # arguments holding objects kombu's JSON tags, and an app that sends task-sent events
    tagged = _release(1, args=[{"__type__": "datetime", "__value__": "2030-01-01T00:00:00+00:00"}])
    for app, items in ((_app(private_redis.url), [_release(0), tagged]),
                       (_app(private_redis.url, task_send_sent_event=True), [_release(2), _release(3)]),
                       (_app(private_redis.url, task_compression="gzip"), [_release(4), _release(5)])):
        counted_kombu_sends.clear()
        publisher = Publisher(app)
        try:
            for item in items:
                assert publisher.publish_many([item]) == [None]
        finally:
            publisher.close()
        assert counted_kombu_sends == ["pushed.record"] * 2
    documents = _queued(private_redis.url)[QUEUE]
    body = json.loads(base64.b64decode(documents[1]["body"]))
    assert body[0] == [{"__type__": "datetime", "__value__": "2030-01-01T00:00:00+00:00"}]


def test_publish_signals_see_and_stamp_every_pushed_release(private_redis: PrivateRedis,
                                                            counted_kombu_sends: list[str]) -> None:
    before: list[str] = []
    after: list[tuple[str, str]] = []

    def stamp(sender: str, headers: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        headers["stamped"] = f"{sender}:{routing_key}"
        before.append(headers["id"])

    def published(sender: str, headers: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        after.append((headers["id"], routing_key))

    signals.before_task_publish.connect(stamp)
    signals.after_task_publish.connect(published)
    publisher = Publisher(_app(private_redis.url))
    try:
        items = [_release(n) for n in range(5)]
        for item in items:
            assert publisher.publish_many([item]) == [None]
    finally:
        publisher.close()
        signals.before_task_publish.disconnect(stamp)
        signals.after_task_publish.disconnect(published)
    ids = [release.key.task_id for _, release in items]
    assert len(counted_kombu_sends) == 1  # the rest were pushed, and signalled all the same
    assert before == ids and after == [(i, QUEUE) for i in ids]
    assert [d["headers"]["stamped"] for d in _queued(private_redis.url)[QUEUE]] == [
        f"pushed.record:{QUEUE}"] * 5


def test_a_celery_worker_runs_pushed_releases(private_redis: PrivateRedis,
                                              counted_kombu_sends: list[str]) -> None:
    app = _app(private_redis.url)
    ran: list[tuple[Any, ...]] = []
    done = threading.Event()

    @app.task(name="pushed.collect", shared=False)
    def collect(n: int, text: str) -> None:
        ran.append((n, text))
        if len(ran) == 10:
            done.set()

    publisher = Publisher(app)
    items = []
    for n in range(10):
        key = TaskKey(f"o{n}", NOW + n, "u")
        items.append((ScheduleEnvelope(key, "pushed.collect", args=[n, "é"]), Release(key, 0, 1, 1)))
    try:
        assert publisher.publish_many(items[:1]) + publisher.publish_many(items[1:]) == [None] * 10
    finally:
        publisher.close()
    assert len(counted_kombu_sends) == 1
    with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                      shutdown_timeout=10, queues=[QUEUE]):
        assert done.wait(30), f"the worker ran {ran}"
    assert sorted(ran) == [(n, "é") for n in range(10)]


def test_the_plain_check_leaves_other_values_to_kombus_encoder() -> None:
    assert release_redis._plain({"a": [1, 2.5, None, True, ("x",)]})
    assert not release_redis._plain({"a": dt.datetime(2030, 1, 1)})
    assert not release_redis._plain({1: "not a text key"})
    # kombu's encoder tags what orjson would write differently
    assert b"__type__" in release_redis._json({"at": dt.datetime(2030, 1, 1)})


def _built_ahead(app: Celery, url: str, items: list[tuple[ScheduleEnvelope, Release]]
                 ) -> dict[str, list[dict[str, Any]]]:
    """*items* published as a dispatcher's sender does: the first of the route at once (it
    declares the queue), the rest built ahead, then sent one a step."""
    redis.Redis.from_url(url).flushdb()
    publisher = Publisher(app)
    try:
        assert publisher.publish_many(items[:1]) == [None]
        prepared = publisher.prepare_many(items[1:])
        assert all(message is not None for message in prepared)
        for item, message in zip(items[1:], prepared, strict=True):
            assert publisher.publish_many([item], [message]) == [None]
    finally:
        publisher.close()
    return _queued(url)


# A release sent ahead with Celery's eta goes when it is marked: it is never built ahead. The
# router function sends to two queues, whose first messages each go through kombu.
@pytest.mark.parametrize("case", sorted(set(CASES) - {"sent ahead (eta)", "router function"}))
def test_a_release_built_ahead_is_the_document_built_when_sent(private_redis: PrivateRedis,
                                                                case: str) -> None:
    spec = CASES[case]
    items = [_release(n, args=spec.get("args"), options=spec.get("options")) for n in range(5)]
    app = _app(private_redis.url, **spec.get("conf", {}))
    ahead = _built_ahead(app, private_redis.url, items)
    when_sent = _publish_all(app, private_redis.url, items, push=True)
    _assert_same_documents(ahead, when_sent, len(items))


def test_only_a_declared_route_is_built_ahead(private_redis: PrivateRedis) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        first, second = _release(0), _release(1)
        elsewhere = _release(2, options={"queue": "elsewhere"})
        tagged = _release(3, args=[{"__type__": "datetime", "__value__": "2030-01-01T00:00:00+00:00"}])
        assert publisher.prepare_many([first]) == [None]  # nothing declared on no connection yet
        assert publisher.publish_many([first]) == [None]
        built = publisher.prepare_many([second, elsewhere, tagged])
        assert built[0] is not None
        assert built[1] is None  # its queue is declared by its first message, through kombu
        assert built[2] is None  # arguments kombu's encoder writes
        assert publisher.publish_many([second, elsewhere, tagged], built) == [None] * 3
    finally:
        publisher.close()
    queued = _queued(private_redis.url)
    # (kombu's batch goes before the pushed ones: a step holds one task per ordering id at most)
    assert sorted(d["headers"]["id"] for d in queued[QUEUE]) == sorted(
        r.key.task_id for _, r in (first, second, tagged))
    assert [d["headers"]["id"] for d in queued["elsewhere"]] == [elsewhere[1].key.task_id]


def test_a_message_built_for_a_connection_let_go_is_built_again(private_redis: PrivateRedis,
                                                                counted_kombu_sends: list[str]) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        items = [_release(n) for n in range(4)]
        assert publisher.publish_many(items[:1]) == [None]
        built = publisher.prepare_many(items[1:])
        publisher.close()  # as after a failed send: the next connection declares its queue again
        assert publisher.publish_many(items[1:], built) == [None] * 3
    finally:
        publisher.close()
    assert counted_kombu_sends == ["pushed.record"] * 2
    assert [d["headers"]["id"] for d in _queued(private_redis.url)[QUEUE]] == [
        r.key.task_id for _, r in items]


def test_pushes_go_on_after_redis_closed_their_connection(private_redis: PrivateRedis) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        items = [_release(n) for n in range(6)]
        assert publisher.publish_many(items[:2]) == [None] * 2
        # what a Redis restart or its idle timeout does to the connection the pushes go on
        killed = redis.Redis.from_url(private_redis.url).client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        assert publisher.publish_many(items[2:4]) == [None] * 2
        assert publisher.publish_many(items[4:], publisher.prepare_many(items[4:])) == [None] * 2
    finally:
        publisher.close()
    assert [d["headers"]["id"] for d in _queued(private_redis.url)[QUEUE]] == [
        r.key.task_id for _, r in items]


@pytest.fixture
def counted_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task names whose message was built the full way (Celery's options and router)."""
    built: list[str] = []
    real = release_publisher.task_message

    def counting(app: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        built.append(name)
        return real(app, name, *args, **kwargs)

    for module in (release_message, release_publisher):  # both build the full way
        monkeypatch.setattr(module, "task_message", counting)
    return built


@pytest.mark.parametrize(("case", "full"), [
    ("plain", 2), ("priority", 2), ("routed by name", 2), ("time limits", 2),
    # merged per message, taken when sent, or routed by a function: each built the full way
    ("own headers", 8), ("expires", 8), ("sent ahead (eta)", 8), ("router function", 8),
])
def test_releases_past_the_first_two_are_built_from_a_template(
        private_redis: PrivateRedis, counted_builds: list[str], case: str, full: int) -> None:
    spec = CASES[case]
    items = [_release(n, args=spec.get("args"), options=spec.get("options"),
                      ahead_ms=spec.get("ahead_ms", 0)) for n in range(8)]
    _publish_all(_app(private_redis.url, **spec.get("conf", {})), private_redis.url, items, push=True)
    assert len(counted_builds) == full


def test_a_receiver_changing_a_templated_message_changes_that_message_only(
        private_redis: PrivateRedis) -> None:
    def stamp(headers: dict[str, Any], **kwargs: Any) -> None:
        headers["stamps"]["seen"] = headers["stamps"].get("seen", 0) + 1
        headers["timelimit"][1] = (headers["timelimit"][1] or 0) + 1

    signals.before_task_publish.connect(stamp)
    try:
        queued = _publish_all(_app(private_redis.url), private_redis.url,
                              [_release(n) for n in range(5)], push=True)
    finally:
        signals.before_task_publish.disconnect(stamp)
    assert [d["headers"]["stamps"] for d in queued[QUEUE]] == [{"seen": 1}] * 5
    # each message its own list: changed once, as if it were the only one (no soft limit set)
    assert [d["headers"]["timelimit"] for d in queued[QUEUE]] == [[None, 1]] * 5


def test_one_step_for_two_queues_keeps_each_queues_order(private_redis: PrivateRedis) -> None:
    items = [_release(n, options={"queue": "elsewhere"} if n in (2, 3, 5) else None) for n in range(8)]
    publisher = Publisher(_app(private_redis.url))
    try:
        assert publisher.publish_many([items[0], items[2]]) == [None] * 2  # declares both queues
        assert publisher.publish_many(items[1:2] + items[3:]) == [None] * 6  # pushed, in runs
    finally:
        publisher.close()
    queued = _queued(private_redis.url)
    assert [d["headers"]["id"] for d in queued[QUEUE]] == [
        items[n][1].key.task_id for n in (0, 1, 4, 6, 7)]
    assert [d["headers"]["id"] for d in queued["elsewhere"]] == [
        items[n][1].key.task_id for n in (2, 3, 5)]
