from __future__ import annotations

import pytest
from celery import Celery

from celery_scheduler.config import Settings, get_settings
from celery_scheduler.errors import ConfigurationError


def test_defaults_suit_a_local_single_node_setup() -> None:
    settings = get_settings(Celery("defaults", set_as_current=False))
    assert settings.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert settings.cassandra_replication == {"class": "SimpleStrategy", "replication_factor": 1}
    assert settings.retry_policy.max_attempts == 5


def test_settings_are_read_from_app_conf_once() -> None:
    app = Celery("conf", set_as_current=False)
    app.conf.scheduler_kafka_topic = "jobs"
    app.conf.scheduler_cassandra_contact_points = "10.0.0.1, 10.0.0.2"
    settings = get_settings(app)
    assert settings.kafka_topic == "jobs"
    assert settings.cassandra_contact_points == ("10.0.0.1", "10.0.0.2")
    assert get_settings(app) is settings


def test_django_style_namespaced_settings() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
        CELERY_SCHEDULER_KAFKA_TOPIC = "from_django"
        CELERY_SCHEDULER_MAX_ATTEMPTS = 3

    app = Celery("django", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    settings = get_settings(app)
    assert (settings.kafka_topic, settings.max_attempts) == ("from_django", 3)


def test_unknown_setting_is_a_typo_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown setting 'scheduler_kafka_topik'"):
        Settings.from_mapping({"scheduler_kafka_topik": "x"})


@pytest.mark.parametrize(("name", "value"), [
    ("scheduler_kafka_partitions", "12"),
    ("scheduler_kafka_partitions", True),
    ("scheduler_grace_seconds", "soon"),
    ("scheduler_cassandra_replication", "SimpleStrategy"),
    ("scheduler_cassandra_contact_points", [1, 2]),
])
def test_wrong_types_name_the_setting_and_value(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_mapping({name: value})


@pytest.mark.parametrize(("name", "value", "message"), [
    ("scheduler_on_exhausted", "retry", "'skip' or 'block'"),
    ("scheduler_kafka_partitions", 0, "must be positive"),
    ("scheduler_max_attempts", 0, "max_attempts"),
    ("scheduler_lease_seconds", 0.5, "must be at least 1 second"),
    ("scheduler_start_lease_seconds", 0, "must be at least 1 second"),
])
def test_bad_values(name: str, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_mapping({name: value})


def test_secrets_stay_out_of_the_repr() -> None:
    settings = Settings.from_mapping({
        "scheduler_cassandra_password": "hunter2",
        "scheduler_kafka_options": {"sasl.password": "hunter3"},
    })
    assert "hunter2" not in repr(settings) and "hunter3" not in repr(settings)
