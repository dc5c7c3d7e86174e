"""Two dispatchers, simulated workers and a faulty broker, on one fake clock.

A seeded simulation of what the chaos suite does with real services, at the engine's level
and a thousand times faster: dispatchers that trade partitions and pause past their leases,
a broker that fails publishes (some of which it took after all) and loses messages, workers
that are busy (so copies start late and are skipped as stale), outcomes that arrive late,
twice or never. Workers keep the beat rules of ``celery_scheduler.heartbeat`` with its own
``RunLease``: some tasks run for several run leases, some workers die mid-run, and some are
cut off from Kafka for a while (their beats arrive late or never, and they stop what they
run once its lease is gone). The workers' execution log is then checked against the
guarantees: every task ran, and per ordering id the first runs are in schedule order and no
two runs overlap (a killed or stopped run ends when it was killed).

Schedule records reach the engines in one of two ways: written to the store by the
simulation itself, in order and only by the partition's leaseholder (what ingest promises),
or through the real ingest loop of each dispatcher, reading the in-memory task log as a
member of one consumer group that rebalances with the engines.
"""

from __future__ import annotations

import random
import types
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest

from celery_scheduler import heartbeat
from celery_scheduler.dispatcher import beats as beats_module
from celery_scheduler.dispatcher import engine as engine_module
from celery_scheduler.dispatcher import ingest as ingest_module
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.dispatcher.timetable import Loaded
from celery_scheduler.envelope import CancelEnvelope, RetryPolicy, ScheduleEnvelope, encode
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError, StoreUnavailableError
from celery_scheduler.heartbeat import RunLease
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cursor, RunTimes, State, StoredTask, TaskStatus
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.dead_letters import MemoryDeadLetters
from celery_scheduler.tasklog.memory import MemoryTaskLog, MemoryTaskLogReader
from celery_scheduler.wire import Beat, Outcome, OutcomeBatch, Release
from celery_scheduler.worker import STALE_MARGIN_MS

START_MS = 1_893_456_000_000
TICK_MS = 50
PARTITIONS = 3
LEASE_MS = 10_000  # the run lease
START_LEASE_MS = 4_000


class World:
    """The fake clock, in milliseconds; the engines' monotonic clock follows it."""

    def __init__(self) -> None:
        self.ms = START_MS

    def clock(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.ms / 1000


@dataclass
class BrokerMessage:
    key: TaskKey
    release: Release
    duration_ms: int


@dataclass
class Run:
    key: TaskKey
    start: int
    end: int


@dataclass
class Worker:
    started: int = 0
    busy_until: int = 0
    running: BrokerMessage | None = None
    lease: RunLease | None = None
    dies_at: int = 0  # killed (SIGKILL) then, mid-run (0: not)
    cut_off_until: int = 0  # what it produces reaches Kafka only from then on


@dataclass
class Dispatcher:
    name: str
    engine: Engine
    owned: set[int] = field(default_factory=set)
    paused_until: int = 0
    read: dict[int, int] = field(default_factory=dict)  # outcomes partition -> next offset
    reader: MemoryTaskLogReader | None = None  # with the real ingest loop: the task log
    ingest: Ingest | None = None
    # per partition: the time before which every outcome and beat appended to it was read
    read_until: dict[int, int] = field(default_factory=dict)


class Crash(BaseException):
    """The process writing to the store died (SIGKILL) in the middle of a write."""


class FlakyStore(MemoryScheduleStore):
    """The memory store, now and then down: a write may fail before or after it applied.

    With *crashes*, a put now and then kills its writer instead, after it applied or not.
    """

    def __init__(self, rng: random.Random, crashes: bool = False) -> None:
        super().__init__(bucket_seconds=2)
        self.rng = rng
        self.crashes = crashes

    def _flaky(self) -> bool:
        """Raise (not applied) or say so (apply, then raise: a timeout after the write)."""
        roll = self.rng.random()
        if roll < 0.01:
            raise StoreUnavailableError("timed out")
        return roll < 0.02

    def mark_released_many(self, releases: Sequence[tuple[StoredTask, int, int]],
                           now_ms: int) -> None:
        if self._flaky():  # concurrent writes, some of which went through
            super().mark_released_many(releases[:self.rng.randrange(len(releases) + 1)], now_ms)
            raise StoreUnavailableError("timed out after some of the writes")
        super().mark_released_many(releases, now_ms)

    def finish_many(self, tasks: Sequence[StoredTask], state: State, now_ms: int,
                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        after = self._flaky()
        super().finish_many(tasks, state, now_ms, runs)
        if after:
            raise StoreUnavailableError("timed out after the write")

    def statuses(self, keys: Sequence[TaskKey]) -> list[TaskStatus | None]:
        self._flaky()
        return super().statuses(keys)

    def read(self, partition: int, after: Cursor, limit: int, inclusive: bool = False
             ) -> list[StoredTask]:
        self._flaky()
        return super().read(partition, after, limit, inclusive)

    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        if self.crashes and self.rng.random() < 0.003:
            if self.rng.random() < 0.5:
                super().put(partition, envelope, now_ms)
            raise Crash()
        after = self._flaky()
        stored = super().put(partition, envelope, now_ms)
        if after:
            raise StoreUnavailableError("timed out after the write")
        return stored


class Simulation:
    def __init__(self, seed: int, *, ordering_ids: int = 12, per_id: int = 8,
                 through_ingest: bool = False) -> None:
        self.rng = random.Random(seed)
        self.through_ingest = through_ingest
        self.log = MemoryTaskLog(PARTITIONS)
        self.group_committed = [0] * PARTITIONS  # the dispatchers' consumer group
        self.dead_letters = MemoryDeadLetters()
        self.world = World()
        self.store = FlakyStore(self.rng, crashes=through_ingest)
        self.queue: deque[BrokerMessage] = deque()
        self.workers = [Worker() for _ in range(3)]
        self.runs: list[Run] = []
        # outcomes "topic": per partition a log, and the offset committed for it
        self.outcome_log: dict[int, list[tuple[int, Outcome | Beat]]] = {p: [] for p in range(PARTITIONS)}
        self.committed: dict[int, int] = dict.fromkeys(range(PARTITIONS), 0)
        self.settings = EngineSettings(lease_seconds=LEASE_MS / 1000,
                                       start_lease_seconds=START_LEASE_MS / 1000,
                                       partition_lease_seconds=6.0,
                                       tick_seconds=0, outcome_poll_seconds=1.0, max_loaded=8,
                                       lookahead_seconds=5.0, page_size=3)
        self.dispatchers = [self._dispatcher(f"d{i}") for i in range(2)]
        self.keys: dict[str, list[TaskKey]] = {}
        # (when ingest writes it, partition, what): a put (an envelope) or a cancel (a key)
        self.pending: list[tuple[int, int, ScheduleEnvelope | TaskKey]] = []
        for n in range(ordering_ids):
            ordering_id = f"o{n}"
            partition = n % PARTITIONS
            at = START_MS + self.rng.randrange(0, 3000)
            written = 0
            for seq in range(per_id):
                at += self.rng.randrange(0, 1500)
                envelope = ScheduleEnvelope(TaskKey(ordering_id, at, f"s{seq:03d}"), "t",
                                            retry=RetryPolicy(100, 0.2, 1.0))
                self.keys.setdefault(ordering_id, []).append(envelope.key)
                # mostly well ahead; some only once due (ingest lagging); in schedule order
                lead = self.rng.choice([20_000, 20_000, 5_000, 500, -1_000, -3_000])
                written = max(written, at - lead)
                self.pending.append((written, partition, envelope))
                if self.rng.random() < 0.05:  # and now and then a cancel, soon after
                    self.pending.append((written + self.rng.randrange(0, 4000), partition,
                                         envelope.key))
        self.pending.sort(key=lambda item: item[0])
        for partition in range(PARTITIONS):
            self._assign(self.dispatchers[partition % 2], partition)

    def _dispatcher(self, name: str) -> Dispatcher:
        holder: list[Dispatcher] = []

        def publish_many(items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
            return self.publish(holder[0], items)

        engine = Engine(self.store, lambda task, release: None, name, self.settings,
                        clock=self.world.clock, publish_many=publish_many,
                        monotonic=self.world.monotonic, rng=random.Random(self.rng.random()))
        dispatcher = Dispatcher(name, engine)
        # what its outcome reader has read up to: everything appended before its last read
        engine.hears(outcomes_read_until=lambda partition: dispatcher.read_until.get(partition, 0))
        if self.through_ingest:
            dispatcher.reader = MemoryTaskLogReader(self.log, "sim", self.group_committed, ())
            dispatcher.ingest = Ingest(dispatcher.reader, self.store, engine, self.dead_letters,
                                       lambda: PARTITIONS, clock=self.world.clock, batch_size=20)
        holder.append(dispatcher)
        return dispatcher

    # --- the broker and the workers ------------------------------------------------------

    def publish(self, dispatcher: Dispatcher, items: list[tuple[Loaded, Release]]
                ) -> list[Exception | None]:
        roll = self.rng.random()
        if roll < 0.03:  # no connection: nothing was sent
            return [ReleaseNotSentError("connection refused")] * len(items)
        if roll < 0.06:  # the connection dropped while sending: the broker may have it all
            if self.rng.random() < 0.5:
                self._enqueue(items)
            return [ReleaseUncertainError("connection lost")] * len(items)
        self._enqueue(items)
        return [None] * len(items)

    def _enqueue(self, items: list[tuple[Loaded, Release]]) -> None:
        for task, release in items:
            if self.rng.random() < 0.02:
                continue  # lost by the broker
            # mostly short; some run for several run leases
            duration = (self.rng.randrange(10, 400) if self.rng.random() < 0.97
                        else self.rng.randrange(LEASE_MS, 3 * LEASE_MS))
            self.queue.append(BrokerMessage(task.key, release, duration))

    def _work(self) -> None:
        now = self.world.ms
        for worker in self.workers:
            message, lease = worker.running, worker.lease
            if message is not None and lease is not None:
                # killed, or stopped once no beat counted for its lease: nothing more from it
                if (worker.dies_at and now >= worker.dies_at) or lease.expired(now):
                    self._ended(worker, now)
                elif now >= worker.busy_until:
                    self._ended(worker, worker.busy_until)
                    if self.rng.random() < 0.03:
                        continue  # the worker died before its outcome left
                    outcome = Outcome(message.key, message.release.partition,
                                      message.release.attempt, True, None,
                                      generation=message.release.lease_until_ms)
                    self._produce(worker, outcome, self.rng.choice([0, 0, 0, 50, 200, 2000, 8000]))
                elif now >= lease.next_beat:
                    beat = lease.beat(now, now)
                    self._produce(worker, beat, self.rng.choice([0, 0, 50, 100, 400, 3000]),
                                  (lease, now))
            if worker.running is None:
                while self.queue:
                    message = self.queue.popleft()
                    if now > message.release.lease_until_ms - STALE_MARGIN_MS:
                        continue  # stale copy, skipped
                    worker.running, worker.started = message, now
                    worker.busy_until = now + message.duration_ms
                    worker.lease = RunLease.begin(message.release, now, now)
                    worker.dies_at = (now + self.rng.randrange(1, message.duration_ms + 1)
                                      if self.rng.random() < 0.02 else 0)
                    break
            if self.rng.random() < 0.0005:  # cut off from Kafka for a while
                worker.cut_off_until = now + self.rng.randrange(2000, 20_000)

    def _ended(self, worker: Worker, end: int) -> None:
        assert worker.running is not None
        self.runs.append(Run(worker.running.key, worker.started, end))
        worker.running = worker.lease = None

    def _produce(self, worker: Worker, record: Outcome | Beat, delay: int,
                 beat_of: tuple[RunLease, int] | None = None) -> None:
        """*record* reaches the outcomes topic after *delay* (or after a cut-off, if later;
        some records sent while cut off are lost); a beat's lease learns when Kafka took it."""
        now = self.world.ms
        if now < worker.cut_off_until:
            if self.rng.random() < 0.5:
                return
            delay = max(delay, worker.cut_off_until - now)
        self.delayed.append((now + delay, record, beat_of))

    delayed: list[tuple[int, Outcome | Beat, tuple[RunLease, int] | None]]

    def _deliver_outcomes(self) -> None:
        now = self.world.ms
        ready = [item for item in self.delayed if item[0] <= now]
        self.delayed = [item for item in self.delayed if item[0] > now]
        for _, record, beat_of in ready:
            log = self.outcome_log[record.partition]
            log.append((len(log), record))
            if beat_of is not None:
                lease, sent = beat_of
                lease.acknowledged(sent, now)
        for dispatcher in self.dispatchers:
            if now < dispatcher.paused_until:
                continue
            for partition in dispatcher.owned:
                log = self.outcome_log[partition]
                start = dispatcher.read.get(partition, self.committed[partition])
                if start < len(log):
                    outcomes = [r for _, r in log[start:] if isinstance(r, Outcome)]
                    beats = [replace(r, offset=offset) for offset, r in log[start:]
                             if isinstance(r, Beat)]
                    dispatcher.read[partition] = len(log)
                    dispatcher.engine.outcomes(OutcomeBatch(outcomes, {partition: len(log)},
                                                            beats=beats))
                dispatcher.read_until[partition] = now
            for partition, offset in dispatcher.engine.durable_outcome_offsets().items():
                if partition in dispatcher.owned:
                    self.committed[partition] = max(self.committed[partition], offset)

    # --- ownership ----------------------------------------------------------------------

    def _assign(self, dispatcher: Dispatcher, partition: int) -> None:
        dispatcher.owned.add(partition)
        dispatcher.read.pop(partition, None)
        dispatcher.read_until.pop(partition, None)
        dispatcher.engine.assign([partition])
        if dispatcher.reader is not None and dispatcher.ingest is not None:
            dispatcher.reader.assign([partition])
            dispatcher.ingest.assigned([partition])

    def _revoke(self, dispatcher: Dispatcher, partition: int) -> None:
        dispatcher.owned.discard(partition)
        self._revoke_reading(dispatcher, [partition])
        dispatcher.engine.revoke([partition])
        for p, offset in dispatcher.engine.durable_outcome_offsets().items():
            if p == partition:
                self.committed[p] = max(self.committed[p], offset)
        dispatcher.read.pop(partition, None)

    @staticmethod
    def _revoke_reading(dispatcher: Dispatcher, partitions: list[int]) -> None:
        if dispatcher.reader is not None and dispatcher.ingest is not None:
            dispatcher.reader.revoke(partitions)
            dispatcher.ingest.revoked(partitions)

    def _faults(self) -> None:
        now = self.world.ms
        roll = self.rng.random()
        if roll < 0.004:  # a rebalance moves one partition
            partition = self.rng.randrange(PARTITIONS)
            source = next(d for d in self.dispatchers if partition in d.owned)
            target = next(d for d in self.dispatchers if d is not source)
            if now >= source.paused_until:
                self._revoke(source, partition)
                self._assign(target, partition)
        elif roll < 0.0065:
            self._kill()
        elif roll < 0.008:  # a dispatcher stops (SIGSTOP) for longer than its leases
            paused = self.rng.choice(self.dispatchers)
            other = next(d for d in self.dispatchers if d is not paused)
            if now >= paused.paused_until and now >= other.paused_until:
                paused.paused_until = now + self.rng.randrange(7000, 15000)
                self.resume.append(paused)
                for partition in sorted(paused.owned):  # the group moves its partitions on
                    paused.owned.discard(partition)
                    self._assign(other, partition)

    resume: list[Dispatcher]

    def _kill(self, victim: Dispatcher | None = None) -> None:
        """SIGKILL a dispatcher and start another; its partitions move once the group sees it."""
        victim = victim or self.rng.choice(self.dispatchers)
        if self.world.ms < victim.paused_until:
            return
        index = self.dispatchers.index(victim)
        self.kills += 1
        fresh = self._dispatcher(f"{victim.name}-{self.kills}")
        self.dispatchers[index] = fresh
        fresh.paused_until = self.world.ms + 6000  # the session timeout, then a rebalance
        other = next(d for d in self.dispatchers if d is not fresh)
        for partition in sorted(victim.owned):
            self._assign(self.rng.choice([fresh, other]), partition)

    kills = 0

    def _persist(self) -> None:
        if self.through_ingest:
            self._produce_and_ingest()
            return
        while self.pending and self.pending[0][0] <= self.world.ms:
            _, partition, what = self.pending[0]
            writer = next((d for d in self.dispatchers if partition in d.owned
                           and self.world.ms >= d.paused_until
                           and d.engine.may_persist(partition)), None)
            if writer is None:
                return  # ingest waits until its engine holds the lease
            try:
                if isinstance(what, TaskKey):
                    if self.store.cancel(partition, what, self.world.ms):
                        writer.engine.cancelled(what)
                else:
                    stored = self.store.put(partition, what, self.world.ms)
                    if stored is not None:
                        writer.engine.persisted(stored)
            except StoreUnavailableError:
                return  # not committed: read again
            self.pending.pop(0)

    def _produce_and_ingest(self) -> None:
        """Schedule calls reach the task log on time; each dispatcher's ingest reads its share."""
        while self.pending and self.pending[0][0] <= self.world.ms:
            _, _, what = self.pending.pop(0)
            envelope = CancelEnvelope(what, self.world.ms) if isinstance(what, TaskKey) else what
            self.log.publish_async(envelope.key.ordering_id, encode(envelope))
        for dispatcher in list(self.dispatchers):
            if self.world.ms >= dispatcher.paused_until and dispatcher.ingest is not None:
                try:
                    dispatcher.ingest.poll_once(0)
                except Crash:
                    self._kill(dispatcher)

    def run(self, seconds: int) -> None:
        self.delayed, self.resume = [], []
        end = self.world.ms + seconds * 1000
        while self.world.ms < end:
            self.world.ms += TICK_MS
            for paused in [d for d in self.resume if self.world.ms >= d.paused_until]:
                self.resume.remove(paused)
                self._revoke_reading(paused, list(paused.engine.partitions))  # the group caught up
                paused.engine.revoke(list(paused.engine.partitions))
            self._faults()
            self._persist()
            for dispatcher in self.dispatchers:
                if self.world.ms >= dispatcher.paused_until:
                    try:
                        dispatcher.engine.step()
                    except StoreUnavailableError:  # as Engine.run does: again in a second
                        dispatcher.paused_until = self.world.ms + 1000
            self._work()
            self._deliver_outcomes()
        for worker in self.workers:  # still running: started, and running until now
            if worker.running is not None:
                self._ended(worker, self.world.ms)

    # --- the guarantees ------------------------------------------------------------------

    def problems(self) -> list[str]:
        found = [f"dead-lettered: {reason}" for _, reason in self.dead_letters.sent]
        by_key: dict[TaskKey, list[Run]] = {}
        for run in self.runs:
            by_key.setdefault(run.key, []).append(run)
        for ordering_id, keys in self.keys.items():
            missing = [k.uniqueness_key for k in keys if k not in by_key
                       and MemoryScheduleStore.status(self.store, k).state is not State.CANCELLED]
            if missing:
                found.append(f"{ordering_id}: never ran {missing}")
            firsts = [(min(r.start for r in by_key[k]), k.uniqueness_key) for k in keys if k in by_key]
            if [u for _, u in sorted(firsts)] != [u for _, u in firsts]:
                found.append(f"{ordering_id}: out of order {sorted(firsts)}")
            runs = sorted((r for k in keys for r in by_key.get(k, [])), key=lambda r: r.start)
            longest: Run | None = None  # of the runs started so far, the one that ends last
            for run in runs:
                if longest is not None and run.start < longest.end:
                    found.append(f"{ordering_id}: {run.key.uniqueness_key} started at "
                                 f"{run.start - START_MS} while {longest.key.uniqueness_key} ran "
                                 f"until {longest.end - START_MS}")
                if longest is None or run.end > longest.end:
                    longest = run
        return found


def _simulate(seed: int, monkeypatch: pytest.MonkeyPatch, through_ingest: bool) -> Simulation:
    sim = Simulation(seed, through_ingest=through_ingest)
    fake_time = types.SimpleNamespace(monotonic=sim.world.monotonic,
                                      time_ns=lambda: sim.world.ms * 1_000_000,
                                      sleep=lambda seconds: None)
    monkeypatch.setattr(engine_module, "time", fake_time)
    monkeypatch.setattr(ingest_module, "time", fake_time)
    sim.run(240)
    return sim


@pytest.mark.parametrize("seed", range(80))
def test_engines_keep_order_and_lose_nothing_under_faults(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _simulate(seed, monkeypatch, through_ingest=False).problems() == []


@pytest.mark.parametrize("seed", range(40))
def test_dispatchers_reading_the_task_log_keep_order_and_lose_nothing_under_faults(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = _simulate(seed, monkeypatch, through_ingest=True)
    assert sim.problems() == []
    assert sim.group_committed == [len(sim.log.records(p)) for p in range(PARTITIONS)]


# Each rule of celery_scheduler.heartbeat, broken on purpose: the simulation must then find
# what the rule prevents (overlapping runs, mostly), or it could not tell that it holds.
BROKEN_RULES = {
    "the dispatcher ignores beats": (beats_module.Beats, "heard",
                                     lambda self, task, beat, read: None),
    "outcome commits pass the beats of running tasks": (beats_module.Beats, "floors",
                                                        lambda self: {}),
    "a worker runs on when its beats do not reach Kafka": (RunLease, "expired",
                                                           lambda self, now: False),
    "a worker waits for its first beat to count without end": (
        RunLease, "begin", classmethod(lambda cls, release, now, started_ms: cls(
            release, started_ms, 2.0**60, now + heartbeat.start_after_ms(release.run_lease_ms)))),
}


@pytest.mark.parametrize("rule", sorted(BROKEN_RULES))
def test_the_simulation_finds_each_beat_rule_broken(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, name, broken = BROKEN_RULES[rule]
    monkeypatch.setattr(owner, name, broken)
    for seed in range(40):
        if _simulate(seed, monkeypatch, through_ingest=False).problems():
            return
    pytest.fail(f"no seed of 40 showed a problem with {rule}")
