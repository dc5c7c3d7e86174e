"""Every error celery_scheduler raises, in one tree.

::

    SchedulerError
    ├── ConfigurationError           a setting is missing, unknown or of the wrong type
    │   ├── NotUnderTestError        a schedule call of another app inside scheduler_testing
    │   └── PeriodicEntryError       a periodic entry (beat_schedule) cannot be run as given
    ├── ScheduleError                a schedule/cancel call was given bad input
    │   ├── NotAScheduledTaskError   the task was not decorated with @scheduled_task
    │   ├── InvalidKeyError          ordering id or uniqueness key missing, empty, not a string
    │   ├── ScheduleTimeError        the time is in the past beyond the grace window, or invalid
    │   ├── NotSerializableError     an argument or option cannot be encoded as JSON
    │   ├── EnvelopeTooLargeError    the encoded task is over the size limit
    │   ├── NotRetryableError        a retry was asked for a task that is not failed, or
    │   │                            that failed before its task was kept for a retry
    │   ├── NotReschedulableError    a reschedule was asked for a task released, finished,
    │   │                            cancelled, moved already, or unknown
    │   ├── SelectionError           a bulk cancel's selection is empty or contradicts itself
    │   ├── PauseError               a pause names nothing or two things, or a resume names
    │   │                            what is not paused
    │   └── RateLimitError           a rate limit names nothing or two things, its rate is
    │                                not a number > 0, or a lift names what is not limited
    ├── EnvelopeDecodeError          bytes from the topic are not a valid envelope
    ├── BrokerError                  the Celery broker did not take a release
    │   ├── ReleaseNotSentError      certainly not sent (no connection): sent again soon
    │   └── ReleaseUncertainError    the connection failed while sending: it may have been sent
    ├── TaskLogError                 the Kafka side failed
    │   ├── TaskLogUnavailableError  Kafka did not acknowledge within the timeout
    │   └── TopicMissingError        the scheduler topic does not exist (run ``init``)
    └── ScheduleStoreError           the Cassandra side failed
        ├── StoreUnavailableError    Cassandra could not be reached or timed out
        ├── SchemaMissingError       the keyspace or tables do not exist (run ``init``)
        └── LeaseEndedError          a write was not sent: the lease of its partition ended
                                     before it could be (another dispatcher may own it now)

Driver exceptions (confluent-kafka, cassandra-driver) never escape: the adapters raise one
of these ``from`` the driver's exception.
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ConfigurationError",
    "EnvelopeDecodeError",
    "EnvelopeTooLargeError",
    "InvalidKeyError",
    "LeaseEndedError",
    "NotAScheduledTaskError",
    "NotReschedulableError",
    "NotRetryableError",
    "NotSerializableError",
    "NotUnderTestError",
    "PauseError",
    "PeriodicEntryError",
    "RateLimitError",
    "ReleaseNotSentError",
    "ReleaseUncertainError",
    "ScheduleError",
    "ScheduleStoreError",
    "ScheduleTimeError",
    "SchedulerError",
    "SchemaMissingError",
    "SelectionError",
    "StoreUnavailableError",
    "TaskLogError",
    "TaskLogUnavailableError",
    "TopicMissingError",
]


class SchedulerError(Exception):
    """Root of every error raised by celery_scheduler."""


class ConfigurationError(SchedulerError):
    """A ``scheduler_*`` setting is missing, unknown, or has the wrong type or value."""


class NotUnderTestError(ConfigurationError):
    """A call reached the scheduler of a Celery app that no active ``scheduler_testing``
    routes to memory, while one is active: it would have gone to the real Kafka."""


class PeriodicEntryError(ConfigurationError):
    """A periodic entry (of ``beat_schedule``) cannot be run as given; ``entry`` names it."""

    def __init__(self, entry: str, problem: str) -> None:
        super().__init__(f"periodic entry {entry!r}: {problem}")
        self.entry = entry


class ScheduleError(SchedulerError, ValueError):
    """A call to schedule or cancel a task was given input that cannot be scheduled."""


class NotAScheduledTaskError(ScheduleError, TypeError):
    """The object is not a task decorated with ``@scheduled_task``."""


class InvalidKeyError(ScheduleError):
    """An ordering id or uniqueness key is missing, empty, too long or not a string."""


class ScheduleTimeError(ScheduleError):
    """The scheduled time is not a usable point in time, or lies too far in the past."""


class NotSerializableError(ScheduleError, TypeError):
    """An argument, keyword argument or option cannot be represented as JSON."""


class EnvelopeTooLargeError(ScheduleError):
    """The encoded task exceeds ``scheduler_max_envelope_bytes``."""


class SelectionError(ScheduleError):
    """A bulk cancel was given no criterion, a time without its zone, or an empty span."""


class PauseError(ScheduleError):
    """A pause or resume named nothing, or more than one thing, or a resume named what is
    not paused."""


class NotReschedulableError(ScheduleError):
    """A reschedule was asked of a task key that cannot move: released already (it runs, or
    ran, at its time), finished, cancelled, moved already, or unknown.

    Only a key never released moves. A reschedule that races the key's release is decided
    by the dispatcher: the task either moves (its old time never fires) or runs at its old
    time (the new key never appears), never both, never neither.
    """


class RateLimitError(ScheduleError):
    """A rate limit named nothing, or more than one thing (a task name or an ordering id),
    its rate was not a finite number above 0, or a lift named what is not limited."""


class EnvelopeDecodeError(SchedulerError, ValueError):
    """A record's bytes are not a valid envelope; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BrokerError(SchedulerError):
    """Publishing a released task to the Celery broker failed."""


class ReleaseNotSentError(BrokerError):
    """The release certainly did not reach the broker: no connection could be made."""


class ReleaseUncertainError(BrokerError):
    """The connection failed while the release was being sent: the broker may have it.

    The dispatcher treats such a release as sent: it waits for its outcome, or for its
    lease to end, before releasing the key again, so two copies of it never run at once.
    """


class NotRetryableError(ScheduleError):
    """A retry was asked for a task key that is not failed, or that cannot run again.

    Only a failed key can be retried: a pending or released one runs anyway, a succeeded
    or cancelled one is final. A key that failed before its task was kept for a retry
    (written by an older version) must be scheduled again under a new key.
    """


class TaskLogError(SchedulerError):
    """The task log (Kafka) failed."""


class TaskLogUnavailableError(TaskLogError):
    """Kafka could not be reached or did not acknowledge a record in time."""


class TopicMissingError(TaskLogError):
    """The scheduler topic does not exist."""


class ScheduleStoreError(SchedulerError):
    """The schedule store (Cassandra) failed."""


class StoreUnavailableError(ScheduleStoreError):
    """Cassandra could not be reached, or a query timed out or lacked replicas."""


class SchemaMissingError(ScheduleStoreError):
    """The scheduler's keyspace or tables do not exist."""


class LeaseEndedError(ScheduleStoreError):
    """A write was not sent: by this process's clock, the lease of the partition it belongs
    to ended before it could be (a pause between deciding it and sending it). The partition's
    next owner decides the same thing from what it reads; nothing needs to be done."""

    def __init__(self, partition: int, fence_seconds: float, stamp_seconds: float) -> None:
        super().__init__(
            f"a write of partition {partition} was not sent: it would be stamped "
            f"{stamp_seconds - fence_seconds:.3f}s after the lease of the partition ended "
            f"(at {fence_seconds:.3f}); its next owner decides it again")
        self.partition = partition
        self.fence_seconds = fence_seconds
        self.stamp_seconds = stamp_seconds
