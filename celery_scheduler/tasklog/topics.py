"""The Kafka names a deployment derives from its task topic (``scheduler_kafka_topic``).

Every process that needs one takes it from here: the dispatchers, the workers, the operator
commands and the test environment's set-up and tear-down (docs/configuration.md lists them).
"""

from __future__ import annotations

__all__ = ["dead_letter_topic", "dispatcher_group", "outcome_group", "outcome_topic"]


def dead_letter_topic(topic: str) -> str:
    """Where records a dispatcher cannot use are kept, with the reason."""
    return f"{topic}.deadletter"


def outcome_topic(topic: str) -> str:
    """Where workers report outcomes: one partition for each partition of *topic*."""
    return f"{topic}.outcomes"


def dispatcher_group(topic: str) -> str:
    """The Kafka consumer group the dispatchers of *topic* share by default."""
    return f"{topic}.dispatchers"


def outcome_group(group: str) -> str:
    """The consumer group the outcome readers of the dispatchers in *group* share."""
    return f"{group}.outcomes"
