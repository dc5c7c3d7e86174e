"""Settings, read once from the Celery app's configuration.

Every setting lives in ``app.conf`` under the ``scheduler_`` prefix, so it can be set like
any Celery setting::

    app.conf.scheduler_kafka_bootstrap_servers = "kafka-1:9092,kafka-2:9092"

and, with Django and ``app.config_from_object("django.conf:settings", namespace="CELERY")``,
as ``CELERY_SCHEDULER_KAFKA_BOOTSTRAP_SERVERS = "kafka-1:9092"`` in ``settings.py``.
:func:`get_settings` validates them into a :class:`Settings` cached on the app; an unknown
``scheduler_*`` name (a typo) or a wrong type raises
:class:`~celery_scheduler.errors.ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.errors import ConfigurationError
from celery_scheduler.signing import Signer

__all__ = ["PREFIX", "Settings", "get_settings"]

PREFIX = "scheduler_"
_CACHE_ATTRIBUTE = "_celery_scheduler_settings"

# Default topic and keyspace names.
DEFAULT_TOPIC = "celery_scheduler"
DEFAULT_KEYSPACE = "celery_scheduler"


@dataclass(frozen=True)
class Settings:
    """Validated scheduler settings; field ``x`` is read from ``app.conf.scheduler_x``."""

    # Kafka: the task log
    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    kafka_topic: str = DEFAULT_TOPIC
    kafka_partitions: int = 12  # used by `init`; the topic's real count is read from Kafka
    kafka_replication_factor: int = 1
    # extra librdkafka settings, e.g. security.protocol, sasl.mechanism, ssl.ca.location
    kafka_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kafka_produce_timeout: float = 10.0  # seconds a schedule call waits for Kafka's ack

    # Cassandra: the schedule store
    cassandra_contact_points: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
    cassandra_keyspace: str = DEFAULT_KEYSPACE
    # replication used by `init`, e.g. {"class": "NetworkTopologyStrategy", "dc1": 3}
    cassandra_replication: Mapping[str, Any] = field(
        default_factory=lambda: {"class": "SimpleStrategy", "replication_factor": 1}
    )
    cassandra_consistency: str = "LOCAL_QUORUM"
    cassandra_serial_consistency: str = "LOCAL_SERIAL"
    cassandra_username: str | None = None
    cassandra_password: str | None = field(default=None, repr=False)
    cassandra_ssl: bool = False
    cassandra_request_timeout: float = 10.0
    bucket_seconds: int = 60  # width of a schedule row's time bucket
    status_ttl: int = 7 * 24 * 3600  # seconds a finished task's status is kept

    # the schedule call
    grace_seconds: float = 60.0  # how far in the past a scheduled time may be
    max_envelope_bytes: int = 256 * 1024
    # drop-in eta mode (DurableEtaTask): an eta/countdown less than this far ahead goes to
    # Celery as usual, the rest through the scheduler
    eta_threshold_seconds: float = 0.0

    # retries, leases and release
    max_attempts: int = 5
    retry_backoff: float = 1.0
    retry_backoff_max: float = 600.0
    on_exhausted: str = "skip"  # "skip": mark failed, move on; "block": hold the ordering id
    # a released task that has not started this long after its due time is released again
    # (its copy, should it start later, is skipped): how long a task may wait in the broker
    start_lease_seconds: float = 8.0
    # a running task whose worker has not been heard from (beats) for this long is released
    # again; a worker whose beats cannot reach Kafka for this long stops the task
    lease_seconds: float = 20.0
    # dispatcher ownership of a partition; as long as Kafka's session timeout (6 s), so a
    # killed dispatcher's partitions are free about when Kafka hands them on
    partition_lease_seconds: float = 6.0
    max_loaded_per_partition: int = 5000  # tasks a dispatcher holds in memory per partition
    lookahead_seconds: float = 60.0  # how far ahead of now the schedule is loaded
    # tasks a dispatcher has released and not seen finish, at most; 0 follows the rate at
    # which outcomes come back (about two seconds of the workers' work waits in the broker)
    max_in_flight: int = 0
    # a due task is marked released in Cassandra up to this long before its due time, and
    # sent from a thread of its own (0: marked and sent once due) ...
    release_ahead_seconds: float = 0.5
    # ... at its due time (False), or at once, its due time as Celery's eta for the worker
    # to hold it until then (True; see docs/configuration.md for why it is not the default)
    release_eta: bool = False
    startup_timeout: float = 120.0  # a starting dispatcher waits this long for Kafka and Cassandra
    # while every record read is due more than 2 s ahead, a dispatcher keeps reading for up
    # to this long before it writes them: fewer, larger batches at a light load (0: no wait)
    ingest_linger_seconds: float = 1.0

    # optional HMAC signing of records (see celery_scheduler.signing)
    signing_keys: Mapping[str, Any] = field(default_factory=dict, repr=False)
    signing_key_id: str | None = None

    # the web console and HTTP API (`scheduler serve`): bearer token -> "read" or "write"
    api_tokens: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # periodic entries (app.conf.beat_schedule) fired by the dispatchers, with no celery beat
    # (celery_scheduler.periodic)
    periodic: bool = False
    # how long before its time an occurrence (overlap buffer_all or allow_all) is written:
    # time for its task to be stored, loaded and marked released before it is due, with
    # room for thousands of entries that share a time (writing 10,000 takes seconds)
    periodic_ahead_seconds: float = 30.0

    # OpenTelemetry: schedule calls carry the caller's trace context, and each run of the
    # task is a span of that trace (celery_scheduler.tracing)
    opentelemetry: bool = False

    def __post_init__(self) -> None:
        if self.on_exhausted not in ("skip", "block"):
            raise ConfigurationError(
                f"scheduler_on_exhausted must be 'skip' or 'block', got {self.on_exhausted!r}"
            )
        for name in ("kafka_partitions", "kafka_replication_factor", "bucket_seconds",
                     "max_envelope_bytes", "status_ttl", "cassandra_port",
                     "max_loaded_per_partition"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(
                    f"{PREFIX}{name} must be positive, got {getattr(self, name)!r}"
                )
        for name in ("start_lease_seconds", "lease_seconds"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"{PREFIX}{name} must be at least 1 second, got {getattr(self, name)!r}")
        for name in ("grace_seconds", "kafka_produce_timeout", "max_in_flight",
                     "eta_threshold_seconds", "release_ahead_seconds",
                     "partition_lease_seconds", "lookahead_seconds", "startup_timeout",
                     "ingest_linger_seconds", "periodic_ahead_seconds"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{PREFIX}{name} must be >= 0, got {getattr(self, name)!r}")
        if self.signing_keys:
            Signer(self.signing_keys, self.signing_key_id)  # validates keys and the active id
        for token, scope in self.api_tokens.items():
            if not isinstance(token, str) or len(token) < 16 or scope not in ("read", "write"):
                raise ConfigurationError(
                    f"{PREFIX}api_tokens maps tokens of at least 16 characters to 'read' or "
                    f"'write'; got a token of {len(str(token))} characters with scope {scope!r}")
        try:
            self.retry_policy  # noqa: B018 - validates the three retry settings together
        except ValueError as exc:
            raise ConfigurationError(f"retry settings: {exc}") from None

    @property
    def signer(self) -> Signer | None:
        """The signer when signing is configured, else None."""
        return Signer(self.signing_keys, self.signing_key_id) if self.signing_keys else None

    @functools.cached_property
    def retry_policy(self) -> RetryPolicy:
        """The default retry policy (built once: every schedule call without its own uses it)."""
        return RetryPolicy(self.max_attempts, self.retry_backoff, self.retry_backoff_max)

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any], namespace: str | None = None) -> Settings:
        """Build settings from the ``scheduler_*`` entries of *conf* (for example app.conf).

        With *namespace* (Celery's ``config_from_object(..., namespace="CELERY")``), names
        such as ``CELERY_SCHEDULER_KAFKA_TOPIC`` are read as well.
        """
        known = {f.name: f for f in fields(cls)}
        prefixes = [PREFIX] + ([f"{namespace.lower()}_{PREFIX}"] if namespace else [])
        values: dict[str, Any] = {}
        for name in list(conf.keys()):
            if not isinstance(name, str):
                continue
            prefix = next((p for p in prefixes if name.lower().startswith(p)), None)
            if prefix is None:
                continue
            short = name.lower()[len(prefix):]
            if short not in known:
                raise ConfigurationError(
                    f"unknown setting {name!r}; known scheduler settings: "
                    + ", ".join(PREFIX + n for n in sorted(known))
                )
            value = conf[name]
            if value is not None:
                values[short] = _coerce(known[short], value, name)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _coerce(spec: dataclasses.Field[Any], value: Any, name: str) -> Any:
    """Check *value*'s type against the field; accept the forms a config file yields."""
    annotation = str(spec.type)
    wrong = ConfigurationError(f"{name} should be {annotation}, got {type(value).__name__} {value!r}")
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        return float(value)
    if annotation == "bool":
        if not isinstance(value, bool):
            raise wrong
        return value
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise wrong
        return value
    if annotation.startswith("tuple"):
        if isinstance(value, str):  # "host1,host2" from an environment variable
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise wrong
        return tuple(value)
    if annotation.startswith("Mapping"):
        if not isinstance(value, Mapping):
            raise wrong
        return dict(value)
    raise AssertionError(f"no coercion for {annotation}")  # pragma: no cover


def get_settings(app: Any) -> Settings:
    """Return the app's scheduler settings, reading and validating them on first use."""
    cached = getattr(app, _CACHE_ATTRIBUTE, None)
    if isinstance(cached, Settings):
        return cached
    settings = Settings.from_mapping(app.conf, getattr(app, "namespace", None))
    setattr(app, _CACHE_ATTRIBUTE, settings)
    return settings
