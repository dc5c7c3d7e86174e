"""The benchmark harness's pure parts: summaries of runs and the report they produce."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.report import Report, Section, render, verdict
from benchmarks.sizing import derive as sizing_derive
from benchmarks.sizing import derived as sizing_derived
from benchmarks.stats import Figure, percentile, ratio


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7
    assert math.isnan(percentile([], 50))


def test_ratio_of_nothing_is_not_a_number() -> None:
    assert ratio(1, 4) == 0.25
    assert math.isnan(ratio(1, 0))
    assert math.isnan(ratio(math.nan, 2))


def test_figure_shows_median_and_range_of_runs() -> None:
    figure = Figure.of([1200, 1000, 1500], "/s")
    assert figure.median == 1200
    assert str(figure) == "1,200 /s (1,000 to 1,500, n=3)"
    assert str(Figure.of([0.5234], "%", 1)) == "52.3% (n=1)"
    assert str(Figure.of([2.0, math.nan], "ms", 1)) == "2.0 ms (2.0 to 2.0, n=2)"
    assert str(Figure.of([math.nan], "s")) == "n/a (n=1)"  # no unit after n/a


def test_verdict_never_claims_an_unmeasured_target() -> None:
    assert verdict(None, Figure.of([1])) == ""
    assert verdict(None, Figure.of([1]), "invalid: load not published") == "invalid: load not published"
    assert verdict(True, Figure.of([1])) == "**met**"
    assert verdict(False, Figure.of([1])) == "**not met**"
    assert verdict(True, Figure.of([math.nan])) == "not measured"


def test_report_lists_targets_first_then_each_scenario() -> None:
    report = Report(command="scripts/bench --quick", mode="quick", started="2030-01-01 00:00 UTC",
                    machine={"CPU": "test cpu, 2 logical cores"}, load_start="1.00 / 1.00 / 1.00",
                    load_end="2.00 / 2.00 / 2.00", duration_s=90)
    one = Section("1", "Schedule rate")
    one.add("ours", Figure.of([100, 110], "/s"))
    one.add("ratio | to raw", Figure.of([0.4, 0.6], "%"), "≥ 50%", False)
    one.method = ["how it was measured"]
    report.sections += [one, Section("2", "Ingest", error="RuntimeError: boom")]
    text = render(report)
    assert "`scripts/bench --quick` (quick mode)" in text
    assert "took 1.5 min" in text
    report.duration_s = math.nan  # a run stopped before its end: its length is not known
    assert "took n/a (stopped before its end)" in render(report) and "nan" not in render(report)
    assert "1.00 / 1.00 / 1.00 at start, 2.00 / 2.00 / 2.00 at end" in text
    targets = text.index("## Targets")
    assert text.index("| 1 | ratio \\| to raw | 50% (40 to 60, n=2) | ≥ 50% | **not met** |") > targets
    assert text.index("## 1. Schedule rate") > targets
    assert "- how it was measured" in text
    assert "**Did not complete:** RuntimeError: boom" in text


def test_a_qualified_verdict_says_what_it_was_measured_at() -> None:
    assert verdict(True, Figure.of([70]), "at 100,000 pending") == "**met** (at 100,000 pending)"


def test_report_shows_the_speed_probe_of_each_scenario() -> None:
    report = Report(command="scripts/bench", mode="full", started="2030-01-01 00:00 UTC",
                    machine={}, load_start="0.00 / 0.00 / 0.00")
    assert "speed probe" not in render(report)  # none taken: no line
    report.probes = {"1": 14.25, "3b": 19.04}
    line = next(line for line in render(report).splitlines() if "speed probe" in line)
    assert line.endswith("1: 14.2, 3b: 19.0")


def test_speed_probe_is_the_cpu_time_of_its_workload() -> None:
    import time

    from benchmarks import machine

    probe = machine.speed_probe()
    began = time.thread_time_ns()
    machine._probe_workload()
    once = (time.thread_time_ns() - began) / 1e6
    assert 0 < probe <= once * 1.5  # the fastest of several tries, in milliseconds


def test_the_report_says_each_systems_durability_and_a_service_not_read_is_said_so() -> None:
    from benchmarks.durability import _asked

    def down() -> str:
        raise ConnectionRefusedError("nothing listens")

    durability = {"PostgreSQL (procrastinate)": "fsync on, synchronous_commit on",
                  "Redis (Celery broker, RQ)": _asked("Redis", down)}
    report = Report(command="scripts/bench", mode="full", started="now", machine={},
                    load_start="0", durability=durability)
    text = render(report)
    assert "## Durability" in text
    assert "| PostgreSQL (procrastinate) | fsync on, synchronous_commit on |" in text
    assert ("| Redis (Celery broker, RQ) | not read (Redis: ConnectionRefusedError: nothing "
            "listens) |") in text
    assert "## Durability" not in render(Report(command="c", mode="full", started="now",
                                                machine={}, load_start="0"))


def _group_report(group: str, started: str, command: str, value: float) -> Report:
    report = Report(command=command, mode="full", started=started, machine={"CPU": "c"},
                    load_start="1", load_end="2", duration_s=60, probes={group: 14.0},
                    code="abc1234")
    section = Section(group, f"scenario {group}")
    section.add("rate", Figure.of([value], "/s"), "≥ 1", value >= 1)
    report.sections.append(section)
    return report


def test_a_group_run_again_alone_replaces_its_own_results_and_says_which_run_it_is(
        tmp_path: Path) -> None:
    from benchmarks import results
    from benchmarks.report import render_many

    first = [_group_report(g, "2030-01-01 00:00 UTC", "scripts/bench", 10.0) for g in ("1", "5")]
    for report in first:
        results.save(report, {next(iter(report.probes)): report.sections}, tmp_path)
    whole = render_many(results.load(tmp_path), ["1", "5"])
    assert "## Run\n" in whole and "## Runs" not in whole  # one run: read as one report
    assert whole.index("## 1. scenario 1") < whole.index("## 5. scenario 5")

    again = _group_report("5", "2030-01-02 00:00 UTC", "scripts/bench --only 5 --update", 0.5)
    results.save(again, {"5": again.sections}, tmp_path)
    loaded = results.load(tmp_path)
    assert [r.sections[0].rows[0].figure.values for r in loaded] == [(10.0,), (0.5,)]
    text = render_many(loaded, ["1", "5"])
    assert "## Runs" in text
    assert "| 1 | `scripts/bench` (full) | 2030-01-01 00:00 UTC |" in text
    assert "| 5 | `scripts/bench --only 5 --update` (full) | 2030-01-02 00:00 UTC |" in text
    assert "| 5 | rate | 0 /s (n=1) | ≥ 1 | **not met** |" in text  # the new figure, judged
    assert "10 /s" in text and text.count("## 5. scenario 5") == 1


def test_a_render_shows_each_group_with_no_kept_result_as_not_run() -> None:
    from benchmarks.__main__ import not_run
    from benchmarks.report import render_many

    kept = [_group_report(g, "2030-01-01 00:00 UTC", "scripts/bench", 10.0) for g in ("1", "5")]
    missing = not_run(kept, ["1", "5", "10"])
    assert [next(iter(r.probes)) for r in missing] == ["10"]
    text = render_many(kept + missing, ["1", "5", "10"])
    assert "## Run\n" in text  # one run still: the not-run group reads as part of it
    assert "**Did not complete:** not run: no result of this group is kept" in text
    assert "--only 10 --update" in text and "10: nan" not in text
    assert not_run(kept, ["1", "5"]) == []


def test_the_sizing_section_is_derived_run_by_run_from_the_drains_cpu_per_task() -> None:
    six = Section("6", "Backlog")
    six.add("celery_scheduler: CPU per task, dispatcher", Figure.of([0.25, 0.5], "ms", 2))
    six.add("celery_scheduler: CPU per task, Cassandra", Figure.of([0.2, math.nan], "ms", 2))
    six.add("Celery alone: CPU per task, workers", Figure.of([1.0, 1.0], "ms", 2))
    sizing = sizing_derive([six])
    assert sizing is not None
    rows = {row.what: row.figure for row in sizing.rows}
    assert rows["dispatcher: tasks a second one core carries"].values == (4000.0, 2000.0)
    assert rows["dispatcher: cores for 10,000 tasks/s"].values == (2.5, 5.0)
    assert str(rows["dispatcher: cores for 100,000 tasks/s"]) == "37.5 cores (25.0 to 50.0, n=2)"
    cassandra = rows["Cassandra: tasks a second one core carries"]
    assert cassandra.values[0] == 5000.0 and math.isnan(cassandra.values[1])  # a run not measured
    assert rows["Celery alone's workers: cores for 10,000 tasks/s"].values == (10.0, 10.0)
    assert "Kafka: cores for 10,000 tasks/s" not in rows  # no row of it: nothing derived
    text = render(Report(command="python -m benchmarks", mode="full", started="now", machine={},
                         load_start="", sections=[six]), sizing_derived)
    assert "## S. Sizing" in text and "dispatcher: cores for 10,000 tasks/s" in text
    assert sizing_derive([Section("5", "Failover")]) is None
