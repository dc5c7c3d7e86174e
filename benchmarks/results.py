"""The measured results behind BENCHMARKS.md: one JSON file a scenario group, with the run it
came from, so that one group run again alone can replace its own sections and the report be
rendered anew from all of them (``python -m benchmarks --only 5 --update``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.report import Report, Row, Section
from benchmarks.stats import Figure

__all__ = ["RESULTS", "code_version", "load", "save"]

RESULTS = Path(__file__).resolve().parent / "results"
# Files a run itself rewrites: they do not make the code it ran on "changed".
GENERATED = ("BENCHMARKS.md", "benchmarks/results/")


def code_version(repo: Path) -> str:
    """The commit the harness runs on, ``+ changes`` if the work tree differs from it."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [line for line in status if not line[3:].startswith(GENERATED)]
    return f"{commit} + changes" if changed else commit


def _encoded(report: Report, group: str, sections: list[Section]) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    data["probes"] = {group: report.probes[group]}
    data["sections"] = [dataclasses.asdict(section) for section in sections]
    return data


def _decoded(data: dict[str, Any]) -> Report:
    sections = []
    for section in data.pop("sections"):
        rows = [Row(row["what"], Figure(tuple(row["figure"]["values"]), row["figure"]["unit"],
                                        row["figure"]["digits"]),
                    row["target"], row["met"], row["note"]) for row in section.pop("rows")]
        sections.append(Section(rows=rows, **section))
    return Report(sections=sections, **data)


def save(report: Report, groups: dict[str, list[Section]], directory: Path = RESULTS) -> None:
    """Write each group's sections, with *report*'s run, to ``<directory>/<group>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    for group, sections in groups.items():
        text = json.dumps(_encoded(report, group, sections), indent=1, ensure_ascii=False,
                          allow_nan=True)
        (directory / f"{group}.json").write_text(text + "\n")


def load(directory: Path = RESULTS) -> list[Report]:
    """Every group's result, one report each (its ``probes`` name the group)."""
    return [_decoded(json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]
