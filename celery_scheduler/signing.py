"""Optional HMAC signing of task-log records, with key rotation.

With ``scheduler_signing_keys = {"2026-11": "...", "2026-05": "..."}`` and
``scheduler_signing_key_id = "2026-11"``, producers sign every record with the named key and
dispatchers accept a record only if it carries a valid signature by any configured key;
unsigned and forged records are dead-lettered. To rotate: add the new key everywhere (with
the old one still listed), switch ``scheduler_signing_key_id`` to it, then remove the old
key once no record signed with it remains in the topic.

The signature is HMAC-SHA256 over the record key and value, so a signed envelope cannot be
replayed under another ordering id. It travels in the ``celery-scheduler-signature`` header
as ``<key id>:<hex digest>``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from celery_scheduler.errors import ConfigurationError

__all__ = ["HEADER", "Signer"]

HEADER = "celery-scheduler-signature"


class Signer:
    """Signs with the active key, verifies against all keys."""

    def __init__(self, keys: Mapping[str, str], active: str | None) -> None:
        if not keys:
            raise ConfigurationError("scheduler_signing_keys is empty")
        if active is None or active not in keys:
            raise ConfigurationError(
                f"scheduler_signing_key_id must name one of scheduler_signing_keys "
                f"({', '.join(sorted(keys))}), got {active!r}")
        for key_id, secret in keys.items():
            if ":" in key_id or not key_id or not isinstance(secret, str) or len(secret) < 16:
                raise ConfigurationError(
                    f"signing key {key_id!r}: ids may not contain ':' and secrets need at "
                    "least 16 characters")
        self._keys = {key_id: secret.encode("utf-8") for key_id, secret in keys.items()}
        self._active = active

    def _digest(self, key_id: str, key: bytes, value: bytes) -> str:
        mac = hmac.new(self._keys[key_id], digestmod=hashlib.sha256)
        mac.update(len(key).to_bytes(4, "big"))
        mac.update(key)
        mac.update(value)
        return mac.hexdigest()

    def sign(self, key: bytes, value: bytes) -> bytes:
        """The header value for a record with *key* and *value*."""
        return f"{self._active}:{self._digest(self._active, key, value)}".encode("ascii")

    def problem(self, key: bytes | None, value: bytes, signature: bytes | None) -> str | None:
        """Why the record is not validly signed, or None if it is."""
        if signature is None:
            return "record is not signed, and signing is required"
        try:
            key_id, digest = signature.decode("ascii").split(":", 1)
        except (UnicodeDecodeError, ValueError):
            return "record signature is malformed"
        if key_id not in self._keys:
            return f"record is signed with unknown key {key_id!r}"
        if not hmac.compare_digest(digest, self._digest(key_id, key or b"", value)):
            return f"record signature does not match (key {key_id!r})"
        return None
