from __future__ import annotations

import pytest

from celery_scheduler.config import Settings
from celery_scheduler.errors import ConfigurationError
from celery_scheduler.signing import Signer

OLD, NEW = "old-secret-0123456789", "new-secret-0123456789"


def test_signed_records_verify_and_tampering_is_caught() -> None:
    signer = Signer({"k1": OLD}, "k1")
    signature = signer.sign(b"customer-42", b"value")
    assert signer.problem(b"customer-42", b"value", signature) is None
    assert "does not match" in signer.problem(b"customer-42", b"other value", signature)
    assert "does not match" in signer.problem(b"customer-43", b"value", signature)  # replayed key
    assert "not signed" in signer.problem(b"customer-42", b"value", None)
    assert "malformed" in signer.problem(b"customer-42", b"value", b"nocolon")
    assert "unknown key 'k9'" in signer.problem(b"customer-42", b"value", b"k9:abcd")


def test_rotation_accepts_old_signatures_while_signing_with_the_new_key() -> None:
    before = Signer({"k1": OLD}, "k1").sign(b"k", b"v")
    during = Signer({"k1": OLD, "k2": NEW}, "k2")
    assert during.problem(b"k", b"v", before) is None
    assert during.sign(b"k", b"v").startswith(b"k2:")
    after = Signer({"k2": NEW}, "k2")
    assert "unknown key 'k1'" in after.problem(b"k", b"v", before)


@pytest.mark.parametrize(("keys", "active", "message"), [
    ({"k1": OLD}, None, "must name one of"),
    ({"k1": OLD}, "k2", "must name one of"),
    ({"k1": "short"}, "k1", "at least 16"),
    ({"a:b": OLD}, "a:b", "may not contain"),
])
def test_bad_signing_settings(keys: dict[str, str], active: str | None, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_mapping({"scheduler_signing_keys": keys, "scheduler_signing_key_id": active})


def test_signing_secrets_stay_out_of_the_repr() -> None:
    settings = Settings.from_mapping({"scheduler_signing_keys": {"k1": OLD},
                                      "scheduler_signing_key_id": "k1"})
    assert OLD not in repr(settings)
