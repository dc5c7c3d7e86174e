"""How ``@scheduled_task`` finds a call's ordering id and uniqueness key in its arguments:
a parameter name, a callable of the task's arguments, or a :class:`constant`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_scheduler.arguments import Binder, KeySource
from celery_scheduler.errors import (
    InvalidKeyError,
)
from celery_scheduler.keys import key_text

__all__ = ["KeySpec", "constant", "resolver", "source"]


@dataclass(frozen=True)
class constant:
    """A fixed ordering id or uniqueness key: ``@scheduled_task(ordering_id=constant("billing"))``."""

    value: str


# A key spec: a parameter name, a callable of the task's arguments, or a constant(...).
KeySpec = str | Callable[..., Any] | constant


def resolver(spec: KeySpec | None, what: str, binder: Binder, task: str
              ) -> Callable[[dict[str, Any]], Any] | None:
    """How to find *what* in a call's arguments (by name, with defaults applied)."""
    if spec is None:
        return None
    if isinstance(spec, constant):
        value = key_text(spec.value, what)
        return lambda arguments: value
    if isinstance(spec, str):
        parameters = list(binder.signature.parameters)
        if spec not in parameters:
            raise InvalidKeyError(
                f"{what} {spec!r} of task {task} is not one of its parameters "
                f"{parameters}; name a parameter, pass a callable of the task's "
                f"arguments, or use constant({spec!r}) for a fixed value"
            )
        return lambda arguments: arguments.get(spec)
    if callable(spec):
        def call(arguments: dict[str, Any]) -> Any:
            try:
                return binder.call_with(spec, arguments)
            except Exception as exc:
                raise InvalidKeyError(
                    f"the {what} callable {getattr(spec, '__name__', spec)!r} of task {task} "
                    f"raised {type(exc).__name__}: {exc}"
                ) from exc
        return call
    raise InvalidKeyError(
        f"{what} of task {task} must be a parameter name, a callable or constant(...), "
        f"got {spec!r}"
    )


def source(spec: KeySpec) -> KeySource:
    """A key spec that :func:`resolver` accepted, as the binder compiles it."""
    if isinstance(spec, constant):
        return ("value", spec.value)
    if isinstance(spec, str):
        return ("name", spec)
    return ("call", spec)
