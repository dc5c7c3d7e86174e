"""Released tasks' Redis documents built from one template per task name and options.

Releases of one task with the same schedule-call options differ in a handful of fields
only: the task id (also the root id and correlation id), the arguments and their reprs, and
the ``celery_scheduler`` header. Celery's options handling, its router, the task's default
options and the document's static fields give the same result for each of them. The first
such release pushed on a connection is built the full way (``release.task_message`` and
``RedisPush.prepare``); its document, taken before the publish signals could stamp it, is the
template, and the next ones copy it and fill in their own fields: two fifths of a release's
publish CPU at 100 releases a step, 79 to 48 us (``python -m benchmarks.publish_cost``).

Only the plain case has a template; the rest is built the full way, as before:

- schedule-call options of hashable values only, without ``headers``, ``expires``, ``eta``
  or ``countdown`` (the headers are merged per message, the times are taken when sent);
- a message sent at its due time (no ``eta``), without a ``task-sent`` event;
- only static routes (``task_routes`` maps by task name): a router function may route on
  the arguments;
- the first ``MAX_TEMPLATES`` task names and options of a connection.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from celery.app.routes import MapRoute

from celery_scheduler.release.redis_push import Document, encoded_body
from celery_scheduler.wire import HEADER

__all__ = ["MAX_TEMPLATES", "Template", "Templates", "static_routes"]

# Schedule-call options taken per message: a release with any of them has no template.
_PER_MESSAGE = frozenset(("headers", "expires", "eta", "countdown"))
# Most templates kept for one connection: options that differ from call to call (a shadow
# name per task, say) would otherwise make one for every release, and keep them all.
MAX_TEMPLATES = 1000


@dataclass(frozen=True)
class Template:
    """A release's document (from ``RedisPush.prepare``) whose per-message fields are refilled."""

    name: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    embed: dict[str, Any]
    routing_key: str
    options: dict[str, Any]
    delivery_mode: int

    @classmethod
    def of(cls, document: Document) -> Template | None:
        """*document*'s template (copied: the publish signals may change the document), or
        None if it holds a time taken when it was built."""
        headers = document.headers
        if headers.get("eta") is not None or headers.get("expires") is not None:
            return None
        if "expiration" in document.options:
            return None
        return cls(document.name, _copied(headers), dict(document.properties),
                   dict(document.body[2]), document.routing_key, dict(document.options),
                   document.delivery_mode)

    def document(self, task_id: str, args: list[Any], kwargs: dict[str, Any], argsrepr: str,
                 kwargsrepr: str, header: str) -> Document:
        """The document of the release of *task_id* with these arguments and release header."""
        headers = _copied(self.headers)
        headers["id"] = headers["root_id"] = task_id
        headers["argsrepr"], headers["kwargsrepr"] = argsrepr, kwargsrepr
        headers[HEADER] = header
        properties = dict(self.properties)
        properties["correlation_id"] = task_id
        properties["argsrepr"], properties["kwargsrepr"] = argsrepr, kwargsrepr
        body = (args, kwargs, dict(self.embed))
        return Document(self.name, headers, properties, body, encoded_body(body),
                        self.routing_key, self.options, self.delivery_mode)


def _copied(headers: dict[str, Any]) -> dict[str, Any]:
    # the containers Celery puts in a message's headers (time limits, stamps): a publish
    # signal's receiver that changes one in place changes this message only
    copy = dict(headers)
    for name in ("timelimit", "stamps", "stamped_headers"):
        value = copy.get(name)
        if value is not None:
            copy[name] = value.copy()
    return copy


class Templates:
    """The templates made on one connection, by task name and schedule-call options."""

    def __init__(self) -> None:
        self._made: dict[Hashable, Template] = {}

    @staticmethod
    def key(name: str, options: dict[str, Any]) -> Hashable | None:
        """What releases sharing a template share; None if *options* rule one out."""
        if not options:
            return name
        if not _PER_MESSAGE.isdisjoint(options):
            return None
        try:
            return (name, frozenset(options.items()))
        except TypeError:  # a list or dict among the options
            return None

    def get(self, name: str, options: dict[str, Any]) -> Template | None:
        """The template of *name*'s releases with these schedule-call *options*, if made."""
        key = self.key(name, options)
        return None if key is None else self._made.get(key)

    def learn(self, name: str, options: dict[str, Any], document: Document) -> None:
        """Make *document* (of a release of *name* with *options*) their template, if it can be."""
        key = self.key(name, options)
        if key is not None and key not in self._made and len(self._made) < MAX_TEMPLATES:
            template = Template.of(document)
            if template is not None:
                self._made[key] = template


def static_routes(app: Any) -> bool:
    """Whether *app* routes tasks by name alone (no router functions)."""
    return all(isinstance(route, MapRoute) for route in app.amqp.router.routes)
