"""Every key the package accepts is reachable through every HTTP route and console page."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import escape

from celery_scheduler.errors import InvalidKeyError
from celery_scheduler.keys import check_key_part
from celery_scheduler.testing import scheduler_testing
from celery_scheduler.web import create_app
from celery_scheduler.web.paths import part, segment, segments
from tests.unit.apps import app
from tests.unit.budget import examples

READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}
WRITE_TOKEN = "write-token-0123456789"


def _usable(text: str) -> bool:
    try:
        check_key_part(text, "key")
    except InvalidKeyError:
        return False
    return True


# the awkward ones drawn often: slashes, dots, tildes, percent signs, and text of any script
_awkward = st.sampled_from(["/", ".", "..", "~", "%", "%2F", "%00", "%25", "?", "#", " ", "+", "&",
                            "\\", "<"])
key_parts = st.lists(st.one_of(_awkward, st.text(min_size=1, max_size=8)), min_size=1,
                     max_size=5).map("".join).filter(_usable)


def test_segments_name_their_part_and_never_a_dot_segment() -> None:
    assert segments("tenant/7", "2030-01-01T00:00:00+00:00", "a b") == (
        "tenant%2F7/2030-01-01T00%3A00%3A00%2B00%3A00/a%20b")
    for text, sent in [(".", "~."), ("..", "~.."), ("~.", "~~."), ("~~..", "~~~.."),
                       ("...", "..."), ("~", "~"), ("~x", "~x"), (".~", ".~")]:
        assert segment(text) == sent and part(sent) == text


def test_a_nul_asked_for_in_a_path_is_never_read_as_a_slash() -> None:
    with scheduler_testing(app) as scheduler:
        http = TestClient(create_app(app))
        made = http.post("/api/v1/tasks", headers=WRITE, json={
            "task": "unit.remind", "args": ["anyone"], "countdown": 3600,
            "ordering_id": "a/b/c", "uniqueness_key": "k"})
        scheduler.advance(0)
        at = quote(made.json()["at"], safe="")
        assert http.get(f"/api/v1/tasks/a%2Fb%2Fc/{at}/k", headers=READ).status_code == 200
        for asked in ["a%00b%2Fc", "a%2Fb%00c", "a%00b%00c", "a%00b"]:
            for where in ["/api/v1/tasks", "/tasks"]:
                answer = http.get(f"{where}/{asked}/{at}/k", headers=READ)
                assert (answer.status_code, answer.json()["error"]) == (422, "InvalidKeyError")
                assert "NUL" in answer.json()["message"]


@settings(max_examples=examples(150), deadline=None)
@given(ordering_id=key_parts, unique=key_parts)
def test_any_key_is_reachable_through_the_api_and_the_pages(ordering_id: str, unique: str) -> None:
    with scheduler_testing(app) as scheduler:
        http = TestClient(create_app(app))
        when = dt.datetime.fromtimestamp(scheduler.clock.ms / 1000 + 3600, dt.timezone.utc)
        made = http.post("/api/v1/tasks", headers=WRITE, json={
            "task": "unit.remind", "args": ["anyone"], "at": when.isoformat(),
            "ordering_id": ordering_id, "uniqueness_key": unique})
        assert made.status_code == 201, made.text
        path = made.json()["path"]
        assert path == f"/tasks/{segments(ordering_id, made.json()['at'], unique)}"
        assert http.get(f"/api/v1{path}", headers=READ).status_code == 404  # not stored yet
        scheduler.advance(0)

        shown = http.get(f"/api/v1{path}", headers=READ)
        assert shown.status_code == 200, (ordering_id, unique, path, shown.text)
        assert shown.json()["key"]["ordering_id"] == ordering_id
        assert shown.json()["key"]["unique"] == unique
        listed = http.get(f"/api/v1/ordering-ids/{segment(ordering_id)}/tasks", headers=READ)
        assert [t["unique"] for t in listed.json()] == [unique], listed.text
        retried = http.post(f"/api/v1{path}/retry", headers=WRITE)  # routed: refused as pending
        assert (retried.status_code, retried.json()["error"]) == (409, "NotRetryableError")

        token = f"?token={WRITE_TOKEN}"
        found = http.get(f"/find?ordering_id={quote(ordering_id, safe='')}&at="
                         f"{quote(made.json()['at'], safe='')}&unique={quote(unique, safe='')}",
                         follow_redirects=False)
        assert found.headers["location"] == path
        page = http.get(path + token)
        assert page.status_code == 200 and str(escape(unique)) in page.text, page.text
        searched = http.get(f"/ordering-ids?ordering_id={quote(ordering_id, safe='')}"
                            f"&token={WRITE_TOKEN}", follow_redirects=False)
        timeline = http.get(searched.headers["location"] + token)
        assert timeline.status_code == 200, timeline.text
        assert f'href="{escape(path)}"' in timeline.text

        cancelled = http.post(f"{path}/cancel", follow_redirects=False)
        assert cancelled.status_code == 303, cancelled.text
        scheduler.advance(0)
        assert http.get(f"/api/v1{path}", headers=READ).json()["state"] == "cancelled"
