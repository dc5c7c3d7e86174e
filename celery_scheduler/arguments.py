"""Binding a schedule call's arguments to the task's parameters, as the task would take them.

A schedule call binds its arguments to the task's signature to find the ordering id and
uniqueness key and to refuse a call the task could not take. ``inspect.Signature.bind``
does that in Python and was a third of the cost of a schedule call; a function compiled
once per task with the task's own parameters lets the interpreter bind them, with the
same rules and the same ``TypeError`` for a call that does not fit.
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Binder"]

_P = inspect.Parameter


class Binder:
    """Binds calls to one signature: ``arguments(args, kwargs)``, ``call_with(f, arguments)``."""

    def __init__(self, signature: inspect.Signature, name: str = "task") -> None:
        self.signature = signature
        self._bind = _compile(signature, name if name.isidentifier() else "task")
        parameters = signature.parameters.values()
        # how the arguments are passed on: by position up to the first keyword-only one
        self._positional = [p.name for p in parameters
                            if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
        self._star = next((p.name for p in parameters if p.kind is _P.VAR_POSITIONAL), None)
        self._keyword = [p.name for p in parameters if p.kind is _P.KEYWORD_ONLY]
        self._star_star = next((p.name for p in parameters if p.kind is _P.VAR_KEYWORD), None)

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter's value (defaults applied), by name, in order; ``TypeError`` if
        the call does not fit the signature."""
        if self._bind is None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments)
        return self._bind(*args, **kwargs)

    def bound(self, arguments: dict[str, Any]) -> inspect.BoundArguments:
        """The ``inspect`` form of *arguments*: ``.args`` and ``.kwargs`` as a call takes them."""
        return inspect.BoundArguments(self.signature, arguments)

    def call_with(self, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Call *function* with the task's arguments, as the task itself would be called."""
        args = [arguments[name] for name in self._positional]
        if self._star is not None:
            args.extend(arguments[self._star])
        kwargs = {name: arguments[name] for name in self._keyword}
        if self._star_star is not None:
            kwargs.update(arguments[self._star_star])
        return function(*args, **kwargs)


def _compile(signature: inspect.Signature, function_name: str
             ) -> Callable[..., dict[str, Any]] | None:
    """A function with *signature*'s parameters that returns them by name, or None if the
    signature cannot be written as Python source (then ``inspect`` binds)."""
    if keyword.iskeyword(function_name):
        function_name = "task"
    parts: list[str] = []
    defaults: dict[str, Any] = {}
    kinds = [p.kind for p in signature.parameters.values()]
    for index, parameter in enumerate(signature.parameters.values()):
        name = parameter.name
        if (not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__binder")
                or name == function_name):
            return None
        if parameter.kind is _P.KEYWORD_ONLY and _P.VAR_POSITIONAL not in kinds and (
                index == 0 or kinds[index - 1] not in (_P.KEYWORD_ONLY,)):
            parts.append("*")
        if parameter.kind is _P.VAR_POSITIONAL:
            parts.append(f"*{name}")
        elif parameter.kind is _P.VAR_KEYWORD:
            parts.append(f"**{name}")
        elif parameter.default is _P.empty:
            parts.append(name)
        else:
            defaults[f"__binder_default_{index}"] = parameter.default
            parts.append(f"{name}=__binder_default_{index}")
        if parameter.kind is _P.POSITIONAL_ONLY and (
                index + 1 == len(kinds) or kinds[index + 1] is not _P.POSITIONAL_ONLY):
            parts.append("/")
    names = ", ".join(f"{p!r}: {p}" for p in signature.parameters)
    # named like the task, so that a call that does not fit says "remind() missing ..."
    source = f"def {function_name}({', '.join(parts)}):\n    return {{{names}}}\n"
    namespace: dict[str, Any] = dict(defaults)
    try:
        exec(compile(source, "<celery_scheduler binder>", "exec"), namespace)
    except SyntaxError:
        return None
    function: Callable[..., dict[str, Any]] = namespace[function_name]
    return function
