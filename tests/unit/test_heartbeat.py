"""The worker's side of beats: when a running task says so, and when it must stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from celery_scheduler.heartbeat import (
    CLOCK_MARGIN_MS,
    MAX_CREDIT_MS,
    Beats,
    RunLease,
    beat_every_ms,
    credit_ms,
    not_started_by_ms,
    start_after_ms,
    stopped_by_ms,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.wire import Beat, Outcome, Release, decode_report, parse_header

KEY = TaskKey("customer-42", 1_893_456_000_000, "welcome")
RELEASE = Release(KEY, 3, 1, 7, lease_until_ms=1_893_456_008_000, not_before_ms=1_893_456_000_000,
                  run_lease_ms=20_000, marked_ms=1_893_455_999_600)


def test_the_rules_at_the_default_leases() -> None:
    assert (beat_every_ms(20_000), credit_ms(20_000), start_after_ms(20_000)) == (2_000, 2_500, 500)
    assert not_started_by_ms(RELEASE.lease_until_ms) == RELEASE.lease_until_ms + 500 + MAX_CREDIT_MS
    assert stopped_by_ms(1_000, 20_000) == 1_000 + 20_000 + 2_500


def test_a_beat_and_the_release_header_round_trip() -> None:
    beat = Beat(KEY, 3, 1, RELEASE.lease_until_ms, 5, 4, 20_000)
    assert decode_report(beat.encode()) == beat
    assert parse_header(RELEASE.header()) == RELEASE
    outcome = Outcome(KEY, 3, 1, True, None, 4, 5, RELEASE.lease_until_ms)
    assert decode_report(outcome.encode()) == outcome


def test_a_beat_is_no_outcome_to_a_dispatcher_that_knows_only_outcomes() -> None:
    # what Outcome.decode of an earlier version read: the fields "s" and "x" are missing
    assert Outcome.decode(Beat(KEY, 3, 1, 2, 5, 4, 20_000).encode()) is None


def test_a_short_task_sends_no_beat_and_a_long_one_beats_every_tenth_of_its_lease() -> None:
    lease = RunLease.begin(RELEASE, now=0.0, started_ms=100)
    assert lease.next_beat == 500
    beat = lease.beat(500, 600)
    assert (beat.key, beat.attempt, beat.generation, beat.sent_ms, beat.started_ms) == (
        KEY, 1, RELEASE.lease_until_ms, 600, 100)
    assert lease.next_beat == 2_500


# A start at the end of the start lease (a copy is stale 2 s before it ends), and at the due time.
LAST_START = RELEASE.lease_until_ms - 2_000
DUE = RELEASE.not_before_ms


def test_a_task_runs_on_while_its_beats_are_taken_in_time() -> None:
    lease = RunLease.begin(RELEASE, now=0.0, started_ms=LAST_START)
    assert lease.alive_until == 500 + 2_500  # the first beat's time to count
    lease.acknowledged(sent=500, acked=600)
    assert lease.alive_until == 20_500
    lease.acknowledged(sent=2_500, acked=2_500 + 2_400)
    assert lease.alive_until == 22_500
    assert not lease.expired(22_500) and lease.expired(22_501)


def test_a_beat_taken_late_does_not_count() -> None:
    lease = RunLease.begin(RELEASE, now=0.0, started_ms=LAST_START)
    lease.acknowledged(sent=500, acked=500 + 2_501)  # a dispatcher may not have read it in time
    assert lease.alive_until == 3_000 and lease.expired(3_001)


def test_a_beat_taken_after_the_task_had_to_stop_does_not_bring_it_back() -> None:
    lease = RunLease.begin(RELEASE, now=0.0, started_ms=LAST_START)
    lease.acknowledged(sent=500, acked=700)
    lease.acknowledged(sent=20_400, acked=20_600)  # in time, but after 20_500
    assert lease.alive_until == 20_500


def test_a_task_started_when_due_runs_until_a_dispatcher_could_take_it_for_never_started() -> None:
    """Before its first beat counts, a task that started at its due time runs until the end
    of its start lease plus a dispatcher's wait for a first beat (3 s), less the clocks'
    margin (2 s): a Kafka leader's failover of several seconds does not stop it."""
    lease = RunLease.begin(RELEASE, now=0.0, started_ms=DUE)
    unheard = not_started_by_ms(RELEASE.lease_until_ms) - CLOCK_MARGIN_MS
    assert lease.alive_until == unheard - DUE == 9_000
    lease.acknowledged(sent=8_500, acked=8_900)  # late in the wait, but in time: it counts
    assert lease.alive_until == 8_500 + 20_000
    late = RunLease.begin(RELEASE, now=0.0, started_ms=DUE)
    late.acknowledged(sent=8_500, acked=9_100)  # taken after the task had to stop
    assert late.alive_until == 9_000 and late.expired(9_001)


def test_a_release_without_a_start_lease_has_its_first_beats_wait_and_credit() -> None:
    lease = RunLease.begin(replace(RELEASE, lease_until_ms=0), now=0.0, started_ms=DUE)
    assert lease.alive_until == 500 + 2_500


class FakeKafka:
    def __init__(self) -> None:
        self.sent: list[Beat] = []
        self.answers: list[Callable[[bool], None]] = []
        self.take = True
        self.hold = False  # answers wait

    def send(self, beat: Beat, answered: Callable[[bool], None]) -> None:
        self.sent.append(beat)
        self.answers.append(answered)

    def poll(self) -> None:
        if self.hold:
            return
        answers, self.answers = self.answers, []
        for answer in answers:
            answer(self.take)


# The release of a task that starts when due on the fake clocks below, which start at 0.
FROM_ZERO = replace(RELEASE, lease_until_ms=8_000, not_before_ms=0)


def beats_on(kafka: FakeKafka, clock: list[float], stopped: list[RunLease]) -> Beats:
    return Beats(kafka.send, kafka.poll, fence=stopped.append, clock=lambda: clock[0],
                 wall=lambda: int(clock[0]))


def test_the_beats_of_a_process_while_kafka_takes_them() -> None:
    kafka, clock, stopped = FakeKafka(), [0.0], []
    beats = beats_on(kafka, clock, stopped)
    token = beats.running(FROM_ZERO, 0)
    for ms in range(0, 60_001, 100):  # a minute: three run leases
        clock[0] = float(ms)
        beats.tick()
    assert stopped == []
    assert len(kafka.sent) == 30  # at 0.5 s, then every 2 s
    beats.done(token)
    clock[0] += 100_000
    assert beats.tick() == float("inf") and stopped == []  # done: nothing more


def test_a_task_whose_beats_do_not_reach_kafka_is_stopped_when_its_lease_is_gone() -> None:
    kafka, clock, stopped = FakeKafka(), [0.0], []
    beats = beats_on(kafka, clock, stopped)
    beats.running(FROM_ZERO, 0)
    for ms in range(0, 10_001, 100):
        clock[0] = float(ms)
        beats.tick()
    kafka.take = False  # Kafka out of reach from here on
    for ms in range(10_100, 40_001, 100):
        clock[0] = float(ms)
        beats.tick()
        if stopped:
            break
    # the last beat that counted was sent at 8.5 s: the task may run until 28.5 s, not later
    assert [lease.release for lease in stopped] == [FROM_ZERO]
    assert 28_500 < clock[0] <= 28_600
    assert beats.leases() == []


def test_a_task_cut_off_from_kafka_from_its_start_stops_a_second_after_its_start_lease() -> None:
    kafka, clock, stopped = FakeKafka(), [0.0], []
    kafka.take = False
    beats = beats_on(kafka, clock, stopped)
    beats.running(FROM_ZERO, 0)
    for ms in range(0, 20_001, 100):
        clock[0] = float(ms)
        beats.tick()
        if stopped:
            break
    assert stopped and 9_000 < clock[0] <= 9_100  # 8 s start lease + 3 s - 2 s of clocks


def test_the_wait_until_the_next_beat_is_what_tick_says() -> None:
    kafka, clock, stopped = FakeKafka(), [0.0], []
    beats = beats_on(kafka, clock, stopped)
    assert beats.tick() == float("inf")
    beats.running(FROM_ZERO, 0)
    assert beats.tick() == 500  # until the first beat
    kafka.hold = True
    clock[0] = 500
    assert beats.tick() == 50  # a beat unanswered: the client's reports are served soon
    kafka.hold = False
    clock[0] = 550
    assert beats.tick() == 1_950  # answered: until the next beat
