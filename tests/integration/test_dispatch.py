"""The dispatcher against real Kafka, Cassandra, Redis and Celery worker processes."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import time
from collections import defaultdict

import pytest
import redis

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State
from celery_scheduler.wire import HEADER, Release
from tests.integration.dispatch_fixtures import Scheduler
from tests.services import REPO
from tests.waiting import wait_for_states, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

# The guarantees hold whatever the Celery broker: these run on Redis and on RabbitMQ (where
# nothing of the scheduler uses Redis), the others on Redis.
both_brokers = pytest.mark.parametrize(
    "broker_url", ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)], indirect=True)


@pytest.fixture
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if getattr(request, "param", "redis") == "rabbitmq":
        url: str = request.getfixturevalue("rabbitmq_url")
        return url
    return f"{redis_url}/1"


def utc(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc)


def check_order_and_no_overlap(scheduler: Scheduler) -> dict[str, list[int]]:
    """Per ordering id: starts in seq order, and each start after the previous end."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for event in scheduler.executions():
        runs[event["o"]].append(event)
    order: dict[str, list[int]] = {}
    for ordering_id, events in runs.items():
        open_run = None
        for event in events:
            if event["event"] == "start":
                assert open_run is None, f"{ordering_id}: {event} started while {open_run} ran"
                open_run = event
            else:
                assert open_run is not None and open_run["seq"] == event["seq"]
                open_run = None
        order[ordering_id] = [e["seq"] for e in events if e["event"] == "start"]
    return order


def test_a_release_that_reaches_its_worker_before_it_is_due_waits_until_then(
        scheduler: Scheduler, schedule) -> None:
    """A release sent ahead carries its due time (Celery's eta, and in its header); a copy
    that reaches a worker early without the eta still does not start before it."""
    scheduler.worker()
    due = time.time() + 1.5
    key = TaskKey("early", int(due * 1000), "seq-0")
    release = Release(key, 0, 1, 1, key.scheduled_ms + 60_000, key.scheduled_ms)
    schedule.app.send_task("dispatching.record", args=["early", 0], kwargs={"scheduled_for": due},
                           task_id=key.task_id, headers={HEADER: release.header()},
                           queue=scheduler.env["CELERY_SCHEDULER_TEST_QUEUE"])
    scheduler.wait_for_starts(1, timeout=30)
    [start] = scheduler.starts()
    assert start["eta"] is None  # nothing held it but the hook
    assert start["t"] >= key.scheduled_ms / 1000, f"started {key.scheduled_ms / 1000 - start['t']:.3f}s early"


@both_brokers
def test_tasks_run_on_time_in_order_per_ordering_id(scheduler: Scheduler, schedule) -> None:
    starts = run_on_time(scheduler, schedule)
    # held by the dispatcher and sent at their due time: no eta
    assert [s["eta"] for s in starts] == [None] * len(starts)


@both_brokers
def test_with_release_eta_tasks_go_out_ahead_and_their_worker_holds_them(
        scheduler: Scheduler, schedule) -> None:
    # marked 2 s ahead: on a busy machine the default 0.5 s may all go to the marking
    starts = run_on_time(scheduler, schedule, {"CELERY_SCHEDULER_TEST_RELEASE_ETA": "1",
                                               "CELERY_SCHEDULER_TEST_RELEASE_AHEAD": "2"})
    # Marked ahead of their due time, they went to the broker at once, their due time as
    # Celery's eta (one marked late would go without): the worker held them until then.
    etas = [(dt.datetime.fromisoformat(s["eta"]), s["scheduled_for"]) for s in starts
            if s["eta"] is not None]
    assert etas, "no release was sent ahead of its due time"
    for eta, due in etas:
        assert abs(eta.timestamp() - due) < 0.001, (eta, due)


def run_on_time(scheduler: Scheduler, schedule, env: dict[str, str] | None = None) -> list[dict]:
    """Ten tasks of two ordering ids, 0.3 s apart: in order, on time, never early; their starts."""
    scheduler.dispatcher(extra_env=env)
    scheduler.worker()
    start = time.time() + 3
    handles = []
    for seq in range(5):
        for ordering_id in ("alice", "bob"):
            at = start + seq * 0.3
            handles.append(schedule.record.schedule(
                (ordering_id, seq), {"duration": 0.05, "scheduled_for": at}, at=utc(at)))

    scheduler.wait_for_starts(10, timeout=60)

    order = check_order_and_no_overlap(scheduler)
    assert order == {"alice": [0, 1, 2, 3, 4], "bob": [0, 1, 2, 3, 4]}
    lateness = [s["t"] - s["scheduled_for"] for s in scheduler.starts()]
    assert min(lateness) >= 0, "a task ran before its time"
    assert max(lateness) < 1.0, f"lateness {max(lateness):.3f}s"
    # completion is recorded: every key ends up succeeded
    wait_for_states(handles, State.SUCCEEDED)
    return scheduler.starts()


def schedule_grid(schedule, ordering_ids: int, per_id: int, spacing: float, duration: float,
                  delay: float = 4.0) -> list[str]:
    """Schedule seq 0..per_id-1 for each ordering id, *spacing* seconds apart."""
    start = time.time() + delay
    names = [f"o{i}" for i in range(ordering_ids)]
    for seq in range(per_id):
        for ordering_id in names:
            schedule.record.schedule((ordering_id, seq), {"duration": duration,
                                                          "scheduled_for": start + seq * spacing},
                                     at=utc(start + seq * spacing))
    return names


def distinct_runs(scheduler: Scheduler) -> int:
    return len({(s["o"], s["seq"]) for s in scheduler.starts()})


def seqs_in_order(order: dict[str, list[int]], expected: dict[str, int]) -> None:
    """Every seq ran (duplicates allowed: at least once), never out of order."""
    for ordering_id, count in expected.items():
        ran = order.get(ordering_id, [])
        assert ran == sorted(ran), f"{ordering_id} ran out of order: {ran}"
        assert set(ran) == set(range(count)), f"{ordering_id} missed some: {ran}"


@both_brokers
def test_two_dispatchers_two_workers_keep_order_without_overlap(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.dispatcher(wait=False)
    scheduler.worker()
    scheduler.worker()
    # all due within half a second: only the ordering rule keeps them apart
    ordering_ids = schedule_grid(schedule, ordering_ids=6, per_id=8, spacing=0.05, duration=0.05)

    scheduler.wait_for_starts(48, timeout=90)

    order = check_order_and_no_overlap(scheduler)
    assert order == {o: list(range(8)) for o in ordering_ids}
    assert len({s["pid"] for s in scheduler.starts()}) == 2, "both workers took part"


@both_brokers
def test_failing_and_hanging_ordering_ids_do_not_delay_others(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    scheduler.worker()
    start = time.time() + 3
    schedule.flaky.schedule(("failing", 0), {"failures": 100}, at=utc(start))
    schedule.record.schedule(("hanging", 0), {"duration": 15.0}, at=utc(start))
    for seq in range(6):
        at = start + 0.5 + seq * 0.5
        schedule.record.schedule(("healthy", seq), {"scheduled_for": at}, at=utc(at))

    wait_until(lambda: len([s for s in scheduler.starts() if s["o"] == "healthy"]) >= 6, 40,
               scheduler.executions)
    healthy = [s for s in scheduler.starts() if s["o"] == "healthy"]
    lateness = [s["t"] - s["scheduled_for"] for s in healthy]
    assert max(lateness) < 1.0, lateness
    assert [s["seq"] for s in healthy] == list(range(6))


def test_failures_are_retried_while_the_ordering_id_waits(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    start = time.time() + 3
    first = schedule.flaky.schedule(("acct", 0), {"failures": 2}, at=utc(start))
    second = schedule.record.schedule(("acct", 1), {}, at=utc(start + 0.1))
    gives_up = schedule.flaky.schedule(("doomed", 0), {"failures": 100}, at=utc(start))
    after = schedule.record.schedule(("doomed", 1), {}, at=utc(start + 0.1))

    scheduler.wait_for_starts(3 + 1 + 3 + 1, timeout=60)
    wait_for_states([first, second, after], State.SUCCEEDED)
    wait_for_states([gives_up], State.FAILED)

    acct = [(s["seq"], s.get("attempt")) for s in scheduler.starts() if s["o"] == "acct"]
    assert acct == [(0, 1), (0, 2), (0, 3), (1, None)]  # seq 1 waited for all of seq 0's attempts
    doomed = [s["seq"] for s in scheduler.starts() if s["o"] == "doomed"]
    assert doomed == [0, 0, 0, 1]  # after the last attempt the ordering id moved on
    status = gives_up.status()
    assert status.attempts == 3 and "planned failure 3" in status.last_error


def test_celery_autoretry_defers_to_the_scheduler(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    start = time.time() + 3
    handle = schedule.autoretry.schedule(("acct", 0), {"failures": 2}, at=utc(start))
    follower = schedule.record.schedule(("acct", 1), {}, at=utc(start + 0.1))

    wait_for_states([handle, follower], State.SUCCEEDED, timeout=60)

    # three scheduler attempts, not one attempt that Celery retried behind the ordering's back
    assert handle.status().attempts == 3
    runs = [(s["seq"], s.get("attempt")) for s in scheduler.starts()]
    assert runs == [(0, 1), (0, 2), (0, 3), (1, None)]


@both_brokers
def test_same_key_runs_once_and_a_completed_key_never_again(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    when = utc(time.time() + 3)
    first = schedule.record.schedule(("k", 0), {"duration": 0.0}, at=when)
    again = schedule.record.schedule(("k", 0), {"duration": 0.0}, at=when)
    assert first.key == again.key
    scheduler.wait_for_starts(1)
    wait_for_states([first], State.SUCCEEDED)

    schedule.record.schedule(("k", 0), {"duration": 0.0}, at=when)  # completed: never again
    marker = schedule.record.schedule(("k", 1), {}, at=utc(time.time() + 1))
    wait_for_states([marker], State.SUCCEEDED)
    assert [s["seq"] for s in scheduler.starts()] == [0, 1]


@both_brokers
def test_cancelled_task_never_runs(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    start = time.time() + 4
    doomed = schedule.record.schedule(("c", 0), {}, at=utc(start))
    kept = schedule.record.schedule(("c", 1), {}, at=utc(start + 0.2))
    doomed.cancel()
    wait_for_states([kept], State.SUCCEEDED, timeout=30)
    # had the cancelled task been released, it would have run first: it is the earlier task
    # of the same ordering id
    assert [s["seq"] for s in scheduler.starts()] == [1]
    assert doomed.status().state is State.CANCELLED


def test_a_stale_copy_of_a_release_never_runs(scheduler: Scheduler, schedule) -> None:
    """A killed worker's prefetched message comes back from the broker after its visibility
    timeout, long after the key was released again: that copy must not run the key again.
    A copy that ends its lease is stale by its own header; a copy the broker marks as
    redelivered within its lease may be of a run that already happened, so the worker asks
    the store about those."""
    scheduler.dispatcher()
    worker = scheduler.worker()
    at = time.time() + 2
    handle = schedule.record.schedule(("stale", 0), {"scheduled_for": at}, at=utc(at))
    wait_for_states([handle], State.SUCCEEDED, timeout=60)
    assert handle.status().attempts == 1

    queue = scheduler.env["CELERY_SCHEDULER_TEST_QUEUE"]
    broker = redis.Redis.from_url(schedule.app.conf.broker_url)
    later = int(time.time() * 1000) + 60_000
    copies = [  # (attempt, end of its lease, marked as redelivered by the broker)
        (1, int(time.time() * 1000) - 1000, False),  # back after its lease: stale by its header
        (1, later, True),  # given back within its lease, after it ran: the store says finished
        (2, later, True),  # an attempt the dispatcher never released
    ]
    for attempt, lease_until, redelivered in copies:
        release = Release(handle.key, 0, attempt, 1, lease_until)
        schedule.app.send_task("dispatching.record", args=["stale", 0], kwargs={"scheduled_for": at},
                               task_id=handle.key.task_id, headers={HEADER: release.header()},
                               queue=f"{queue}.parked")
        # as kombu's Redis transport gives back an unacknowledged message
        payload = json.loads(broker.rpop(f"{queue}.parked"))
        payload["headers"]["redelivered"] = redelivered
        payload["properties"]["delivery_info"]["redelivered"] = redelivered
        payload["properties"]["delivery_info"]["routing_key"] = queue
        broker.lpush(queue, json.dumps(payload))
    wait_until(lambda: scheduler.log_of(worker).count("skipping a stale copy") + len(scheduler.starts()) >= 4,
               30, lambda: scheduler.log_of(worker)[-3000:])
    assert [s["seq"] for s in scheduler.starts()] == [0], "a stale copy ran the key again"
    log = scheduler.log_of(worker)
    assert log.count("its start lease has ended") == 1
    assert log.count("the key is succeeded at attempt 1") == 2
    assert handle.status().state is State.SUCCEEDED


@both_brokers
def test_sigkilled_dispatcher_loses_nothing(scheduler: Scheduler, schedule) -> None:
    first = scheduler.dispatcher()
    scheduler.worker()
    ordering_ids = schedule_grid(schedule, ordering_ids=4, per_id=20, spacing=0.5, duration=0.02)

    scheduler.wait_for_starts(12, timeout=60)
    first.kill()  # SIGKILL mid-run: no hand-over, leases expire on their own
    first.wait()
    killed_at = time.time()
    scheduler.dispatcher(wait=False)

    wait_until(lambda: distinct_runs(scheduler) >= 80, 90, scheduler.starts)
    order = check_order_and_no_overlap(scheduler)
    seqs_in_order(order, {o: 20 for o in ordering_ids})
    resumed = min(s["t"] for s in scheduler.starts() if s["t"] > killed_at)
    print(f"release resumed {resumed - killed_at:.1f}s after SIGKILL")
    # every task the killed dispatcher had in flight or that fell due meanwhile started
    # within 15 s of the kill (at the default start lease): none waited for a long lease
    first_starts: dict[tuple[str, int], dict] = {}
    for start in scheduler.starts():
        first_starts.setdefault((start["o"], start["seq"]), start)
    waited = max(s["t"] - max(s["scheduled_for"], killed_at) for s in first_starts.values())
    print(f"longest wait of a task after the kill: {waited:.1f}s")
    assert waited <= 15.0


@both_brokers
def test_a_task_whose_worker_was_sigkilled_runs_again_before_the_next_of_its_ordering_id(
        scheduler: Scheduler, schedule) -> None:
    scheduler.env["CELERY_SCHEDULER_TEST_LEASE"] = "12"  # released again 12 s after the kill
    scheduler.dispatcher()
    victim = scheduler.worker()
    now = time.time()
    schedule.record.schedule_at(utc(now + 1), "crash", 1, duration=4.0, scheduled_for=now + 1)
    schedule.record.schedule_at(utc(now + 2), "crash", 2, scheduled_for=now + 2)
    scheduler.wait_for_starts(1, timeout=60)
    victim.kill()  # mid-run: no outcome will come
    victim.wait()
    killed = time.time()
    scheduler.worker()

    wait_until(lambda: len(scheduler.starts()) >= 3, 90, scheduler.starts)
    starts = scheduler.starts()
    first = [s["t"] for s in starts if s["seq"] == 1]
    ends = [e["t"] for e in scheduler.executions() if e["event"] == "end" and e["seq"] == 1]
    second = [s["t"] for s in starts if s["seq"] == 2]
    assert len(first) == 2 and first[1] > killed  # run again, after the kill
    # its last beat came at most 1.2 s before the kill: the run lease, the 1.5 s a beat may
    # take to count, the first retry's backoff (<= 0.2 s) and the read of outcomes (<= 1 s)
    assert first[1] - killed <= 12 + 1.5 + 0.2 + 1 + 2
    assert ends and second[0] >= ends[0]  # and only then the next task of the ordering id


@both_brokers
def test_rebalance_moves_partitions_without_loss(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    ordering_ids = schedule_grid(schedule, ordering_ids=12, per_id=30, spacing=0.4, duration=0.0)

    scheduler.wait_for_starts(30)  # mid-stream
    second = scheduler.dispatcher()  # joins, and waits until partitions moved to it
    released = len(scheduler.starts())
    # the two release side by side for a while (unless the stream ended meanwhile)
    scheduler.wait_for_starts(min(released + 30, 12 * 30))
    second.terminate()  # leaves cleanly: they move back
    second.wait(timeout=30)

    wait_until(lambda: distinct_runs(scheduler) >= 360, 90, scheduler.starts)
    order = check_order_and_no_overlap(scheduler)
    seqs_in_order(order, {o: 30 for o in ordering_ids})
    times = sorted(s["t"] for s in scheduler.starts())
    pause = max(b - a for a, b in itertools.pairwise(times))
    print(f"longest pause between releases during the rebalances: {pause:.2f}s")
    assert "handed over partitions" in scheduler.log_of(second)


def test_malformed_records_are_dead_lettered_and_the_partition_continues(
        scheduler: Scheduler, schedule, kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    from celery_scheduler.partitioner import partition_for

    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    bad = [(b"acct", b"\xff not json"), (b"acct", b'{"v": 99}'), (b"other", b'{"v": 1, "type": "cancel"}')]
    for key, value in bad:  # into the partition the good task uses
        producer.produce(topic, key=key, value=value, partition=partition_for("acct", 6))
    assert producer.flush(10) == 0
    scheduler.dispatcher()
    scheduler.worker()
    good = schedule.record.schedule(("acct", 0), {}, at=utc(time.time() + 1))

    wait_for_states([good], State.SUCCEEDED, timeout=30)

    reasons = dead_letter_reasons(kafka_bootstrap, topic, 3)
    assert len(reasons) == 3
    assert "not UTF-8" in reasons[0]
    assert "unsupported envelope version 99" in reasons[1]
    assert "missing field" in reasons[2]


def dead_letter_reasons(kafka_bootstrap: str, topic: str, count: int) -> list[str]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}-dlq-check",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([f"{topic}.deadletter"])
    reasons: list[str] = []
    deadline = time.monotonic() + 30
    while len(reasons) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            reasons.append(dict(message.headers())["reason"].decode())
    consumer.close()
    return reasons


def test_signing_dead_letters_unsigned_and_forged_records(scheduler: Scheduler, kafka_bootstrap: str) -> None:
    from celery_scheduler.client import SchedulerClient, set_client
    from celery_scheduler.config import get_settings
    from tests.apps import dispatching

    secret = "integration-secret-0123456789"
    scheduler.env["CELERY_SCHEDULER_TEST_SIGNING_SECRET"] = secret
    dispatcher = scheduler.dispatcher("--loglevel", "DEBUG")
    scheduler.worker()
    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    base = get_settings(dispatching.app).replace(
        kafka_topic=topic, cassandra_keyspace=scheduler.env["CELERY_SCHEDULER_TEST_KEYSPACE"])
    producers = {
        "signed": base.replace(signing_keys={"k1": secret}, signing_key_id="k1"),
        "unsigned": base,
        "forged": base.replace(signing_keys={"k1": "guessed-secret-0123456789"}, signing_key_id="k1"),
    }
    handles = {}
    previous = set_client(dispatching.app, None)
    try:
        for seq, (name, settings) in enumerate(producers.items()):
            set_client(dispatching.app, SchedulerClient(settings))
            handles[name] = dispatching.record.schedule(("s", seq), {}, at=utc(time.time() + 1))
        wait_for_states([handles["signed"]], State.SUCCEEDED)
    finally:
        set_client(dispatching.app, previous)
    reasons = dead_letter_reasons(kafka_bootstrap, topic, 2)
    assert any("not signed" in r for r in reasons) and any("does not match" in r for r in reasons)
    assert [s["seq"] for s in scheduler.starts()] == [0]
    assert secret not in scheduler.log_of(dispatcher)


def test_health_check_exit_code(scheduler: Scheduler) -> None:
    healthy = scheduler.cli("dispatch", "--check")
    assert (healthy.returncode, healthy.stdout.strip()) == (0, "ok")
    scheduler.env["CELERY_SCHEDULER_TEST_KAFKA"] = "127.0.0.1:1"
    unhealthy = scheduler.cli("dispatch", "--check")
    assert unhealthy.returncode == 1
    # one line for Kafka, not one per topic after a timeout each
    assert unhealthy.stderr.count("unhealthy: kafka") == 1, unhealthy.stderr


def test_dispatcher_metrics_on_prometheus(scheduler: Scheduler, schedule) -> None:
    import socket
    import urllib.request

    with socket.socket() as probe:  # a free port for this test
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scheduler.dispatcher("--metrics-port", str(port))
    scheduler.worker()
    handles = [schedule.record.schedule(("m", seq), {}, at=utc(time.time() + 1)) for seq in range(3)]
    wait_for_states(handles, State.SUCCEEDED)
    time.sleep(0.5)

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1])
               for line in text.splitlines() if line.startswith("celery_scheduler_")}
    assert samples["celery_scheduler_persisted_total"] == 3
    assert samples["celery_scheduler_released_total"] == 3
    assert samples['celery_scheduler_finished_total{outcome="succeeded"}'] == 3
    assert samples["celery_scheduler_release_lateness_seconds_count"] == 3
    assert samples["celery_scheduler_owned_partitions"] == 6

    # every metric the Grafana dashboard in docs/ queries is one the dispatcher serves
    dashboard = json.loads((REPO / "docs" / "grafana" / "celery-scheduler.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"celery_scheduler_[a-z_]+", target["expr"])}
    served = {name.split("{")[0] for name in samples}
    assert len(queried) >= 9
    assert queried <= served, f"the dashboard queries metrics no dispatcher serves: {queried - served}"


@both_brokers
def test_a_task_running_several_leases_runs_once_to_its_end(
        scheduler: Scheduler, schedule) -> None:
    # run lease 4 s: the task runs 15 s, beating every 0.4 s, in a prefork pool process
    scheduler.env["CELERY_SCHEDULER_TEST_LEASE"] = "4"
    scheduler.dispatcher()
    scheduler.worker("--pool=prefork", "--concurrency=1")
    start = time.time() + 2
    long = schedule.record.schedule(("acct", 0), {"duration": 15.0}, at=utc(start))
    follower = schedule.record.schedule(("acct", 1), {}, at=utc(start + 0.1))

    wait_for_states([long, follower], State.SUCCEEDED, timeout=90)

    runs = [s for s in scheduler.starts() if s["seq"] == 0]
    assert len(runs) == 1  # never released again while it ran
    end = next(e["t"] for e in scheduler.executions() if e["event"] == "end" and e["seq"] == 0)
    assert end - runs[0]["t"] >= 15.0  # not cut short
    follower_start = next(s["t"] for s in scheduler.starts() if s["seq"] == 1)
    assert follower_start >= end
    assert long.status().attempts == 1


def test_a_tasks_own_time_limit_is_celerys_as_always(scheduler: Scheduler, schedule) -> None:
    scheduler.dispatcher()
    scheduler.worker("--pool=prefork", "--concurrency=1")
    hung = schedule.record.schedule(("acct", 0), {"duration": 120.0}, at=utc(time.time() + 2),
                                    time_limit=3)
    wait_for_states([hung], State.FAILED, timeout=90)
    runs = [s for s in scheduler.starts() if s["seq"] == 0]
    assert len(runs) == 3  # every attempt killed at the app's own limit; then the key failed
    for earlier, later in itertools.pairwise(runs):
        assert later["t"] - earlier["t"] >= 3.0
    assert "TimeLimitExceeded" in hung.status().last_error
