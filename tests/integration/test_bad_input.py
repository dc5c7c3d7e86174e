"""The bad-input catalogue: what each kind of bad input gets, against the real services.

``CATALOGUE`` is the one table (summarised in docs/bad-input.md). Three surfaces:

- ``api``: a schedule or status call; expects a typed error from celery_scheduler.errors.
  Validation that needs no service (times, arguments, keys, options, sizes) is covered
  by tests/unit/test_api.py, test_envelope.py and test_config.py and not repeated here;
  these are the errors only real Kafka and Cassandra produce.
- ``cli``: ``celery -A app scheduler ...``; expects an exit code and a message on stderr.
- ``topic``: a record produced raw into the scheduler topic, as a foreign or buggy
  producer would; a real dispatcher consumes it. Expects a dead-letter entry with its
  ``reason`` header, or that the record is accepted (it runs, or waits). All rejected
  records go into one partition ahead of a valid task, which must still run: bad records
  never stall a partition. (Every field-level decode rule has a unit case in
  tests/unit/test_envelope.py; here each kind of failure travels the whole way once.)
"""

from __future__ import annotations

import datetime as dt
import pickle
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from hypothesis import strategies as st

from celery_scheduler.decoding import decode
from celery_scheduler.errors import (
    EnvelopeDecodeError,
    EnvelopeTooLargeError,
    SchedulerError,
    SchemaMissingError,
    StoreUnavailableError,
    TaskLogUnavailableError,
    TopicMissingError,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import State
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.raw_topic import (
    PARTITIONS,
    RawProducer,
    as_bytes,
    dead_letters,
    envelope,
    own_scheduler,
    scheduling_client,
)
from tests.services import REPO, drop_scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

CANARY = "canary"  # its partition receives every rejected record, then a valid task
STALLED = partition_for(CANARY, PARTITIONS)
NOW = int(time.time() * 1000)
MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z, the last time an envelope may name


def elsewhere(prefix: str) -> str:
    """An ordering id that Kafka's partitioner puts in another partition than CANARY's."""
    return next(f"{prefix}-{i}" for i in range(100) if partition_for(f"{prefix}-{i}", PARTITIONS) != STALLED)


@dataclass(frozen=True)
class Case:
    surface: str  # "api", "cli" or "topic"
    given: Any    # api: a call of (context); cli: argv; topic: (key, value, partition)
    expect: Any   # api: (error type, message); cli: (exit code, message); topic: see TopicExpect


@dataclass(frozen=True)
class Dead:
    reason: str


@dataclass(frozen=True)
class Accepted:
    """The record is stored: *key* ends in *state* (None: nothing to store, as for a cancel)."""

    key: TaskKey
    state: State | None


def into_canary(value: bytes | None, key: bytes | None = CANARY.encode()) -> tuple[Any, ...]:
    return (key, value, STALLED)


def accepted(ordering_id: str, seq: int, at_ms: int, **changes: Any) -> tuple[Any, ...]:
    document = envelope(ordering_id, seq, at_ms, **changes)
    return (ordering_id.encode(), as_bytes(document), partition_for(ordering_id, PARTITIONS))


def canary(**changes: Any) -> bytes:
    return as_bytes(envelope(CANARY, 99, NOW, **changes))


def key_of(ordering_id: str, seq: int, at_ms: int) -> TaskKey:
    return TaskKey(ordering_id, at_ms, f"seq-{seq}")


WRONG_PARTITION = elsewhere("misplaced")
UNICODE = "клиент-😀 日本"

GHOST_CANCEL = {"v": 1, "type": "cancel", "enqueued_at": NOW,
                "key": {"ordering_id": "ghost", "at": NOW, "unique": "u"}}


def canary_key(**fields: Any) -> dict[str, Any]:
    return {"ordering_id": CANARY, "at": NOW, "unique": "u", **fields}


CATALOGUE: dict[str, Case] = {
    # --- the Python API against real services -------------------------------------------
    "api-topic-missing": Case(
        "api", lambda c: c.schedule_on_missing_topic(), (TopicMissingError, "does not exist; create it")),
    "api-kafka-unreachable": Case(
        "api", lambda c: c.schedule_with_kafka_down(), (TaskLogUnavailableError, "did not answer")),
    "api-broker-refuses-size": Case(
        "api", lambda c: c.schedule_over_broker_limit(), (EnvelopeTooLargeError, "rejected the record")),
    "api-keyspace-missing": Case(
        "api", lambda c: c.status_without_schema(), (SchemaMissingError, "schema is missing")),
    "api-cassandra-unreachable": Case(
        "api", lambda c: c.status_with_cassandra_down(), (StoreUnavailableError, "Cassandra could not")),
    # --- the CLI -------------------------------------------------------------------------
    "cli-init-zero-partitions": Case(
        "cli", ("init", "--partitions", "0"), (2, "0 is not in the range x>=1")),
    "cli-init-negative-replication": Case(
        "cli", ("init", "--replication-factor", "-1"), (2, "-1 is not in the range")),
    "cli-status-bad-time": Case(
        "cli", ("status", "acct", "yesterday", "u"), (2, "'yesterday' is not an ISO 8601")),
    "cli-cancel-empty-ordering-id": Case(
        "cli", ("cancel", "", "2030-01-01T00:00:00Z", "u"), (2, "ordering id must not be empty")),
    "cli-cancel-missing-args": Case("cli", ("cancel", "acct"), (2, "Missing argument 'AT'")),
    "cli-status-unknown-key": Case(
        "cli", ("status", "acct", "2030-01-01T00:00:00Z", "u"), (3, "unknown (never stored")),
    "cli-dispatch-topic-missing": Case(
        "cli", ("--missing-topic", "dispatch"), (1, "does not exist; create it")),
    "cli-status-keyspace-missing": Case(
        "cli", ("--missing-topic", "status", "a", "2030-01-01", "u"), (1, "schema is missing")),
    # --- raw records in the topic ----------------------------------------------------------
    "topic-malformed-json": Case(
        "topic", into_canary(b'{"v": 1, "type": "schedule",'), Dead("record is not JSON")),
    "topic-not-utf8": Case("topic", into_canary(b"\xff\xfe\x00binary"), Dead("record is not UTF-8")),
    "topic-pickle-payload": Case(
        "topic", into_canary(pickle.dumps(envelope(CANARY, 1, NOW))), Dead("record is not UTF-8")),
    "topic-pickle-protocol-0": Case(
        "topic", into_canary(pickle.dumps(envelope(CANARY, 1, NOW), protocol=0)), Dead("record is not JSON")),
    "topic-empty-value": Case("topic", into_canary(b""), Dead("record is not JSON")),
    "topic-tombstone": Case("topic", into_canary(None), Dead("record has no value")),
    "topic-json-array": Case("topic", into_canary(b"[1, 2]"), Dead("must be a JSON object")),
    "topic-wrong-version": Case("topic", into_canary(canary(v=2)), Dead("unsupported envelope version 2")),
    "topic-unknown-task": Case(
        "topic", into_canary(canary(task="os.system")),
        Dead("task 'os.system' is not a registered scheduled task")),
    "topic-empty-task-name": Case(
        "topic", into_canary(canary(task="")), Dead("task must be a non-empty name")),
    "topic-args-wrong-type": Case("topic", into_canary(canary(args={"a": 1})), Dead("args must be a list")),
    "topic-time-wrong-type": Case(
        "topic", into_canary(canary(key=canary_key(at="soon"))), Dead("key.at must be epoch milliseconds")),
    "topic-time-beyond-year-9999": Case(
        "topic", into_canary(canary(key=canary_key(at=MAX_MS + 1))),
        Dead("key.at must be epoch milliseconds")),
    "topic-empty-ordering-id": Case(
        "topic", into_canary(canary(key=canary_key(ordering_id="")), key=b""),
        Dead("ordering id must not be empty")),
    "topic-nul-in-ordering-id": Case(
        "topic", into_canary(canary(key=canary_key(ordering_id="a\x00b")), key=b"a\x00b"),
        Dead("contains a NUL character")),
    "topic-pickle-serializer-option": Case(
        "topic", into_canary(canary(options={"serializer": "pickle"})),
        Dead("unknown Celery option 'serializer'")),
    "topic-oversized-record": Case(
        "topic", into_canary(canary(args=[CANARY, 1, "x" * 300_000])), Dead("over the limit of 262144")),
    "topic-no-key": Case(
        "topic", into_canary(canary(), key=None), Dead("record key None is not the ordering id")),
    "topic-wrong-key": Case(
        "topic", into_canary(canary(), key=b"someone-else"),
        Dead("record key b'someone-else' is not the ordering id 'canary'")),
    "topic-wrong-partition": Case(
        "topic", into_canary(as_bytes(envelope(WRONG_PARTITION, 1, NOW)), key=WRONG_PARTITION.encode()),
        Dead(f"belongs in partition {partition_for(WRONG_PARTITION, PARTITIONS)}, not {STALLED}")),
    "topic-time-in-1970-runs-at-once": Case(
        "topic", accepted("epoch", 1, 0), Accepted(key_of("epoch", 1, 0), State.SUCCEEDED)),
    "topic-time-in-year-9999-waits": Case(
        "topic", accepted("far", 1, MAX_MS), Accepted(key_of("far", 1, MAX_MS), State.PENDING)),
    "topic-unicode-ordering-id-runs": Case(
        "topic", accepted(UNICODE, 1, NOW), Accepted(key_of(UNICODE, 1, NOW), State.SUCCEEDED)),
    "topic-200kb-record-runs": Case(
        "topic", accepted("bulky", 1, NOW, options={"headers": {"blob": "x" * 200_000}}),
        Accepted(key_of("bulky", 1, NOW), State.SUCCEEDED)),
    "topic-cancel-of-unknown-key-ignored": Case(
        "topic", (b"ghost", as_bytes(GHOST_CANCEL), partition_for("ghost", PARTITIONS)),
        Accepted(TaskKey("ghost", NOW, "u"), None)),
}


# --- the topic run: every topic case produced once, one dispatcher and worker consume them ---


@dataclass
class TopicRun:
    scheduler: Scheduler
    sources: dict[str, str]        # case id -> topic/partition/offset
    dead: dict[str, str]           # source -> reason
    status: Callable[[TaskKey], Any]


def topic_cases() -> list[tuple[str, Case]]:
    return [(case_id, case) for case_id, case in CATALOGUE.items() if case.surface == "topic"]


@pytest.fixture(scope="module")
def topic_run(kafka_bootstrap: str, cassandra_contact: str, redis_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[TopicRun]:
    name = f"t_bad_{uuid.uuid4().hex[:12]}"
    with own_scheduler(tmp_path_factory.mktemp("bad-input"), kafka_bootstrap, name) as scheduler, \
            scheduling_client(scheduler.env) as app:
        producer = RawProducer(kafka_bootstrap, name)
        sources = {case_id: producer.send(*case.given) for case_id, case in topic_cases()}
        # valid tasks after the bad records, in the partition that received them
        follower = app.record.schedule((CANARY, 0), {}, at=dt.datetime.now(dt.timezone.utc))
        scheduler.dispatcher()
        scheduler.worker()
        expected_dead = sum(isinstance(case.expect, Dead) for _, case in topic_cases())
        wait_until(lambda: (getattr(follower.status(), "state", None) is State.SUCCEEDED), 60,
                   scheduler.executions)
        dead = dead_letters(kafka_bootstrap, name, expected_dead)
        yield TopicRun(scheduler, sources, dead, app.record.client.store.status)


# --- the API cases: each needs a real service to fail in a particular way ---------------


@dataclass
class ApiContext:
    kafka: str
    name: str  # a topic and keyspace nobody created, dropped afterwards

    def app(self, **changes: Any) -> Any:
        return scheduling_client({"CELERY_SCHEDULER_TEST_KAFKA": self.kafka,
                                  "CELERY_SCHEDULER_TEST_TOPIC": self.name,
                                  "CELERY_SCHEDULER_TEST_KEYSPACE": self.name}, **changes)

    def schedule(self, **changes: Any) -> Any:
        with self.app(**changes) as app:
            return app.record.schedule(("acct", 1), {}, countdown=60)

    def schedule_on_missing_topic(self) -> Any:
        return self.schedule()

    def schedule_with_kafka_down(self) -> Any:
        return self.schedule(kafka_bootstrap_servers="127.0.0.1:1", kafka_produce_timeout=2.0)

    def schedule_over_broker_limit(self) -> Any:
        # under scheduler_max_envelope_bytes, over the topic's own max.message.bytes
        topic = NewTopic(self.name, num_partitions=1, replication_factor=1,
                         config={"max.message.bytes": "10000"})
        admin = AdminClient({"bootstrap.servers": self.kafka})  # kept alive until the result
        admin.create_topics([topic])[self.name].result(30)
        with self.app() as app:
            return app.record.schedule(("acct", 1), {}, countdown=60, headers={"blob": "x" * 50_000})

    def status(self, **changes: Any) -> Any:
        with self.app(**changes) as app:
            return app.record.client.store.status(TaskKey("acct", 0, "u"))

    def status_without_schema(self) -> Any:
        return self.status()

    def status_with_cassandra_down(self) -> Any:
        return self.status(cassandra_port=1)


@pytest.fixture
def api_context(kafka_bootstrap: str, cassandra_contact: str, unique_name: str) -> Iterator[ApiContext]:
    yield ApiContext(kafka_bootstrap, unique_name)
    drop_scheduler(unique_name, unique_name)


# --- fuzzing the real ingest path -------------------------------------------------------------
# Before the catalogue on purpose: Hypothesis fails a test when another thread uses `random`
# while it generates data, and the catalogue's topic run keeps a Cassandra session (whose
# driver threads do) open until the module ends.

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
FIELDS = ["v", "type", "task", "key", "args", "kwargs", "options", "retry", "enqueued_at"]
ordering_ids = st.text(min_size=1, max_size=10).filter(lambda o: not o.startswith("sentinel"))
LATER = NOW + 30 * 24 * 3600 * 1000  # valid fuzzed tasks wait, so nothing runs meanwhile


def mutated(ordering_id: str, name: str, value: Any) -> tuple[bytes, bytes]:
    document = envelope(ordering_id, 1, LATER)
    document[name] = value
    return ordering_id.encode("utf-8", "surrogatepass"), as_bytes(document)


fuzzed_records = st.one_of(
    st.tuples(st.binary(max_size=16), st.binary(max_size=200)),
    st.builds(mutated, ordering_ids, st.sampled_from(FIELDS), json_values),
    st.builds(lambda o: (o.encode("utf-8", "surrogatepass"), as_bytes(envelope(o, 1, LATER))), ordering_ids),
)


def fate(key: bytes, value: bytes, partition: int, allowed: set[str]) -> str:
    """What the dispatcher must do with the record, judged with the public decoder."""
    try:
        decoded = decode(value)
    except EnvelopeDecodeError:
        return "dead"
    ordering_id = decoded.key.ordering_id
    if (key != ordering_id.encode() or partition != partition_for(ordering_id, PARTITIONS)
            or getattr(decoded, "task", next(iter(allowed))) not in allowed):
        return "dead"
    return "stored"


def test_fuzzed_records_never_stall_a_partition(kafka_bootstrap: str, cassandra_contact: str,
                                                redis_url: str, unique_name: str, tmp_path: Path) -> None:
    from celery_scheduler.api import registered
    from tests.apps import dispatching

    allowed = {name for name in registered() if name.startswith("dispatching.")}
    assert dispatching.record.name in allowed
    with own_scheduler(tmp_path, kafka_bootstrap, unique_name) as scheduler, \
            scheduling_client(scheduler.env) as app:
        producer = RawProducer(kafka_bootstrap, unique_name)
        fates: dict[str, str] = {}

        @hypothesis.settings(max_examples=60, deadline=None, database=None)
        @hypothesis.given(st.lists(st.tuples(fuzzed_records, st.integers(0, PARTITIONS - 1),
                                             st.booleans()), min_size=1, max_size=5))
        def produce(batch: list[Any]) -> None:
            for (key, value), partition, right_partition in batch:
                if right_partition:  # mostly where the key belongs, sometimes anywhere
                    partition = partition_for(key, PARTITIONS)
                fates[producer.send(key, value, partition)] = fate(key, value, partition, allowed)

        produce()
        # behind the fuzzed records, a valid task in every partition
        names = {partition_for(f"sentinel-{i}", PARTITIONS): f"sentinel-{i}" for i in range(100)}
        sentinels = [app.record.schedule((names[p], 0), {}, at=dt.datetime.now(dt.timezone.utc))
                     for p in range(PARTITIONS)]
        dispatcher = scheduler.dispatcher()

        wait_until(lambda: all(getattr(h.status(), "state", None) is State.RELEASED for h in sentinels),
                   60, lambda: [h.status() for h in sentinels])
        expected_dead = {source for source, verdict in fates.items() if verdict == "dead"}
        dead = dead_letters(kafka_bootstrap, unique_name, len(expected_dead))
        assert dispatcher.poll() is None, "the dispatcher crashed"
        assert "Traceback" not in scheduler.log_of(dispatcher)
        print(f"{len(fates)} fuzzed records, {len(expected_dead)} dead-lettered")
        assert set(dead) == expected_dead


# --- the one test over the catalogue ---------------------------------------------------------


@pytest.mark.parametrize("case_id", CATALOGUE)
def test_bad_input(case_id: str, request: pytest.FixtureRequest) -> None:
    case = CATALOGUE[case_id]
    if case.surface == "api":
        error, message = case.expect
        with pytest.raises(error, match=message) as caught:
            case.given(request.getfixturevalue("api_context"))
        assert isinstance(caught.value, SchedulerError)
    elif case.surface == "cli":
        run: TopicRun = request.getfixturevalue("topic_run")
        argv = list(case.given)
        scheduler = run.scheduler
        if argv[0] == "--missing-topic":  # a topic and keyspace nobody created
            argv.pop(0)
            scheduler = Scheduler({**scheduler.env, "CELERY_SCHEDULER_TEST_TOPIC": "t_never_created",
                                   "CELERY_SCHEDULER_TEST_KEYSPACE": "t_never_created"},
                                  scheduler.execlog, scheduler.tmp)
        code, message = case.expect
        result = scheduler.cli(*argv, timeout=60)
        assert (result.returncode, message in result.stderr + result.stdout) == (code, True), (
            result.returncode, result.stdout, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
    else:
        run = request.getfixturevalue("topic_run")
        source = run.sources[case_id]
        if isinstance(case.expect, Dead):
            assert source in run.dead, f"{case_id} ({source}) was not dead-lettered; got {run.dead}"
            assert case.expect.reason in run.dead[source]
        else:
            assert source not in run.dead, run.dead.get(source)
            expected = case.expect.state
            wait_until(lambda: getattr(run.status(case.expect.key), "state", None) is expected, 30,
                       lambda: run.status(case.expect.key))
            ran = {(s["o"], f"seq-{s['seq']}") for s in run.scheduler.starts()}
            key = case.expect.key
            assert ((key.ordering_id, key.uniqueness_key) in ran) == (expected is State.SUCCEEDED)


def test_the_catalogue_is_summarised_in_the_docs() -> None:
    text = (REPO / "docs" / "bad-input.md").read_text()
    assert [case_id for case_id in CATALOGUE if f"`{case_id}`" not in text] == []
