"""The task key: what identifies one scheduled execution.

A task key is (ordering id, scheduled time, uniqueness key). Scheduling the same key again
overwrites the pending task; once the key completed it never runs again. Times are kept as
integer milliseconds since the Unix epoch (UTC), Cassandra's timestamp resolution, so that a
key read back from the store is equal to the key that was scheduled. A time between two
milliseconds is rounded up, so that a task never runs before the time it was given.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass

from celery_scheduler.errors import InvalidKeyError, ScheduleTimeError

__all__ = ["MAX_KEY_LENGTH", "MAX_MS", "KeyInput", "TaskKey", "check_key_part", "from_epoch_ms",
           "key_text", "to_epoch_ms"]

# What an application may give as an ordering id or uniqueness key (see key_text).
KeyInput = str | int | uuid.UUID

# Longest ordering id or uniqueness key, in characters; keys are Kafka record keys and
# Cassandra clustering columns, so they should stay short.
MAX_KEY_LENGTH = 512

# Namespace for the deterministic Celery task id of a task key (uuid5 of the key).
TASK_ID_NAMESPACE = uuid.UUID("9b6f0c1e-6a53-4cf4-9e3c-2f0a7d3b8e51")
_NAMESPACE_BYTES = TASK_ID_NAMESPACE.bytes


def _uuid5_text(name: str) -> str:
    """``str(uuid.uuid5(TASK_ID_NAMESPACE, name))``, without the UUID object (a third of the
    cost: every release and every outcome makes one)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: the latest time a key holds


def check_key_part(value: object, what: str) -> str:
    """Return *value* if it is usable as an ordering id or uniqueness key, else raise.

    >>> check_key_part("customer-42", "ordering id")
    'customer-42'
    """
    # the usual key, short plain ASCII, passes these cheap tests; anything else the full ones
    if type(value) is str and 0 < len(value) <= MAX_KEY_LENGTH and value.isascii() \
            and "\x00" not in value:
        return value
    if not isinstance(value, str):
        raise InvalidKeyError(
            f"{what} must be a string (or, where an application gives it, an int or a UUID), "
            f"got {type(value).__name__} {value!r}; convert it to text in the decorator's "
            f"{what.replace(' ', '_')} callable"
        )
    if not value:
        raise InvalidKeyError(f"{what} must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"{what} is {len(value)} characters long, over the limit of {MAX_KEY_LENGTH}: "
            f"{value[:40]!r}...; use a shorter identifier or a hash of it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"{what} {value!r} is not valid Unicode text ({exc.reason})") from exc
    if "\x00" in value:
        raise InvalidKeyError(f"{what} {value!r} contains a NUL character")
    return value


def key_text(value: object, what: str) -> str:
    """An ordering id or uniqueness key an application gave, as the text the key holds.

    Text is taken as it is; an int (not a bool) becomes its decimal text and a UUID its
    hyphenated lower-case form, so a database's primary key can be named in the decorator
    as it is. The key holds text: ``42`` and ``"42"`` are the same key part, and the key read
    back says ``"42"``. Anything else raises :class:`~celery_scheduler.errors.InvalidKeyError`
    (see :func:`check_key_part`).

    >>> key_text(42, "ordering id")
    '42'
    >>> key_text(uuid.UUID("12345678-1234-5678-1234-567812345678"), "uniqueness key")
    '12345678-1234-5678-1234-567812345678'
    """
    if type(value) is not str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = int.__repr__(value)  # an IntEnum member too: its number, not its name
        elif isinstance(value, uuid.UUID):
            value = str(value)
    return check_key_part(value, what)


def to_epoch_ms(when: object, default_tz: dt.tzinfo) -> int:
    """Convert an aware or naive datetime to epoch milliseconds.

    A naive datetime is read in *default_tz*: the scheduler passes Celery's ``app.timezone``,
    which is UTC unless the app sets ``timezone`` (the convention Celery uses for ``eta``).
    A fraction of a millisecond rounds up: ``now() + timedelta(seconds=5)`` is never run
    before those five seconds are up.

    >>> to_epoch_ms(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), dt.timezone.utc)
    1893456000000
    """
    if not isinstance(when, dt.datetime):
        raise ScheduleTimeError(
            f"scheduled time must be a datetime, got {type(when).__name__} {when!r}; "
            "use schedule_in() for a delay in seconds or a timedelta"
        )
    tz = when.tzinfo
    try:
        # UTC, the usual zone, is the epoch's: subtracting needs no offsets then
        aware = when if tz is _UTC or (tz is not None and when.utcoffset() is not None) else (
            _localize(when, default_tz)
        )
        delta = aware - _EPOCH
    except (ArithmeticError, ValueError, TypeError) as exc:  # a tzinfo that fails, year 1
        raise ScheduleTimeError(f"scheduled time {when!r} cannot be read as UTC: {exc}") from None
    ms = (delta.days * 86_400 + delta.seconds) * 1000 - (-delta.microseconds // 1000)
    if delta.days < 0 or ms > MAX_MS:
        raise ScheduleTimeError(f"scheduled time {when.isoformat()} is before 1970 or unusable")
    return ms


def _localize(naive: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    localize = getattr(tz, "localize", None)  # pytz zones need localize(), not replace()
    if callable(localize):
        result: dt.datetime = localize(naive)
        return result
    return naive.replace(tzinfo=tz)


def from_epoch_ms(ms: int) -> dt.datetime:
    """Return the aware UTC datetime of epoch milliseconds *ms*."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


@dataclass(frozen=True, order=True)
class TaskKey:
    """Identity of one scheduled execution: ordering id, time (epoch ms) and uniqueness key.

    >>> key = TaskKey("customer-42", 1893456000000, "welcome-email")
    >>> key.scheduled_at.isoformat()
    '2030-01-01T00:00:00+00:00'
    >>> key.task_id == TaskKey("customer-42", 1893456000000, "welcome-email").task_id
    True
    """

    ordering_id: str
    scheduled_ms: int
    uniqueness_key: str

    @property
    def scheduled_at(self) -> dt.datetime:
        """The scheduled time as an aware UTC datetime."""
        return from_epoch_ms(self.scheduled_ms)

    @property
    def task_id(self) -> str:
        """The Celery task id every release of this key uses (stable across retries)."""
        # kept on the key (not functools.cached_property, which takes a lock each first time)
        task_id: str | None = self.__dict__.get("_task_id")
        if task_id is None:
            name = f"{self.ordering_id}\x1f{self.scheduled_ms}\x1f{self.uniqueness_key}"
            task_id = self.__dict__["_task_id"] = _uuid5_text(name)
        return task_id

    def __hash__(self) -> int:
        # A key is hashed a dozen times on its way through a dispatcher (the timetable, the
        # claims, the batches of a step): the dataclass's hash makes a tuple every time.
        found: int | None = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = hash((self.ordering_id, self.scheduled_ms,
                                                   self.uniqueness_key))
        return found

    def __reduce__(self) -> tuple[type[TaskKey], tuple[str, int, str]]:
        # the fields only: a string's hash differs from one process to the next
        return (TaskKey, (self.ordering_id, self.scheduled_ms, self.uniqueness_key))

    def __str__(self) -> str:
        return f"{self.ordering_id}@{self.scheduled_at.isoformat()}#{self.uniqueness_key}"
