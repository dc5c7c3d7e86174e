"""Checked by mypy in tests/unit/test_typed_decorator.py: a line whose comment says which
error it must give fails with it; no other line may give one."""

import datetime as dt

from celery import Celery, shared_task

from celery_scheduler import TaskKey, scheduled_task
from celery_scheduler.api import ScheduleHandle

app = Celery("sample")
when = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


@scheduled_task(ordering_id="customer_id", uniqueness_key="kind")
@shared_task
def remind(customer_id: str, kind: str = "trial", days: int = 3) -> bool:
    return True


@scheduled_task(ordering_id="customer_id")
@app.task
def charge(customer_id: str, cents: int) -> None: ...


handle: ScheduleHandle = remind.schedule_at(when, "c-1", kind="renewal", days=7)
remind.schedule_in(60, "c-1")
key: TaskKey = remind.key_at(when, "c-1", "renewal")
ran: bool = remind("c-1")
remind.schedule_at(when, 42)  # error: incompatible type "int"; expected "str"
remind.schedule_in(60, "c-1", days="7")  # error: incompatible type "str"; expected "int"
remind.key_at(when, "c-1", knd="x")  # error: Unexpected keyword argument "knd"
remind.schedule_at("2030-01-01", "c-1")  # error: incompatible type "str"; expected "datetime"
text: str = remind("c-1")  # error: incompatible types in assignment
# a plain @app.task is typed loosely by celery-types: any arguments
charge.schedule_at(when, "c-1", "not cents")
