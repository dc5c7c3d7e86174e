"""A small JSON API: create a reminder, and see it with its scheduler status."""

import datetime as dt
import json
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from reminders.models import Reminder
from reminders.tasks import send_reminder


def _in_whole_ms(when: dt.datetime) -> dt.datetime:
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


def _schedule(reminder: Reminder) -> None:
    key = reminder.task_key()
    handle = send_reminder.schedule_at(key.scheduled_at, reminder.pk, reminder.user)
    assert handle.key == key  # the model and the task agree on the key


@csrf_exempt  # an example API without sessions; a real one authenticates its callers
@require_POST
def create_reminder(request: HttpRequest) -> JsonResponse | HttpResponseBadRequest:
    """``POST {"user": ..., "text": ..., "in_seconds": 3600}`` creates and schedules a reminder."""
    try:
        body = json.loads(request.body)
        user, text, delay = str(body["user"]), str(body["text"]), float(body["in_seconds"])
    except (ValueError, KeyError, TypeError) as exc:
        return HttpResponseBadRequest(f"expected JSON with user, text and in_seconds: {exc}")
    with transaction.atomic():
        reminder = Reminder.objects.create(
            user=user, text=text, remind_at=_in_whole_ms(timezone.now() + dt.timedelta(seconds=delay)))
        # Schedule only once the row is committed: a rolled-back reminder is never sent, and
        # the worker never runs before it can read the row.
        transaction.on_commit(lambda: _schedule(reminder))
    return JsonResponse(_describe(reminder), status=201)


@require_GET
def reminder_status(request: HttpRequest, reminder_id: int) -> JsonResponse:
    """The reminder, with its task's state in the scheduler."""
    reminder = get_object_or_404(Reminder, pk=reminder_id)
    status = send_reminder.status(reminder.task_key())
    return JsonResponse({**_describe(reminder),
                         # unknown until a dispatcher has stored the task
                         "status": status.state.value if status else "unknown",
                         "attempts": status.attempts if status else 0})


def _describe(reminder: Reminder) -> dict[str, Any]:
    def iso(when: dt.datetime | None) -> str | None:
        return when.isoformat() if when else None

    return {"id": reminder.pk, "user": reminder.user, "text": reminder.text,
            "remind_at": iso(reminder.remind_at), "sent_at": iso(reminder.sent_at),
            "cancelled_at": iso(reminder.cancelled_at), "task_id": reminder.task_key().task_id}
