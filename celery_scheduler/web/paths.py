"""Key parts in URL paths, reversibly: every ordering id and uniqueness key the package accepts
has a path segment that routes back to it.

A part goes into a path percent-encoded whole, ``/`` included (``quote(part, safe="")``), so
``tenant/7`` is the one segment ``tenant%2F7``. Two things stand in the way, and this module
deals with both:

- ASGI servers decode the path before routing, which makes an encoded ``/`` a segment boundary.
  :class:`KeepSlashes` decodes the path again, segment by segment from ``raw_path``, with each
  ``/`` inside a segment held as NUL until the route's parameter is read back with :func:`part`.
  No key part may hold a NUL, so a path that asks for one is answered 422 before routing.
- Browsers and HTTP clients drop ``.`` and ``..`` segments, however they are encoded, before a
  request is sent. A part made of one or two dots, after any number of ``~``, is therefore sent
  with one more ``~`` in front: ``..`` as ``~..``, ``~.`` as ``~~.``. Every other part is sent as
  it is.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import quote, unquote

from pydantic import AfterValidator
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["KeepSlashes", "KeyPart", "part", "segment", "segments"]

_SLASH = "\x00"  # check_key_part refuses NUL, and KeepSlashes a path holding one
_DOTS = re.compile(r"~*\.\.?")


def segment(key_part: str) -> str:
    """The URL path segment of an ordering id or uniqueness key.

    >>> segment("tenant/7"), segment(".."), segment("a b")
    ('tenant%2F7', '~..', 'a%20b')
    """
    if _DOTS.fullmatch(key_part):
        key_part = "~" + key_part
    return quote(key_part, safe="")


def segments(*key_parts: str) -> str:
    """Path segments of key parts (or of a scheduled time), joined by ``/``."""
    return "/".join(segment(p) for p in key_parts)


def part(routed: str) -> str:
    """The key part a routed path parameter stands for: the inverse of :func:`segment`.

    >>> part("tenant\\x00" "7"), part("~.."), part("~x")
    ('tenant/7', '..', '~x')
    """
    text = routed.replace(_SLASH, "/")
    if text.startswith("~") and _DOTS.fullmatch(text):
        return text[1:]
    return text


KeyPart = Annotated[str, AfterValidator(part)]
"""A path parameter holding an ordering id or a uniqueness key."""


def _routed_path(scope: Scope) -> str | None:
    """The path to route on, decoded segment by segment with a ``/`` inside a segment held as
    NUL; None when the path asks for a NUL.

    The server's own decoding is used when nothing in the path is encoded. (Starlette's test
    client decodes the path twice, so a key part with ``%`` in it is found through it only
    because of this.)
    """
    path: str = scope["path"]
    raw: bytes = scope.get("raw_path") or b""
    if b"%" not in raw:
        return None if _SLASH in path else path
    pieces = [unquote(piece) for piece in raw.decode("latin-1").split("/")]
    if any(_SLASH in piece for piece in pieces):
        return None
    return "/".join(piece.replace("/", _SLASH) for piece in pieces)


class KeepSlashes:
    """ASGI middleware: an encoded ``/`` (``%2F``) inside a path segment stays in that segment."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            routed = _routed_path(scope)
            if routed is None:
                refused = JSONResponse({"error": "InvalidKeyError", "message": (
                    f"the path {scope['path']!r} holds a NUL character, which no ordering id or "
                    "uniqueness key may hold; encode each key part with quote(part, safe='')")},
                    status_code=422)
                await refused(scope, receive, send)
                return
            if routed is not scope["path"]:
                scope = {**scope, "path": routed}
        await self.app(scope, receive, send)
