"""What a task costs at a steady light load: CPU per part, and Cassandra statements per table.

::

    python -m benchmarks.statements [--rate 100] [--seconds 20] [--threads]

One dispatcher and two solo workers on the local services; tasks due at *rate* a second,
each scheduled 5 s ahead over 1,000 ordering ids. Prints the CPU per task of the
dispatcher, the workers and each service from the first schedule call to 3 s after the
last due time, the tasks' lateness (p50, p99: first start - due time; of which due time to
sent by the dispatcher, and sent to started on a worker), how many requests
Cassandra took, and how many reads and writes each of the
scheduler's tables took (from Cassandra's own counters, ``system_views``), per task and per
second. The
statements per task are the figure the performance work counts; the reads and writes that
do not grow with the rate (lease renewals, schedule reads) show as their rate per second.

``--rate 0`` schedules nothing: the CPU each part spends a second with the dispatcher and
workers idle is the share of the per-task figures at light load that does not grow with
the rate. ``--threads`` adds, for Cassandra and Kafka, the thread pools that took the most
CPU (``benchmarks.threads``), and for the dispatcher each thread's CPU and how often it
was woken, per task (named from py-spy, if installed). ``--py-spy FILE`` samples the
dispatcher with py-spy (installed
separately: ``pip install py-spy``; ``--gil`` for only the thread holding the interpreter,
which leaves out threads blocked in socket calls) over the same window, writes its collapsed stacks to FILE
and prints the functions that took the most of its samples, by own time and with callees.
"""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from cassandra.cluster import Cluster

from benchmarks.context import feed, utc
from benchmarks.cpu import _cpu_seconds, local_services
from benchmarks.harness import stack
from benchmarks.stats import percentile
from benchmarks.threads import TICKS, python_thread_names, thread_cpu, thread_switches, top_groups

ORDERING_IDS = 1000
LEAD = 5.0
_VIEWS = ("local_read_latency", "local_write_latency", "local_scan_latency")


def table_counts(session: object, keyspace: str) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for view in _VIEWS:
        rows = session.execute(  # type: ignore[attr-defined]
            f"SELECT table_name, count FROM system_views.{view} WHERE keyspace_name = %s", (keyspace,))
        for row in rows:
            found[(view.split("_")[1], row.table_name)] = row.count
    return found


def requests_taken(session: object) -> int:
    """Requests Cassandra has taken from its clients' open connections (``system_views.clients``).

    At light load a request costs the server far more than the statements it carries, so
    this is the figure that coalescing writes brings down. A connection closed meanwhile
    takes its count with it: the figure is for steady connections.
    """
    rows = session.execute("SELECT request_count FROM system_views.clients")  # type: ignore[attr-defined]
    return sum(row.request_count for row in rows)


def _threads(pids: list[int]) -> dict[int, tuple[str, int]]:
    return {tid: thread for pid in pids for tid, thread in thread_cpu(pid).items()}


def _dispatcher_threads(pid: int, before: tuple[dict[int, str], dict[int, tuple[str, int]],
                                              dict[int, int]]
                        ) -> list[tuple[str, float, int]]:
    """Each busy thread of the dispatcher since *before*: its name, CPU seconds, switches."""
    names, cpu, switches = before
    cpu_after, switches_after = thread_cpu(pid), thread_switches(pid)
    found = []
    for tid, (native, ticks) in cpu_after.items():
        used = (ticks - cpu.get(tid, ("", 0))[1]) / TICKS
        woken = switches_after.get(tid, 0) - switches.get(tid, 0)
        if used > 0:
            found.append((names.get(tid, f"{native} {tid}"), used, woken))
    return sorted(found, key=lambda thread: -thread[1])


def _py_spy(pid: int, output: str, gil: bool) -> subprocess.Popen[bytes]:
    # --gil: only the thread that holds the interpreter is sampled, so a thread blocked in a
    # socket call (which py-spy counts as busy) does not show as spending CPU
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
                             "--threads", "--nonblocking", *(["--gil"] if gil else []),
                             "--output", output],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def hot_functions(collapsed: str, top: int = 15) -> tuple[int, list[tuple[str, int, int]]]:
    """From py-spy's collapsed stacks: the samples, and the *top* functions by own samples,
    each with (function, own samples, samples with callees)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [frame.split(" (")[0] for frame in stack.split(";")]
        frames = [frame for frame in frames if not frame.startswith("thread ")]
        if not frames:
            continue
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    return total, [(name, count, inclusive[name]) for name, count in own.most_common(top)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.statements", description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0, help="tasks due a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long tasks fall due")
    parser.add_argument("--threads", action="store_true",
                        help="the busiest thread pools of Cassandra and Kafka, and the dispatcher's threads")
    parser.add_argument("--py-spy", dest="py_spy", metavar="FILE",
                        help="sample the dispatcher with py-spy into FILE (collapsed stacks)")
    parser.add_argument("--gil", action="store_true",
                        help="with --py-spy: sample only the thread holding the interpreter")
    args = parser.parse_args(argv)
    cluster = Cluster(["127.0.0.1"])
    session = cluster.connect()
    services = local_services()
    with stack(Path(tempfile.mkdtemp(prefix="celery-scheduler-statements-"))) as s:
        dispatcher = s.dispatcher()
        workers = [s.worker(), s.worker()]
        app = s.use_client()
        time.sleep(3)  # started and settled: count from here
        before = {name: _cpu_seconds(pids) for name, pids in services.items()}
        parts_before = (_cpu_seconds([dispatcher.pid]), _cpu_seconds([w.pid for w in workers]))
        counted = table_counts(session, s.name)
        requests_before = requests_taken(session)
        pools = {name: _threads(services[name]) for name in ("Cassandra", "Kafka")
                 if args.threads and services.get(name)}
        own = (python_thread_names(dispatcher.pid), thread_cpu(dispatcher.pid),
               thread_switches(dispatcher.pid)) if args.threads else None
        started = time.time()
        sampler = _py_spy(dispatcher.pid, args.py_spy, args.gil) if args.py_spy else None

        def publish(seq: int, due: float) -> None:
            app.record.schedule((f"o{seq % ORDERING_IDS}", seq, due), {}, at=utc(due), wait=False)

        if args.rate > 0:
            t0, total, _ = feed(publish, args.rate, args.seconds, LEAD)
            from celery_scheduler import flush

            flush(app.app, 60)
        else:
            t0, total = time.time(), 0
        while time.time() < t0 + args.seconds + 3:
            time.sleep(0.2)
        elapsed = time.time() - started
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
            sampler.wait(30)
        first: dict[int, float] = {}
        stages: dict[str, list[float]] = {"due to sent": [], "sent to started": []}
        for x in s.starts():
            first[x.seq] = min(first.get(x.seq, x.lateness), x.lateness)
            if x.released is not None:
                stages["due to sent"].append(x.released - x.at)
                stages["sent to started"].append(x.started - x.released)
        ran = len(first)
        after = {name: _cpu_seconds(pids) for name, pids in services.items()}
        dispatcher_cpu = _cpu_seconds([dispatcher.pid]) - parts_before[0]
        workers_cpu = _cpu_seconds([w.pid for w in workers]) - parts_before[1]
        counts = table_counts(session, s.name)
        requests = requests_taken(session) - requests_before
        busiest = {name: top_groups(before_threads, _threads(services[name]), elapsed)
                   for name, before_threads in pools.items()}
        dispatcher_threads = _dispatcher_threads(dispatcher.pid, own) if own else []
    cluster.shutdown()
    per_task = max(total, 1)  # --rate 0: per task columns are not meaningful
    print(f"{total} tasks due at {args.rate:g}/s for {args.seconds:g}s, {ran} ran; "
          f"counted over {elapsed:.1f}s")
    if first:
        late = list(first.values())
        print(f"  lateness p50 {percentile(late, 50) * 1000:.1f} ms, "
              f"p99 {percentile(late, 99) * 1000:.1f} ms, max {max(late) * 1000:.1f} ms")
        for stage, values in stages.items():
            if values:
                print(f"    of which {stage}: p50 {percentile(values, 50) * 1000:.1f} ms, "
                      f"p99 {percentile(values, 99) * 1000:.1f} ms")
    print(f"  {'part':12} {'ms/task':>8} {'ms/s':>8}")
    used = {"dispatcher": dispatcher_cpu, "workers": workers_cpu,
            **{name: after[name] - before[name] for name in after}}
    for name, seconds in used.items():
        print(f"  {name:12} {seconds * 1000 / per_task:8.3f} {seconds * 1000 / elapsed:8.1f}")
    if dispatcher_threads:
        print("  dispatcher threads: ms CPU a task, times woken a task")
        for name, seconds, switches in dispatcher_threads:
            print(f"    {name:32} {seconds * 1000 / per_task:7.3f} {switches / per_task:7.1f}")
    for name, groups in busiest.items():
        print(f"  {name} threads (ms CPU a second): "
              + ", ".join(f"{group} {ms:.0f}" for group, ms in groups))
    print(f"  Cassandra requests: {requests}, {requests / per_task:.2f} per task, "
          f"{requests / elapsed:.1f} per second")
    print("  Cassandra statements (kind, table): count, per task, per second")
    for key in sorted(counts):
        grown = counts[key] - counted.get(key, 0)
        if grown:
            print(f"    {key[0]:5} {key[1]:18} {grown:7d} {grown / per_task:6.2f} {grown / elapsed:8.1f}")
    if args.py_spy:
        samples, hot = hot_functions(Path(args.py_spy).read_text())
        print(f"  dispatcher, py-spy: {samples} samples of its busy threads; own %, with callees %")
        for name, count, inclusive in hot:
            share = 100 / max(samples, 1)
            print(f"    {count * share:5.1f} {inclusive * share:5.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
