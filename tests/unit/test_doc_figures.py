"""Every measured figure the user-facing docs quote is in a generated report.

README.md, docs/production.md and docs/comparison.md quote what the benchmarks and the chaos
runs measured; a figure typed by hand from a run no report keeps (or left behind when the
report was generated again) fails here. A figure is a number with a unit of measure (ms, s,
%, tasks/s, MB, cores, x) in the text, not in code; it must appear in BENCHMARKS.md,
RELIABILITY.md, docs/reliability-*.md or docs/benchmarks-periodic.md. The few such numbers
that are settings or definitions rather than measurements are listed below with why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/production.md", "docs/comparison.md", "docs/periodic.md")
REPORTS = ("BENCHMARKS.md", "RELIABILITY.md", "docs/reliability-cluster.md",
           "docs/reliability-rabbitmq.md", "docs/benchmarks-periodic.md")
# doc -> {figure as written: why it is not a measurement}
NOT_MEASURED = {
    "docs/periodic.md": {
        "14 s": "how long the chaos run's slow periodic runs take (its workload)",
    },
    "README.md": {
        "150 MB": "what the Kafka and Cassandra downloads weigh",
    },
    "docs/production.md": {
        "6.5 s": "the bound test_replicated_cassandra.py holds a request to with a node stalled",
        "18 s": "the bound test_replicated_kafka.py holds a schedule call to with a broker stalled",
        "120 s": "the default of scheduler_startup_timeout",
        "256 KiB": "the default of scheduler_max_envelope_bytes",
        "9 s": "the default of Kafka's broker.session.timeout.ms",
        "0.2 s": "how often a dispatcher writes a batch of a hot ordering id's records",
    },
}

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:ms|s|%|tasks/s|MB|GB|GiB|KiB|cores?|min|x|\u00d7|seconds?|minutes?|hours?)"
FIGURE = re.compile(rf"(?<![\w.,])({_NUMBER})(?:\s*(?:-|\u2013|to)\s*({_NUMBER}))?\s?{_UNIT}(?![\w/])")


def prose(markdown: str) -> str:
    """*markdown* without its code blocks, inline code and link targets: text a reader reads
    as claims."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def figures(markdown: str) -> list[tuple[str, list[str]]]:
    """Each figure in *markdown*'s prose: (as written, its numbers: one, or a range's two)."""
    return [(match.group(0), [n for n in match.groups() if n]) for match in FIGURE.finditer(prose(markdown))]


def unsupported(markdown: str, reports: str, allowed: dict[str, str]) -> list[str]:
    """The figures of *markdown* whose numbers *reports* does not hold, less *allowed*."""
    found = []
    for written, numbers in figures(markdown):
        if written in allowed:
            continue
        missing = [n for n in numbers
                   if not re.search(rf"(?<![\d.,]){re.escape(n)}(?![\d]|[.,]\d)", reports)]
        if missing:
            found.append(written)
    return found


def _reports() -> str:
    return "\n".join((REPO / name).read_text() for name in REPORTS)


@pytest.mark.parametrize("doc", DOCS)
def test_each_figure_a_doc_quotes_is_in_a_report(doc: str) -> None:
    text = (REPO / doc).read_text()
    missing = unsupported(text, _reports(), NOT_MEASURED.get(doc, {}))
    assert not missing, (f"{doc} quotes figures no report holds: {missing}; quote the report's "
                         f"figure (scripts/bench, scripts/chaos --long), or drop it")


@pytest.mark.parametrize("doc", sorted(NOT_MEASURED))
def test_each_figure_said_not_to_be_a_measurement_is_still_quoted(doc: str) -> None:
    quoted = {written for written, _ in figures((REPO / doc).read_text())}
    assert set(NOT_MEASURED[doc]) <= quoted, set(NOT_MEASURED[doc]) - quoted


def test_a_figure_typed_by_hand_or_left_behind_is_found() -> None:
    reports = "| drain rate | 1,036 tasks/s (656 to 1,125, n=3) |\n| p99 | 5.4 ms (4.5 to 6.3, n=2) |"
    doc = ("It drained 1,036 tasks/s (656-1,125 tasks/s over the runs) with a p99 of 5.4 ms; "
           "an older run drained 2,311 tasks/s, and 5.43 ms is not 5.4 ms. `9,999 ms` is code.\n"
           "```\n7,777 ms\n```\n")
    assert unsupported(doc, reports, {}) == ["2,311 tasks/s", "5.43 ms"]
    assert unsupported(doc, reports, {"2,311 tasks/s": "a definition", "5.43 ms": "a default"}) == []
    assert figures("a 10-20 s wait, 3 cores, 2.5x, a version 1.2.3, 40% and 12 s.") == [
        ("10-20 s", ["10", "20"]), ("3 cores", ["3"]), ("2.5x", ["2.5"]), ("40%", ["40"]),
        ("12 s", ["12"])]
