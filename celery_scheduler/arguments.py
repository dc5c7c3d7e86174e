"""A schedule call's arguments: bound to the task's parameters, as the task would take them,
and encoded as JSON values, as Celery's JSON serializer would carry them.

A schedule call binds its arguments to the task's signature to find the ordering id and
uniqueness key and to refuse a call the task could not take. ``inspect.Signature.bind``
does that in Python and was a third of the cost of a schedule call; a function compiled
once per task with the task's own parameters lets the interpreter bind them, with the
same rules and the same ``TypeError`` for a call that does not fit.
"""

from __future__ import annotations

import inspect
import json
import keyword
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kombu.utils.json import dumps as _kombu_dumps

from celery_scheduler.errors import NotSerializableError

__all__ = ["Binder", "KeySource", "encode_arguments", "kombu_dumps", "plain_kwargs_size",
           "plain_size"]

_P = inspect.Parameter

# Where a key comes from: ("name", parameter), ("value", constant) or ("call", function).
KeySource = tuple[str, Any]


class Binder:
    """Binds calls to one signature: ``arguments(args, kwargs)``, ``call_with(f, arguments)``."""

    def __init__(self, signature: inspect.Signature, name: str = "task") -> None:
        self.signature = signature
        self._name = name if name.isidentifier() else "task"
        self._bind = _compile(signature, self._name)
        parameters = signature.parameters.values()
        # how the arguments are passed on: by position up to the first keyword-only one
        self._positional = [p.name for p in parameters
                            if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
        self._star = next((p.name for p in parameters if p.kind is _P.VAR_POSITIONAL), None)
        self._keyword = [p.name for p in parameters if p.kind is _P.KEYWORD_ONLY]
        self._star_star = next((p.name for p in parameters if p.kind is _P.VAR_KEYWORD), None)
        # the values of a signature of two or more positional parameters and nothing else, in
        # one call
        self._only_positional = (
            operator.itemgetter(*self._positional) if len(self._positional) > 1
            and self._star is None and not self._keyword and self._star_star is None else None)

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter's value (defaults applied), by name, in order; ``TypeError`` if
        the call does not fit the signature."""
        if self._bind is None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments)
        arguments: dict[str, Any] = self._bind(*args, **kwargs)
        return arguments

    def bound(self, arguments: dict[str, Any]) -> inspect.BoundArguments:
        """The ``inspect`` form of *arguments*: ``.args`` and ``.kwargs`` as a call takes them."""
        return inspect.BoundArguments(self.signature, arguments)

    def compile_keys(self, ordering: KeySource, unique: KeySource
                     ) -> Callable[..., tuple[Any, Any]] | None:
        """A function taking a call's arguments as the task does, returning its ordering id
        and uniqueness key without building the arguments by name; None if the signature
        cannot be compiled. Each source is ``("name", parameter)``, ``("value", constant)``
        or ``("call", function)`` (called with the task's arguments); a function that
        raises, or a call that does not fit, raises as it would."""
        if self._bind is None:
            return None
        call = ", ".join([*self._positional, *([f"*{self._star}"] if self._star else []),
                          *(f"{name}={name}" for name in self._keyword),
                          *([f"**{self._star_star}"] if self._star_star else [])])
        names: dict[str, Any] = {}
        expressions = []
        for index, (kind, source) in enumerate((ordering, unique)):
            if kind == "name":
                if source not in self.signature.parameters:
                    return None
                expressions.append(source)
            else:
                names[f"__binder_key_{index}"] = source
                expressions.append(f"__binder_key_{index}" + (f"({call})" if kind == "call" else ""))
        return _compile(self.signature, self._name, f"return {expressions[0]}, {expressions[1]}",
                        names)

    def call_with(self, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Call *function* with the task's arguments, as the task itself would be called."""
        positional = self._only_positional
        if positional is not None:  # the usual signature: named parameters, by position
            return function(*positional(arguments))
        args = [arguments[name] for name in self._positional]
        if self._star is not None:
            args.extend(arguments[self._star])
        kwargs = {name: arguments[name] for name in self._keyword}
        if self._star_star is not None:
            kwargs.update(arguments[self._star_star])
        return function(*args, **kwargs)


def _compile(signature: inspect.Signature, function_name: str, body: str | None = None,
             names: Mapping[str, Any] | None = None) -> Callable[..., Any] | None:
    """A function with *signature*'s parameters whose body is *body* (by default: return
    them by name), or None if the signature cannot be written as Python source (then
    ``inspect`` binds). *names* are globals the body uses; each starts with ``__binder``.
    """
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
    if body is None:
        body = "return {" + ", ".join(f"{p!r}: {p}" for p in signature.parameters) + "}"
    # named like the task, so that a call that does not fit says "remind() missing ..."
    source = f"def {function_name}({', '.join(parts)}):\n    {body}\n"
    namespace: dict[str, Any] = {**defaults, **(names or {})}
    try:
        exec(compile(source, "<celery_scheduler binder>", "exec"), namespace)
    except SyntaxError:
        return None
    function: Callable[..., Any] = namespace[function_name]
    return function


def kombu_dumps(value: Any, **options: Any) -> str:
    """kombu's JSON encoding (typed wrapper)."""
    text: str = _kombu_dumps(value, **options)
    return text


def encode_arguments(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Return *args* and *kwargs* as plain JSON values, or raise NotSerializableError.

    Values kombu's JSON knows (datetime, date, time, UUID, Decimal, bytes) become its tagged
    objects, which Celery's JSON serializer turns back into those types in the worker.
    """
    if type(kwargs) is not dict:
        if not isinstance(kwargs, Mapping):
            raise NotSerializableError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
        kwargs = dict(kwargs)
    if type(args) is not list and type(args) is not tuple:
        args = list(args)  # read once: it may be an iterator
    try:
        # Most calls pass plain JSON values: copying them is several times cheaper than the
        # round trip through kombu's encoder, and gives the same result. Scalars, the usual
        # argument, are taken as they are without a call each.
        listed = [value if type(value) in _SCALARS else _plain_copy(value) for value in args]
        if not kwargs:
            return listed, {}
        copied: dict[str, Any] = {}
        for name, value in kwargs.items():
            if type(name) is not str:
                raise _NotPlain
            copied[name] = value if type(value) in _SCALARS else _plain_copy(value)
        return listed, copied
    except (_NotPlain, RecursionError):
        pass
    for name in kwargs:
        if not isinstance(name, str):
            raise NotSerializableError(f"keyword argument names must be strings, got {name!r}")
    listed = list(args)
    try:
        text = kombu_dumps([listed, dict(kwargs)], allow_nan=False)
    except RecursionError:
        raise NotSerializableError(
            "the arguments are nested too deeply to encode as JSON; pass a flatter value or a "
            "reference such as a row id") from None
    except (TypeError, ValueError) as exc:
        where = _find_unserializable({"args": listed, "kwargs": dict(kwargs)}, "", set())
        raise NotSerializableError(
            f"{where} cannot be encoded as JSON ({exc}); pass JSON types (str, int, float, "
            "bool, None, list, dict with string keys) or datetime/UUID/Decimal/bytes, "
            "for example an id instead of an object"
        ) from exc
    encoded_args, encoded_kwargs = json.loads(text)
    return encoded_args, encoded_kwargs


# The integers orjson writes (others go through the standard library's encoder).
_ORJSON_INT_MIN, _ORJSON_INT_MAX = -(2**63), 2**64 - 1
# The most bytes JSON takes for one character of a string: an escape such as \u001f.
MAX_CHAR_BYTES = 6


def plain_size(values: Sequence[Any]) -> int:
    """An upper bound of the bytes of *values* written as a JSON list, if each is a JSON
    scalar that ``orjson`` writes as it is (a string that UTF-8 can carry, a 64-bit integer,
    a finite float, a bool, None); otherwise -1."""
    size = 1 + len(values) if values else 2  # brackets and commas
    for value in values:
        kind = type(value)
        if kind is str:
            if not value.isascii() and not _utf8(value):
                return -1
            size += MAX_CHAR_BYTES * len(value) + 2
        elif kind is int:
            if not _ORJSON_INT_MIN <= value <= _ORJSON_INT_MAX:
                return -1
            size += 20
        elif kind is float:
            if value - value != 0:  # inf, nan
                return -1
            size += 24  # the longest shortest repr, such as -2.2250738585072014e-308
        elif kind is bool or value is None:
            size += 5
        else:
            return -1
    return size


def plain_kwargs_size(kwargs: dict[str, Any]) -> int:
    """:func:`plain_size` for keyword arguments written as a JSON object (string names)."""
    if not kwargs:
        return 2
    size = 1 + len(kwargs)  # braces and commas
    for name in kwargs:
        if type(name) is not str or (not name.isascii() and not _utf8(name)):
            return -1
        size += MAX_CHAR_BYTES * len(name) + 3  # quotes and colon
    values = plain_size(list(kwargs.values()))
    return -1 if values < 0 else size + values - 1 - len(kwargs)  # its brackets and commas


def _utf8(text: str) -> bool:
    """Whether *text* can be written as UTF-8 (it has no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _NotPlain(Exception):
    """A value that kombu's JSON encoder has to convert (or refuse)."""


_SCALARS = frozenset({str, int, bool, type(None)})


def _plain_copy(value: Any) -> Any:
    """Copy *value* if it is made of JSON types only (exactly), else raise _NotPlain."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _NotPlain
        return value
    if kind is list:
        return [_plain_copy(item) for item in value]
    if kind is dict:
        copied: dict[str, Any] = {}
        for name, item in value.items():
            if type(name) is not str:
                raise _NotPlain
            copied[name] = _plain_copy(item)
        return copied
    raise _NotPlain


def _find_unserializable(value: Any, path: str, seen: set[int]) -> str:
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in seen:
            return f"{path or 'value'} contains itself"
        seen = seen | {id(value)}
    if isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                return f"{path or 'value'} has a non-string key {name!r}"
            found = _find_unserializable(item, f"{path}[{name!r}]" if path else name, seen)
            if found:
                return found
        return ""
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _find_unserializable(item, f"{path}[{index}]", seen)
            if found:
                return found
        return ""
    try:
        kombu_dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return f"{path} = {value!r:.200} ({type(value).__name__})"
    return ""
