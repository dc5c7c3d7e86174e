"""The scope of a token of ``scheduler_api_tokens``, found without a timing side channel.

A dict lookup or ``==`` returns as soon as a character differs, so the time a refused
guess takes says how much of it was right. Here every configured token is compared with
:func:`hmac.compare_digest`, on SHA-256 digests so that their lengths do not show either,
and the comparison goes on after a match.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["scope_of"]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def scope_of(tokens: Mapping[str, str], given: str | None) -> str | None:
    """The scope (``read`` or ``write``) *tokens* give to *given*, or None."""
    if given is None:
        return None
    probe = _digest(given)
    found = None
    for token, scope in tokens.items():
        if hmac.compare_digest(_digest(token), probe):
            found = scope
    return found
