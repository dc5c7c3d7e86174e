"""Tokens of scheduler_api_tokens are found by comparing every one in constant time."""

from __future__ import annotations

import hmac

import pytest

from celery_scheduler.web import tokens

TOKENS = {"read-token-aaaa": "read", "write-token-bbbb": "write", "other-read-cccc": "read"}


@pytest.mark.parametrize(("given", "scope"), [
    ("read-token-aaaa", "read"), ("write-token-bbbb", "write"), ("other-read-cccc", "read"),
    ("write-token-bbb", None), ("write-token-bbbbb", None), ("", None), (None, None),
    ("\udc80 not utf-8", None)])
def test_a_token_has_the_scope_it_was_given_and_any_other_text_none(
        given: str | None, scope: str | None) -> None:
    assert tokens.scope_of(TOKENS, given) == scope


def test_every_token_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", compare)
    for given in [*TOKENS, "nothing like a token"]:
        compared.clear()
        tokens.scope_of(TOKENS, given)
        # as many comparisons for the first token as for none, each of equal-length digests
        assert len(compared) == len(TOKENS)
        assert {len(a) for a, _ in compared} == {len(b) for _, b in compared} == {32}
