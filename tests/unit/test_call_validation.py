"""A schedule call is total: whatever it is given, it either produces an envelope that every
dispatcher accepts, or raises an error of the package's tree.

Generated times, delays, keys, arguments and Celery options go to the call; the bytes of
every accepted call go to the dispatcher's decoder, which must give back the same envelope.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import uuid
from typing import Any

import hypothesis
from hypothesis import strategies as st

from celery_scheduler.api import ScheduledTask
from celery_scheduler.client import get_client
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import CELERY_OPTIONS
from celery_scheduler.errors import SchedulerError
from celery_scheduler.testing import scheduler_testing
from tests.unit.apps import app, note, remind
from tests.unit.budget import examples

UTC = dt.timezone.utc


def _cyclic(kind: str) -> Any:
    if kind == "list":
        value: list[Any] = [1]
        value.append(value)
        return value
    mapping: dict[str, Any] = {"a": 1}
    mapping["self"] = mapping
    return mapping


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63, max_value=2**80),
    st.floats(), st.text(), st.binary(max_size=20), st.datetimes(), st.dates(), st.uuids(),
    st.decimals(), st.just(object()), st.just({1, 2}), st.just(math.inf),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), children, max_size=4),
        st.tuples(children),
    ),
    max_leaves=12,
) | st.sampled_from(["list", "dict"]).map(_cyclic)

serializable = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(), st.binary(max_size=20), st.datetimes(), st.uuids(),
              st.decimals(allow_nan=False, allow_infinity=False)),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                      max_size=4),
    max_leaves=12)

keys = st.one_of(st.none(), st.text(max_size=20), st.text(min_size=510, max_size=520),
                 st.integers(), st.just(""), st.just("a\x00b"), st.just("\ud800"))

WEST, EAST = dt.timezone(dt.timedelta(hours=-12)), dt.timezone(dt.timedelta(hours=14))
times = st.one_of(
    st.datetimes(timezones=st.none() | st.just(UTC) | st.timezones()),
    st.datetimes(min_value=dt.datetime(9999, 12, 31), timezones=st.just(WEST)),  # past year 9999
    st.datetimes(max_value=dt.datetime(1, 1, 2), timezones=st.just(EAST)),  # before year 1
    st.just(dt.datetime.now(UTC) + dt.timedelta(hours=1)),
    st.integers(), st.text(max_size=5),
)
delays = st.one_of(
    st.floats(), st.integers(), st.integers(min_value=10**12, max_value=10**20),
    st.timedeltas(), st.just(math.inf), st.just(-math.inf), st.just(math.nan), st.booleans(),
    st.text(max_size=5), st.decimals(allow_nan=True), st.just(3600),
)
option_values = st.one_of(st.integers(), st.floats(), st.text(max_size=10), st.booleans(),
                          st.none(), st.dictionaries(st.text(max_size=5), values, max_size=2))
options = st.dictionaries(st.sampled_from([*CELERY_OPTIONS, "eta", "link"]),
                          option_values, max_size=3)


def mostly(usual: st.SearchStrategy[Any], unusual: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """*usual* three times in four, so that most calls get far enough to be encoded."""
    return st.one_of(usual, usual, usual, unusual)


good_key = st.text(min_size=1, max_size=20).filter(lambda text: "\x00" not in text)


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    when: dict[str, Any] = draw(mostly(
        st.one_of(st.builds(lambda s: {"countdown": s}, st.floats(0, 10**7)),
                  st.builds(lambda d: {"at": dt.datetime.now(UTC) + d},
                            st.timedeltas(dt.timedelta(0), dt.timedelta(days=3650)))),
        st.one_of(st.builds(lambda t: {"at": t}, times), st.builds(lambda d: {"countdown": d}, delays),
                  st.just({}))))
    task = draw(st.sampled_from([remind, note]))
    usual_args = st.tuples(good_key, values) if task is note else st.tuples(good_key)
    return {
        "task": task,
        "args": draw(mostly(usual_args, st.one_of(st.lists(values, max_size=3), values))),
        "kwargs": draw(mostly(
            st.just({}) if task is note else st.fixed_dictionaries({}, optional={"kind": values}),
            st.one_of(st.dictionaries(st.text(max_size=10), values, max_size=3),
                      st.dictionaries(st.integers(), values, max_size=1), values))),
        "when": when,
        "ordering_id": draw(mostly(st.none(), keys)),
        "uniqueness_key": draw(mostly(st.none(), keys)),
        "options": draw(mostly(st.just({}), options)),
    }


@st.composite
def well_formed_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A time and argument shapes the task takes: what varies is the values within."""
    return {"task": note, "args": (draw(good_key), draw(mostly(serializable, values))),
            "kwargs": {}, "when": {"countdown": draw(st.floats(0, 10**9))},
            "ordering_id": draw(mostly(st.none(), keys)),
            "uniqueness_key": draw(mostly(st.none(), keys)),
            "options": draw(mostly(st.just({}), options))}


@hypothesis.settings(max_examples=examples(1000), deadline=None, database=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(well_formed_calls() | calls())
def test_a_call_is_accepted_whole_by_the_dispatcher_or_refused_with_a_package_error(
        call: dict[str, Any]) -> None:
    task: ScheduledTask = call["task"]
    with scheduler_testing(app):
        try:
            handle = task.schedule(call["args"], call["kwargs"], ordering_id=call["ordering_id"],
                                   uniqueness_key=call["uniqueness_key"], **call["when"],
                                   **call["options"])
        except SchedulerError as exc:
            hypothesis.event(f"refused: {type(exc).__name__}")
            return  # refused at the call, with a typed error
        hypothesis.event("accepted")
        envelope = handle.envelope
        decoded = decode(get_client(app).encode(envelope))  # what a dispatcher reads
    assert decoded == envelope


def test_the_edge_cases_are_refused_with_package_errors() -> None:
    # the values that once escaped as built-in exceptions or reached the dead letters
    cases: list[tuple[Any, dict[str, Any]]] = [
        (((_cyclic("list"),), {}), {"countdown": 60}),
        (((_nested(5000),), {}), {"countdown": 60}),
        ((("c",), {}), {"countdown": math.inf}),
        ((("c",), {}), {"countdown": 10**20}),  # beyond 9999-12-31: the decoder would refuse it
        ((("c",), {}), {"countdown": 60, "expires": math.nan}),
        ((("c",), {}), {"at": dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))}),
        ((("c",), {}), {"countdown": 60, "retry": "three times"}),
        (("c", {}), {"countdown": 60}),  # args not a list: a str would be taken apart
    ]
    with scheduler_testing(app):
        for (args, kwargs), extra in cases:
            try:
                remind.schedule(args, kwargs, **extra)
            except SchedulerError:
                continue
            raise AssertionError(f"accepted {args!r:.60} {extra!r}")


def test_plain_values_and_kombu_values_round_trip() -> None:
    when = dt.datetime.now(UTC) + dt.timedelta(hours=1)
    with scheduler_testing(app):
        handle = remind.schedule(("c",), {"kind": "k"}, at=when, priority=3, expires=1.5)
        extra = note.schedule(("c", {"at": when, "id": uuid.uuid4(), "n": decimal.Decimal("1.5"),
                                     "big": 2**70, "raw": b"\x00\xff"}), {}, countdown=60)
        for envelope in (handle.envelope, extra.envelope):
            assert decode(get_client(app).encode(envelope)) == envelope
