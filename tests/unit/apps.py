"""A Celery app with scheduled tasks, for unit tests (no broker is contacted)."""

from __future__ import annotations

from celery import Celery

from celery_scheduler import constant, scheduled_task

app = Celery("unit", broker="memory://", backend="cache+memory://", set_as_current=False)
app.conf.scheduler_grace_seconds = 5
app.conf.scheduler_max_envelope_bytes = 4096
calls: list[tuple[str, str]] = []


@scheduled_task(ordering_id="customer_id", uniqueness_key="kind")
@app.task(name="unit.remind")
def remind(customer_id: str, kind: str = "default") -> str:
    calls.append((customer_id, kind))
    return f"{customer_id}:{kind}"


@scheduled_task(ordering_id=lambda account, amount: f"account-{account}")
@app.task(name="unit.charge", bind=True)
def charge(self, account: int, amount: int) -> int:
    return amount


@scheduled_task(ordering_id=constant("global"))
@app.task(name="unit.rollup")
def rollup() -> None:
    pass


@app.task(name="unit.plain")
def plain() -> None:
    pass


@scheduled_task(ordering_id="customer_id")
@app.task(name="unit.note")
def note(customer_id: str, text: str) -> None:
    pass
