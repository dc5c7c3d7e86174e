"""A Celery app with scheduled tasks, for unit tests (no broker is contacted)."""

from __future__ import annotations

from celery import Celery

from celery_scheduler import constant, scheduled_task
from celery_scheduler.eta import DurableEtaTask

app = Celery("unit", broker="memory://", backend="cache+memory://", set_as_current=False)
app.conf.scheduler_grace_seconds = 5
app.conf.scheduler_max_envelope_bytes = 4096
app.conf.scheduler_api_tokens = {"read-token-0123456789": "read", "write-token-0123456789": "write"}
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


failures_left: dict[str, int] = {}  # per customer: how many more runs of `flaky` raise


@scheduled_task(ordering_id="customer_id", uniqueness_key="step", max_attempts=3, retry_backoff=2.0)
@app.task(name="unit.flaky")
def flaky(customer_id: str, step: str) -> str:
    calls.append((customer_id, step))
    if failures_left.get(customer_id, 0) > 0:
        failures_left[customer_id] -= 1
        raise RuntimeError(f"{customer_id} is not ready")
    return step


ignored_runs: list[str] = []


@scheduled_task(ordering_id="customer_id")
@app.task(name="unit.ignoring", bind=True)
def ignoring(self: object, customer_id: str) -> None:
    from celery.exceptions import Ignore

    ignored_runs.append(customer_id)
    raise Ignore()  # a worker reports nothing for it


@app.task(name="unit.eta_reminder", base=DurableEtaTask)
def eta_reminder(customer_id: str) -> str:
    calls.append((customer_id, "eta"))
    return f"reminded {customer_id}"
