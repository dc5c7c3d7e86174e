"""The librdkafka settings every Kafka client of the package starts from."""

from __future__ import annotations

from celery_scheduler.tasklog.kafka import client_config


def test_a_client_tries_a_broker_that_is_away_again_within_a_second() -> None:
    # librdkafka's default (10 s) kept a dispatcher out of its group for up to 10 s after a
    # restarted broker was back
    config = client_config("kafka-1:9092", {})

    assert config["bootstrap.servers"] == "kafka-1:9092"
    assert config["reconnect.backoff.max.ms"] <= 1000


def test_the_options_of_the_application_win() -> None:
    config = client_config("kafka-1:9092", {"reconnect.backoff.max.ms": 5000,
                                            "security.protocol": "SSL"})

    assert config["reconnect.backoff.max.ms"] == 5000
    assert config["security.protocol"] == "SSL"
