"""``@scheduled_task`` keeps the task's signature for a type checker: ``schedule_at``,
``schedule_in``, ``key_at`` and the call itself are held to it (with celery-types)."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

SAMPLE = Path(__file__).parent / "typing_sample" / "scheduled_calls.py"


def expected_errors(source: str) -> dict[int, str]:
    return {number: match.group(1) for number, line in enumerate(source.splitlines(), 1)
            if (match := re.search(r"# error: (.+)$", line))}


def test_the_decorated_task_is_typed_by_its_signature() -> None:
    out, err, _ = api.run(["--strict", "--no-incremental", "--show-error-codes",
                         "--no-error-summary", str(SAMPLE)])
    found: dict[int, list[str]] = {}
    for line in out.splitlines():
        match = re.match(rf".*{re.escape(SAMPLE.name)}:(\d+): error: (.+)", line)
        if match:
            found.setdefault(int(match.group(1)), []).append(match.group(2))
    expected = expected_errors(SAMPLE.read_text())
    assert expected, "the sample says which lines must fail"
    unexpected = {n: m for n, m in found.items() if n not in expected}
    assert not unexpected, f"errors on lines that must pass: {unexpected}\n{err}"
    missed = {n: text for n, text in expected.items()
              if not any(text.lower() in message.lower() for message in found.get(n, []))}
    assert not missed, f"lines that must fail but did not: {missed}\nmypy said:\n{out}{err}"
