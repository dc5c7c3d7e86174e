"""Which releases share a template, and how many templates a connection keeps."""

from __future__ import annotations

from typing import Any

from celery_scheduler.release.redis_push import Document
from celery_scheduler.release.template import MAX_TEMPLATES, Templates
from celery_scheduler.wire import HEADER


def _document(name: str, **headers: Any) -> Document:
    headers = {"id": "first", "root_id": "first", "argsrepr": "[1]", "kwargsrepr": "{}",
               "eta": None, "expires": None, "timelimit": [295.0, None], "stamps": {},
               HEADER: "first's", **headers}
    properties = {"correlation_id": "first", "argsrepr": "[1]", "kwargsrepr": "{}", "reply_to": "r"}
    return Document(name, headers, properties, ([1], {}, {"chain": None}), "e30=", "celery",
                    {"declare": []}, 2)


def test_a_template_fills_in_each_releases_own_fields() -> None:
    templates = Templates()
    templates.learn("t", {"priority": 3}, _document("t"))
    template = templates.get("t", {"priority": 3})
    assert template is not None and templates.get("t", {"priority": 4}) is None
    made = template.document("second", [2], {"k": 1}, "[2]", "{'k': 1}", "second's")
    assert made.headers["id"] == made.headers["root_id"] == made.properties["correlation_id"] == "second"
    assert (made.headers["argsrepr"], made.properties["kwargsrepr"]) == ("[2]", "{'k': 1}")
    assert made.headers[HEADER] == "second's" and made.body[:2] == ([2], {"k": 1})
    assert made.body_base64 != "e30=" and made.properties["reply_to"] == "r"


def test_options_taken_per_message_or_unhashable_have_no_template() -> None:
    for options in ({"headers": {"a": 1}}, {"expires": 60}, {"queue": ["not", "hashable"]}):
        assert Templates.key("t", options) is None
    templates = Templates()
    templates.learn("t", {}, _document("t", eta="2030-01-01T00:00:00+00:00"))  # sent ahead
    templates.learn("u", {}, _document("u", expires="2030-01-01T00:00:00+00:00"))
    assert templates.get("t", {}) is None and templates.get("u", {}) is None


def test_a_connection_keeps_at_most_max_templates() -> None:
    templates = Templates()
    for n in range(MAX_TEMPLATES + 50):
        templates.learn("t", {"shadow": f"t-{n}"}, _document("t"))
    assert templates.get("t", {"shadow": "t-0"}) is not None
    assert templates.get("t", {"shadow": f"t-{MAX_TEMPLATES - 1}"}) is not None
    assert templates.get("t", {"shadow": f"t-{MAX_TEMPLATES}"}) is None
