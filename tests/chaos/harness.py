"""The chaos run: own services, 2+ dispatchers and workers, a workload, and seeded faults.

One run:

1. takes the chaos lock and (re)starts its own Kafka, Cassandra and broker (Redis, or
   RabbitMQ with ``broker="rabbitmq"``) on the chaos ports (:data:`PORTS`) in their own
   state directory, through ``scripts/services``;
2. creates a topic and keyspace, starts two dispatchers and two Celery workers of
   ``tests.apps.chaos`` (with :class:`tests.integration.dispatch_fixtures.Scheduler`);
3. schedules the workload through the real API at a steady rate, cancelling some tasks
   right after their schedule call returned (a call that raises is made again with the same
   key, as the README tells users to, up to ``Options.retries`` times), while *lanes* inject
   faults on a seeded
   plan: processes (SIGKILL of a dispatcher or a worker, SIGSTOP of a dispatcher past the
   group session timeout and the partition lease) and services (restart of Kafka,
   Cassandra, the broker);
4. waits until every accepted task ran (or a drain timeout), reads the statuses of the
   cancelled keys, stops everything, and hands the facts to :mod:`tests.chaos.verify`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import heapq
import itertools
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tests.integration import dispatch_fixtures
from tests.integration.dispatch_fixtures import Scheduler
from tests.services import REPO

APP = "tests.apps.chaos"
# The chaos services' ports: a set of their own, beside the shared development services.
PORTS = {"KAFKA_PORT": "19092", "KAFKA_CONTROLLER_PORT": "19093", "CASSANDRA_PORT": "19042",
         "CASSANDRA_STORAGE_PORT": "17000", "CASSANDRA_JMX_PORT": "17199", "REDIS_PORT": "16379",
         "RABBITMQ_PORT": "15672"}
KAFKA = f"127.0.0.1:{PORTS['KAFKA_PORT']}"
REDIS = f"redis://127.0.0.1:{PORTS['REDIS_PORT']}"
# The Celery broker of each kind the workers can use, and the service behind it.
BROKERS = {"redis": f"{REDIS}/1", "rabbitmq": f"amqp://guest:guest@127.0.0.1:{PORTS['RABBITMQ_PORT']}//"}

# The cluster run's own services: three Kafka brokers (scripts/kafka-cluster) and three
# Cassandra nodes on 127.0.0.2-4 (scripts/cassandra-cluster), on ports of their own.
# Below the kernel's ephemeral range (32768-60999 by default): a broker restarted on a port
# in it can find the port taken as the source port of some client's outgoing connection (a
# long cluster run lost a Kafka restart to "Address already in use" on 39092).
CLUSTER_PORTS = {"KAFKA_CLUSTER_PORT": "24092", "KAFKA_CLUSTER_CONTROLLER_PORT": "24192",
                 "CASSANDRA_CLUSTER_PORT": "24042", "CASSANDRA_CLUSTER_STORAGE_PORT": "24000",
                 "CASSANDRA_CLUSTER_JMX_PORT": "24199"}
CLUSTER_NODES = 3
# How long a broker waits for the active controller to answer (ms; Kafka's default 30,000).
# A stalled controller held the brokers' requests to it, for producer ids and to add a
# replica back in sync, the whole 30 s of its stall, long after another was elected:
# no new producer could produce meanwhile. docs/production.md recommends the same.
CLUSTER_CONTROLLER_SOCKET_TIMEOUT_MS = 5000
CLUSTER_KAFKA = ",".join(f"127.0.0.1:{int(CLUSTER_PORTS['KAFKA_CLUSTER_PORT']) + n}"
                         for n in range(CLUSTER_NODES))
CLUSTER_CASSANDRA = tuple(f"127.0.0.{n + 2}" for n in range(CLUSTER_NODES))

PROCESS_FAULTS = ("dispatcher-kill", "worker-kill", "dispatcher-pause")
SERVICE_FAULTS = ("kafka-restart", "cassandra-restart", "redis-restart", "rabbitmq-restart")
# Faults of a cluster run beside those: a broker or a node SIGKILLed (no flush) and started
# again, and a broker or a node stopped (SIGSTOP) for NODE_STALL_SECONDS.
CLUSTER_FAULTS = ("kafka-kill", "cassandra-kill", "node-stall")
NODE_STALL_SECONDS = 30.0
# A node that does not start is killed and started again, up to this many times in all.
NODE_START_ATTEMPTS = 3
# After a fault on a Kafka broker, the next fault on Kafka waits until every partition's
# in-sync replicas are all its replicas again, as an operator's rolling restart waits for no
# under-replicated partitions: a broker that answers again may not be in sync yet, and a
# second broker down before it is leaves partitions below min.insync.replicas (a two-broker
# fault, which replication factor 3 is not meant to survive). At most this long (seconds).
IN_SYNC_WAIT_SECONDS = 180.0
# A fault that could not be injected is tried again at the end of its lane, up to this many
# times, so that a run injects the faults its plan counts on.
FAULT_RETRIES = 2


def fault_kinds(broker: str, cluster: bool = False) -> tuple[str, ...]:
    """The fault kinds of a run on *broker*: every process fault, and every service's restart
    (in a cluster, of one of its nodes), and in a cluster its node faults."""
    return (*PROCESS_FAULTS, "kafka-restart", "cassandra-restart", f"{broker}-restart",
            *(CLUSTER_FAULTS if cluster else ()))


def services(broker: str) -> tuple[str, ...]:
    """The chaos set of services for a run on *broker* (never the development RabbitMQ)."""
    return (broker, "kafka", "cassandra")


FAULT_KINDS = fault_kinds("redis")
# Rough seconds each fault takes on a small machine, to spread the workload over the plan.
EXPECTED_SECONDS = {"dispatcher-kill": 15, "worker-kill": 10, "dispatcher-pause": 16,
                    "kafka-restart": 30, "cassandra-restart": 55, "redis-restart": 7,
                    "rabbitmq-restart": 12, "kafka-kill": 30, "cassandra-kill": 60,
                    "node-stall": 32}
# In a plan spread over a window, the scheduler gets at least this long with the services up
# between two restarts, so that a dense plan tests recovery again and again rather than
# making one long outage of them.
SERVICE_MIN_GAP = 30.0
# A paused dispatcher stays stopped past Kafka's session timeout (6 s) plus the partition
# lease (6 s in the chaos app), so its partitions certainly move while it sleeps.
PAUSE_SECONDS = 15.0


def state_root() -> Path:
    base = os.environ.get("CELERY_SCHEDULER_STATE") or str(
        Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "celery-scheduler")
    return Path(base) / "chaos"


class ChaosLockBusy(RuntimeError):
    """Another chaos run holds the chaos services."""


@contextlib.contextmanager
def chaos_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / "run.lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ChaosLockBusy(f"another chaos run holds {root / 'run.lock'}") from exc
        yield


class Services:
    """The chaos set of Kafka, Cassandra and a broker, driven through ``scripts/services``."""

    def __init__(self, state: Path, log: Path, broker: str = "redis") -> None:
        self.env = {**os.environ, **PORTS, "CELERY_SCHEDULER_STATE": str(state)}
        self.log = log
        self.set = services(broker)

    def _script(self, script: str, *args: str, env: dict[str, str] | None = None) -> None:
        with self.log.open("a") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} {script} {' '.join(args)}\n")
            out.flush()
            subprocess.run([str(REPO / "scripts" / script), *args], env=env or self.env,
                           stdout=out, stderr=subprocess.STDOUT, check=True, timeout=300)

    def run(self, command: str, *names: str) -> None:
        self._script("services", command, *(names or self.set))

    def restart(self, service: str) -> None:
        self.run("down", service)
        self.run("up", service)


class ClusterServices(Services):
    """Three Kafka brokers and three Cassandra nodes of the chaos run's own, and its broker.

    A fault touches one node of a service at a time: a restart, a kill or a stall of one
    Kafka broker or one Cassandra node leaves the other two, a quorum.
    """

    def __init__(self, state: Path, log: Path, broker: str = "redis") -> None:
        super().__init__(state, log, broker)
        self.env.update(CLUSTER_PORTS, KAFKA_CLUSTER_STATE=str(state / "kafka-cluster"),
                        KAFKA_CLUSTER_CONFIG="controller.socket.timeout.ms="
                                             f"{CLUSTER_CONTROLLER_SOCKET_TIMEOUT_MS}",
                        CASSANDRA_CLUSTER_STATE=str(state / "cassandra-cluster"))
        self.set = (broker,)
        self.clusters = {"kafka": "kafka-cluster", "cassandra": "cassandra-cluster"}

    def run(self, command: str, *names: str) -> None:
        names = names or (*self.set, *self.clusters)
        for name in names:
            if name not in self.clusters:
                self._script("services", command, name)
            elif command == "wipe":
                self._script(self.clusters[name], "down")
                shutil.rmtree(self.env[f"{name.upper()}_CLUSTER_STATE"], ignore_errors=True)
            else:
                self._script(self.clusters[name], command)

    def node(self, service: str, command: str, node: int) -> None:
        self._script(self.clusters[service], command, str(node))

    def out_of_sync(self) -> int:
        """Kafka's partitions whose in-sync replicas are not all their replicas (or that
        have no leader); -1 when the cluster's metadata cannot be read."""
        from confluent_kafka.admin import AdminClient

        try:
            topics = AdminClient({"bootstrap.servers": CLUSTER_KAFKA}).list_topics(timeout=5).topics
        except Exception:  # no broker answered in time
            return -1
        return sum(1 for topic in topics.values() for partition in topic.partitions.values()
                   if partition.leader < 0 or set(partition.isrs) != set(partition.replicas))

    def wait_in_sync(self, deadline: float) -> float | None:
        """Wait until no Kafka partition is out of sync; the seconds it took, or None if it
        still was at *deadline* (monotonic)."""
        began = time.monotonic()
        while self.out_of_sync() != 0:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        return round(time.monotonic() - began, 1)

    def node_log(self, service: str, node: int) -> Path:
        root = Path(self.env[f"{service.upper()}_CLUSTER_STATE"]) / f"node{node}" / service
        return root / "logs" / ("server.log" if service == "kafka" else "system.log")

    def start_node(self, service: str, node: int, attempts: int = NODE_START_ATTEMPTS) -> list[str]:
        """Start *node* again, killing what is left of a start that failed and trying again,
        so that a fault never leaves a node down for the faults after it (a second broker
        down loses the quorum). Returns what each failed attempt said; raises after the last."""
        failures: list[str] = []
        while True:
            try:
                self.node(service, "up", node)
                return failures
            except subprocess.SubprocessError as exc:
                failures.append(f"{exc!r}; {self.node_log(service, node)} ends: "
                                f"{_tail(self.node_log(service, node))}")
                if len(failures) >= attempts:
                    raise RuntimeError(f"{service} node {node} did not start in {attempts} "
                                       f"attempts: {failures}") from exc
                self.node(service, "kill", node)



def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


@contextlib.contextmanager
def chaos_app() -> Iterator[None]:
    """Make the dispatch fixtures' process handling run the chaos app instead of theirs."""
    previous, dispatch_fixtures.APP = dispatch_fixtures.APP, APP
    try:
        yield
    finally:
        dispatch_fixtures.APP = previous


class PeriodicEntry(NamedTuple):
    """A periodic entry of the chaos app: an interval entry of ``chaos.tick``."""

    name: str
    seconds: float  # the interval
    overlap: str = "buffer_all"  # the entry's overlap policy
    # every third occurrence (by its time) runs this long, the others 0.2 s, on a worker of
    # their own (threads enough for them all, never killed); 0: runs take no time
    slow_run: float = 0.0


@dataclass(frozen=True)
class Options:
    tasks: int = 1200
    ordering_ids: int = 60
    faults_per_kind: int = 1
    seed: int = 1
    gap: tuple[float, float] = (2.0, 5.0)  # seconds between faults of one lane
    window: float | None = None  # spread each lane's faults over this many seconds instead
    # schedule the tasks over this many seconds instead of the span the faults are expected
    # to take (EXPECTED_SECONDS): a run whose faults take less than that ends sooner
    produce_seconds: float | None = None
    delay: tuple[float, float] = (1.0, 12.0)  # how far ahead a task is scheduled
    cancel_share: float = 0.05
    slow_share: float = 0.1  # tasks that run 50-500 ms
    drain_seconds: float = 120.0
    kinds: tuple[str, ...] = FAULT_KINDS
    mutant: str | None = None
    cluster: bool = False  # three Kafka brokers and three Cassandra nodes, and node faults
    # tasks on ordering ids of their own, scheduled in the first third of the run and due
    # far_delay seconds after (so that buckets far ahead are read while faults go on)
    far_tasks: int = 0
    far_delay: tuple[float, float] = (1800.0, 3600.0)
    # bursts of hot_size tasks of one new ordering id each, scheduled back to back and due
    # HOT_GAP apart: a dispatcher's batch reads far more of one ordering id than it writes
    # at once, and carries the rest to later batches
    hot_bursts: int = 0
    hot_size: int = 100
    retries: int = 5  # a schedule call that raised is made again, with the same key, this often
    dispatchers: int = 2
    workers: int = 2
    broker: str = "redis"  # the Celery broker: redis or rabbitmq (with its own restarts)
    # periodic entries the dispatchers fire (scheduler_periodic)
    periodic: tuple[PeriodicEntry, ...] = ()
    # how far ahead the dispatchers write their occurrences (scheduler_periodic_ahead_seconds);
    # None: the package's default
    periodic_ahead: float | None = None
    # Operators' pauses: every pause_gap seconds (about), pause_ids ordering ids are paused
    # for PAUSE_HOLD seconds, then resumed; None: no pauses
    pause_gap: float | None = None
    pause_ids: int = 1
    # Reschedules: every reschedule_gap seconds (about), reschedule_ids pending keys due 4 s or
    # more ahead are moved, each within the gap between its ordering id's neighbours (so the
    # order by seq holds); None: no reschedules
    reschedule_gap: float | None = None
    reschedule_ids: int = 1


# One periodic entry in each of the six partitions (their names hash there), every 2 or 3 s:
# whichever dispatcher dies or pauses, entries of its partitions change hands. Three more
# every 5 s, a third of whose runs take 14 s, one for each other overlap policy: one skips an
# occurrence while the run before goes on, one while the occurrence before waits, and one
# runs each beside the run before.
PERIODIC_ENTRIES = (PeriodicEntry("every-2s-0", 2.0), PeriodicEntry("every-3s-0", 3.0),
                    PeriodicEntry("every-3s-1", 3.0), PeriodicEntry("every-2s-2", 2.0),
                    PeriodicEntry("every-2s-3", 2.0), PeriodicEntry("every-3s-3", 3.0),
                    PeriodicEntry("slow-skip", 5.0, "skip", 14.0),
                    PeriodicEntry("slow-buffer-one", 5.0, "buffer_one", 14.0),
                    PeriodicEntry("slow-allow-all", 5.0, "allow_all", 14.0))
# The chaos app's topic's partitions (an allow_all occurrence's ordering id depends on them).
PARTITIONS = 6
# Threads of the worker that runs the slow entries: enough for every run that may go on at
# once in a run without faults (runs of an occurrence released again after an outage add to
# them, and then an occurrence may wait for a thread).
SLOW_WORKER_THREADS = 6


def periodic_variable(entries: tuple[PeriodicEntry, ...]) -> str:
    """The chaos app's CELERY_SCHEDULER_CHAOS_PERIODIC: ``name=seconds/overlap/slow_run,...``."""
    return ",".join(f"{e.name}={e.seconds:g}/{e.overlap}/{e.slow_run:g}" for e in entries)


@dataclass
class Task:
    ordering_id: str
    seq: int
    duration: float
    delay: float
    gap: float  # least time after the previous task of the ordering id
    cancel: bool
    at_ms: int = 0
    accepted: bool | None = None  # None: the call has not resolved yet
    error: str | None = None
    calls: int = 0  # schedule calls made for it: more than one when one raised
    call_ms: int = 0  # when the last of them was made (its record's place in the log)
    # when the first was made: a call that raised may still have been written, from then on
    # (0 in runs recorded before it was kept: then at_ms - delay, no earlier than the call)
    first_call_ms: int = 0
    cancel_accepted: bool | None = None
    far: bool = False  # scheduled far ahead (Options.far_tasks)
    burst: bool = False  # one of a hot burst (Options.hot_bursts): scheduled without pacing
    cancel_sent_ms: int = 0  # when the cancel call was made ...
    cancel_ms: int = 0  # ... and when it returned
    status: str | None = None  # final store status, read for cancelled and moved keys (their
    # first key's) and keys that did not run
    move_to_ms: int = 0  # a reschedule asked for this new time (0: none was)
    move_sent_ms: int = 0  # when the reschedule call was made ...
    move_ms: int = 0  # ... and when it returned
    move_accepted: bool | None = None  # False: it raised (it may still have reached Kafka)
    move_refused: bool = False  # refused before anything was sent (released already)

    @property
    def latest_ms(self) -> int:
        """The latest time it may be due: its own, or the one a reschedule asked for."""
        return max(self.at_ms, self.move_to_ms)


@dataclass
class Fault:
    kind: str
    target: str
    inject: float
    restore: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


# How long an operator's pause holds its ordering ids (seconds, drawn in this span).
PAUSE_HOLD = (10.0, 20.0)


@dataclass
class OperatorPause:
    """Ordering ids an operator paused: every pause call had returned at *paused*, and the
    first resume call was made at *resumed* (epoch seconds)."""

    ordering_ids: list[str]
    paused: float
    resumed: float = 0.0


@dataclass
class RunFacts:
    """Everything the verifier needs, and nothing it has to trust the scheduler for."""

    options: Options
    tasks: list[Task]
    faults: list[Fault]
    executions: list[dict[str, Any]]
    killed_workers: dict[int, float]  # pid -> SIGKILL time: its open run ended then
    unexpected_exits: list[str]
    started: float
    produced_until: float
    finished: float
    drained: bool
    run_dir: str
    # what the run ran under: leases, consistency, replication, durability of each service
    conditions: dict[str, str] = field(default_factory=dict)
    release_ahead_ms: int = 500  # a release is marked no earlier than its due time less this
    pauses: list[OperatorPause] = field(default_factory=list)


def plan_tasks(options: Options, rng: random.Random) -> list[Task]:
    names = [f"o{i:05d}" for i in range(options.ordering_ids)]
    seqs = dict.fromkeys(names, 0)
    tasks = []
    for _ in range(options.tasks):
        ordering_id = rng.choice(names)
        seq = seqs[ordering_id]
        seqs[ordering_id] = seq + 1
        cancel = rng.random() < options.cancel_share
        duration = round(rng.uniform(0.05, 0.5), 3) if rng.random() < options.slow_share else 0.0
        low, high = options.delay
        delay = rng.uniform(max(low, 4.0) if cancel else low, high)
        tasks.append(Task(ordering_id, seq, duration, delay, rng.uniform(0.0, 0.3), cancel))
    if options.far_tasks:
        # far ahead, on ordering ids of their own (a far task holds back the later tasks of
        # its ordering id): spread over the first third of the schedule calls
        far_names = [f"f{i:05d}" for i in range(max(1, options.far_tasks // 10))]
        far_seqs = dict.fromkeys(far_names, 0)
        span = max(1, len(tasks) // 3)
        for index in range(options.far_tasks):
            ordering_id = rng.choice(far_names)
            seq = far_seqs[ordering_id]
            far_seqs[ordering_id] = seq + 1
            task = Task(ordering_id, seq, 0.0, rng.uniform(*options.far_delay), 0.0,
                        rng.random() < options.cancel_share, far=True)
            tasks.insert(index * span // options.far_tasks + index, task)
    for burst in range(options.hot_bursts):
        # spread over the run, each on an ordering id of its own
        cancel = [rng.random() < options.cancel_share for _ in range(options.hot_size)]
        delay = rng.uniform(4.0, 8.0)
        planned = len(tasks) - burst * options.hot_size  # before any burst was put in
        at = (burst + 1) * planned // (options.hot_bursts + 1) + burst * options.hot_size
        tasks[at:at] = [Task(f"h{burst:03d}", seq, 0.0, delay, HOT_GAP, cancel[seq], burst=True)
                        for seq in range(options.hot_size)]
    return tasks


# How far apart the tasks of a hot burst are due (seconds): they run one at a time.
HOT_GAP = 0.05


# Faults of one lane follow each other; lanes run side by side. Cassandra restarts take the
# longest, so they have a lane of their own.
LANES = (PROCESS_FAULTS, ("cassandra-restart",), ("kafka-restart", "redis-restart", "rabbitmq-restart"))
# A cluster's: one node of each service down at a time (the lanes share a lock per service).
CLUSTER_LANES = (PROCESS_FAULTS, ("cassandra-restart", "cassandra-kill"),
                 ("kafka-restart", "kafka-kill", "redis-restart", "rabbitmq-restart"), ("node-stall",))


def plan_faults(options: Options, rng: random.Random) -> list[list[tuple[str, float]]]:
    """Lanes of (kind, gap before it), each in a seeded random order."""
    lanes = []
    for group in CLUSTER_LANES if options.cluster else LANES:
        kinds = [k for k in group if k in options.kinds] * options.faults_per_kind
        rng.shuffle(kinds)
        low, high = options.gap
        if options.window and kinds:
            # the lane's idle time shared out between its faults, so that it spans the window
            spare = options.window - sum(EXPECTED_SECONDS[kind] for kind in kinds)
            mean = max(low, spare / len(kinds))
            low, high = mean / 2, mean * 3 / 2
        floor = (SERVICE_MIN_GAP if options.window and set(group) & {*SERVICE_FAULTS, *CLUSTER_FAULTS}
                 else 0.0)
        lanes.append([(kind, max(floor, rng.uniform(low, high))) for kind in kinds])
    return lanes


def expected_window(lanes: list[list[tuple[str, float]]]) -> float:
    return max(sum(EXPECTED_SECONDS[kind] + gap for kind, gap in lane) for lane in lanes) + 5.0


class Executions:
    """Reads the execution log as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._rest = b""
        self.events: list[dict[str, Any]] = []
        self.started: set[tuple[str, int]] = set()

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if line:
                event = json.loads(line)
                self.events.append(event)
                if event["event"] == "start":
                    self.started.add((event["o"], event["seq"]))


class Run:
    """One chaos run; :meth:`execute` returns the facts."""

    def __init__(self, options: Options, run_dir: Path, state: Path,
                 say: Any = None) -> None:
        self.options = options
        self.run_dir = run_dir
        self.rng = random.Random(options.seed)
        self.say = say or (lambda message: print(message, flush=True))
        self.services = (ClusterServices if options.cluster else Services)(
            state, run_dir / "services.log", options.broker)
        name = f"chaos_{uuid.uuid4().hex[:10]}"
        self.env = {**os.environ, **PORTS,
                    "CELERY_SCHEDULER_TEST_TOPIC": name, "CELERY_SCHEDULER_TEST_KEYSPACE": name,
                    "CELERY_SCHEDULER_TEST_QUEUE": name, "CELERY_SCHEDULER_TEST_PARTITIONS": str(PARTITIONS),
                    "CELERY_SCHEDULER_TEST_EXECLOG": str(run_dir / "executions.jsonl"),
                    "CELERY_SCHEDULER_CHAOS_KAFKA": KAFKA,
                    "CELERY_SCHEDULER_CHAOS_BROKER": BROKERS[options.broker],
                    "CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT": PORTS["CASSANDRA_PORT"]}
        if options.cluster:
            self.env.update(CELERY_SCHEDULER_CHAOS_CLUSTER="1", CELERY_SCHEDULER_CHAOS_KAFKA=CLUSTER_KAFKA,
                            CELERY_SCHEDULER_CHAOS_CASSANDRA_HOSTS=",".join(CLUSTER_CASSANDRA),
                            CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT=CLUSTER_PORTS["CASSANDRA_CLUSTER_PORT"])
        self.env.pop("CELERY_SCHEDULER_CHAOS_MUTANT", None)
        self.env["CELERY_SCHEDULER_CHAOS_PERIODIC"] = periodic_variable(options.periodic)
        self.env.pop("CELERY_SCHEDULER_CHAOS_PERIODIC_AHEAD", None)
        if options.periodic_ahead is not None:
            self.env["CELERY_SCHEDULER_CHAOS_PERIODIC_AHEAD"] = f"{options.periodic_ahead:g}"
        self.cluster = Scheduler(self.env, run_dir / "executions.jsonl", run_dir)
        self.dispatchers: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.slow_workers: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.killed_workers: dict[int, float] = {}
        self.unexpected: list[str] = []
        self.faults: list[Fault] = []
        self.tasks = plan_tasks(options, self.rng)
        self.lanes = plan_faults(options, self.rng)
        self.executions = Executions(run_dir / "executions.jsonl")
        self._lock = threading.Lock()  # the process lists: lanes and the supervisor
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # A pause moves partitions only while Kafka and Cassandra are up: it waits for them.
        self._up = {"kafka": threading.Lock(), "cassandra": threading.Lock()}
        self._next_restart = 0.0  # a process that keeps exiting is restarted every 5 s at most
        self.lane_errors: list[str] = []
        self._retries: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.pauses: list[OperatorPause] = []
        self._handles: dict[tuple[str, int], Any] = {}  # accepted keys' schedule handles
        self._by_id: dict[str, list[Task]] = defaultdict(list)  # each ordering id's, by seq
        for task in self.tasks:
            self._by_id[task.ordering_id].append(task)

    # --- processes --------------------------------------------------------------------

    def _start_dispatcher(self, wait: bool) -> subprocess.Popen[bytes]:
        if self.options.mutant:
            self.cluster.env = {**self.env, "CELERY_SCHEDULER_CHAOS_MUTANT": self.options.mutant}
        process = self.cluster.dispatcher(wait=wait)
        self.cluster.env = self.env
        self.dispatchers.append(process)
        return process

    def _start_worker(self) -> subprocess.Popen[bytes]:
        process = self.cluster.worker()  # threads workers on RabbitMQ (see Scheduler.worker)
        self.workers.append(process)
        return process

    def _start_slow_worker(self) -> subprocess.Popen[bytes]:
        """The worker of the slow periodic entries' queue: threads enough for every run that
        may go on at once (two of the allow_all entry), so that an occurrence released starts
        at once (their overlap policies are judged by it)."""
        process = self.cluster.worker("--pool=threads", f"--concurrency={SLOW_WORKER_THREADS}",
                                      "-Q", f"{self.env['CELERY_SCHEDULER_TEST_QUEUE']}-slow")
        self.slow_workers.append(process)
        return process

    def _supervise(self) -> None:
        """Restart a dispatcher or worker that exited without being killed (and report it)."""
        if time.monotonic() < self._next_restart:
            return
        with self._lock:
            roles = (("dispatcher", self.dispatchers, lambda: self._start_dispatcher(False)),
                     ("worker", self.workers, self._start_worker),
                     ("slow periodic worker", self.slow_workers, self._start_slow_worker))
            for role, group, start in roles:
                for process in list(group):
                    if process.poll() is not None and process.pid not in self.killed:
                        tail = self.cluster.log_of(process)[-1500:]
                        self.unexpected.append(f"pid {process.pid} ({role}) exited "
                                               f"with {process.returncode}:\n{tail}")
                        self.say(f"!! pid {process.pid} exited unexpectedly; restarting it")
                        group.remove(process)
                        self._next_restart = time.monotonic() + 5.0
                        start()

    # --- faults -------------------------------------------------------------------------

    def _fault(self, kind: str) -> Fault:
        rng = self.rng_faults
        if kind in SERVICE_FAULTS or kind in CLUSTER_FAULTS:
            return self._service_fault(kind, rng)
        if kind == "dispatcher-pause":
            with self._up["kafka"], self._up["cassandra"]:
                return self._pause(rng)
        with self._lock:
            group = self.workers if kind == "worker-kill" else self.dispatchers
            victim = rng.choice(sorted(group, key=lambda p: p.pid))
            fault = Fault(kind, f"pid {victim.pid}", time.time())
            self.killed.add(victim.pid)
            victim.kill()
            victim.wait()
            group.remove(victim)
            if kind == "worker-kill":
                self.killed_workers[victim.pid] = fault.inject
        with self._lock:
            if kind == "worker-kill":
                self._start_worker()
                fault.restore = time.time()
                return fault
            replacement = self._start_dispatcher(wait=False)
        fault.restore = time.time()
        deadline = time.monotonic() + 60
        while "leased partition" not in self.cluster.log_of(replacement):
            if time.monotonic() > deadline or replacement.poll() is not None:
                break
            time.sleep(0.1)
        else:
            fault.detail["replacement_leased_after"] = round(time.time() - fault.inject, 2)
        return fault

    def _service_fault(self, kind: str, rng: random.Random) -> Fault:
        """A restart of a service (in a cluster: of one of its nodes), or a node's kill or stall."""
        service, action = kind.split("-")
        if kind == "node-stall":
            service = rng.choice(["kafka", "cassandra"])
        with self._up.get(service) or contextlib.nullcontext():
            services = self.services
            if not isinstance(services, ClusterServices) or service not in services.clusters:
                fault = Fault(kind, service, time.time())
                services.restart(service)
                fault.restore = time.time()
                return fault
            node = rng.randint(1, CLUSTER_NODES)
            fault = Fault(kind, f"{service} node {node}", time.time())
            if action == "restart":
                services.node(service, "down", node)
            elif action == "kill":
                services.node(service, "kill", node)
                time.sleep(rng.uniform(5.0, 15.0))  # down a while, then started again
            else:
                services.node(service, "stop", node)
                time.sleep(NODE_STALL_SECONDS)
                services.node(service, "cont", node)
                fault.restore = time.time()
                self._until_in_sync(service, fault)
                return fault
            failures = services.start_node(service, node)
            if failures:
                fault.detail["start_failures"] = failures
                self.say(f"!! {service} node {node} started on attempt {len(failures) + 1}: "
                         f"{failures}")
            fault.restore = time.time()
            self._until_in_sync(service, fault)
            return fault

    def _until_in_sync(self, service: str, fault: Fault) -> None:
        """Hold the service's lock (the caller's) until a Kafka fault is healed in full: see
        IN_SYNC_WAIT_SECONDS. The fault's window ends when the node is back, not after this."""
        if service != "kafka" or not isinstance(self.services, ClusterServices):
            return
        took = self.services.wait_in_sync(time.monotonic() + IN_SYNC_WAIT_SECONDS)
        fault.detail["in_sync_after"] = took if took is not None else "never"
        if took is None:
            self.say(f"!! Kafka not in sync {IN_SYNC_WAIT_SECONDS:.0f}s after {fault.kind} "
                     f"on {fault.target}")

    def _pause(self, rng: random.Random) -> Fault:
        """SIGSTOP a dispatcher past the session timeout and its partition lease, then SIGCONT."""
        with self._lock:
            # one that owns partitions, so that there is something to move
            owners = [p for p in self.dispatchers if "leased partition" in self.cluster.log_of(p)]
            victim = rng.choice(sorted(owners or self.dispatchers, key=lambda p: p.pid))
            others = [p for p in self.dispatchers if p is not victim]
            before = sum(self.cluster.log_of(p).count("leased partition") for p in others)
            fault = Fault("dispatcher-pause", f"pid {victim.pid}", time.time())
            victim.send_signal(signal.SIGSTOP)
        time.sleep(PAUSE_SECONDS)
        fault.detail["partitions_taken_over"] = sum(
            self.cluster.log_of(p).count("leased partition") for p in others) - before
        victim.send_signal(signal.SIGCONT)
        fault.restore = time.time()
        return fault

    def _lane(self, lane: list[tuple[str, float]]) -> None:
        planned = deque(lane)
        failed: Counter[str] = Counter()
        while planned:
            kind, gap = planned.popleft()
            if self._stop.wait(gap):
                return
            self.say(f"   fault: {kind}")
            try:
                fault = self._fault(kind)
            except Exception as exc:  # a fault that could not be injected is reported, not hidden
                self.lane_errors.append(f"{kind}: {exc!r}")
                self.say(f"!! fault {kind} failed: {exc!r}")
                failed[kind] += 1
                if failed[kind] <= FAULT_RETRIES:  # and made again at the lane's end: the
                    planned.append((kind, gap))   # plan's count of each kind is the run's
                continue
            self.faults.append(fault)
            self.say(f"   fault: {kind} on {fault.target} over after "
                     f"{fault.restore - fault.inject:.1f}s {fault.detail or ''}")

    # --- operators' pauses -------------------------------------------------------------

    def _pauser(self, until: float) -> None:
        """Until *until*: wait about pause_gap, pause pause_ids ordering ids for PAUSE_HOLD,
        resume them. A pause call that raised (Cassandra away) is resumed at once; a resume
        that raised is made again until it works, or what it holds would never run."""
        from celery_scheduler import pauses
        from celery_scheduler.errors import SchedulerError
        from tests.apps import chaos

        rng = random.Random(self.options.seed * 104729 + 3)
        names = sorted({t.ordering_id for t in self.tasks})
        gap = self.options.pause_gap or 0.0
        while not self._stop.wait(rng.uniform(gap / 2, gap * 1.5)) and time.time() < until:
            chosen = rng.sample(names, min(self.options.pause_ids, len(names)))
            try:
                for name in chosen:
                    pauses.pause(chaos.app, ordering_id=name, reason="chaos", by="chaos")
                held: OperatorPause | None = OperatorPause(chosen, time.time())
                self.say(f"   pause: {len(chosen)} ordering id(s), e.g. {chosen[0]}")
            except SchedulerError as exc:
                held = None
                self.say(f"   pause: failed ({exc}); resuming what it paused")
            if held is not None:
                self._stop.wait(rng.uniform(*PAUSE_HOLD))
                held.resumed = time.time()
                self.pauses.append(held)
            self._resume(chosen)
        self.say(f"   pauses: {len(self.pauses)} made")

    def _resume(self, names: list[str]) -> None:
        from celery_scheduler import pauses
        from celery_scheduler.errors import PauseError, SchedulerError
        from tests.apps import chaos

        for name in names:
            for _ in range(600):
                try:
                    pauses.resume(chaos.app, ordering_id=name)
                    break
                except PauseError:  # never paused (its pause call raised first)
                    break
                except SchedulerError:
                    time.sleep(1.0)
            else:
                self.lane_errors.append(f"resume of {name}: failed for 10 minutes")

    # --- reschedules ---------------------------------------------------------------------

    def _rescheduler(self, until: float) -> None:
        """Until *until*: about every reschedule_gap, move reschedule_ids pending keys due 4 s
        or more ahead to a time between their ordering id's neighbours (see _new_time)."""
        from celery_scheduler.errors import NotReschedulableError

        rng = random.Random(self.options.seed * 7919 + 5)
        gap = self.options.reschedule_gap or 0.0
        while not self._stop.wait(rng.uniform(gap / 2, gap * 1.5)) and time.time() < until:
            now_ms = int(time.time() * 1000)
            recent = list(self._handles)[-3000:]
            rng.shuffle(recent)
            moved = 0
            for key in recent:
                task = self._tasks_by_key(key)
                if (task.cancel or task.move_to_ms or task.at_ms < now_ms + 4_000):
                    continue
                to_ms = self._new_time(task, now_ms, rng)
                if to_ms is None:
                    continue
                task.move_to_ms, task.move_sent_ms = to_ms, int(time.time() * 1000)
                try:
                    self._handles[key].reschedule(
                        at=dt.datetime.fromtimestamp(to_ms / 1000, dt.timezone.utc),
                        kwargs={"duration": task.duration, "scheduled_for": to_ms / 1000})
                    task.move_accepted = True
                except NotReschedulableError as exc:
                    task.move_accepted, task.move_refused, task.error = False, True, repr(exc)
                except Exception as exc:
                    task.move_accepted, task.error = False, repr(exc)
                task.move_ms = int(time.time() * 1000)
                moved += 1
                if moved >= self.options.reschedule_ids:
                    break
        self.say(f"   reschedules: {sum(1 for t in self.tasks if t.move_to_ms)} asked")

    def _tasks_by_key(self, key: tuple[str, int]) -> Task:
        return self._by_id[key[0]][key[1]]

    def _new_time(self, task: Task, now_ms: int, rng: random.Random) -> int | None:
        """A new time for *task*, earlier or later, that keeps it after the task before it and
        before the task after it in its ordering id (later only once that one was made), no
        sooner than 2 s from now; None if there is no room."""
        tasks = self._by_id[task.ordering_id]
        before = tasks[task.seq - 1].latest_ms if task.seq > 0 else 0
        spans = [(max(before + 50, now_ms + 2_000), task.at_ms - 300)]
        if task.seq + 1 < len(tasks) and tasks[task.seq + 1].at_ms:
            after = tasks[task.seq + 1]
            upper = min(after.at_ms, after.move_to_ms or after.at_ms)
            spans.append((task.at_ms + 300, upper - 50))
        spans = [(low, high) for low, high in spans if high - low >= 200]
        if not spans:
            return None
        low, high = rng.choice(spans)
        return rng.randint(low, high)

    # --- workload ---------------------------------------------------------------------

    def _client(self) -> Any:
        from celery_scheduler.client import SchedulerClient, set_client
        from celery_scheduler.config import get_settings
        from tests.apps import chaos

        settings = get_settings(chaos.app).replace(
            kafka_bootstrap_servers=self.env["CELERY_SCHEDULER_CHAOS_KAFKA"],
            cassandra_port=int(self.env["CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT"]),
            kafka_topic=self.env["CELERY_SCHEDULER_TEST_TOPIC"], kafka_options={"log_level": 0},
            cassandra_keyspace=self.env["CELERY_SCHEDULER_TEST_KEYSPACE"])
        if self.options.cluster:
            settings = settings.replace(cassandra_contact_points=CLUSTER_CASSANDRA,
                                        cassandra_consistency="LOCAL_QUORUM",
                                        cassandra_serial_consistency="LOCAL_SERIAL")
        client = SchedulerClient(settings)
        set_client(chaos.app, client)
        return client

    def _call(self, task: Task) -> Any:
        """Make *task*'s schedule call (again, with the same key and time, after one raised)."""
        from tests.apps import chaos

        task.calls += 1
        task.call_ms = int(time.time() * 1000)
        if task.calls == 1:
            task.first_call_ms = task.call_ms
        return chaos.record.schedule(
            (task.ordering_id, task.seq), {"duration": task.duration, "scheduled_for": task.at_ms / 1000},
            at=dt.datetime.fromtimestamp(task.at_ms / 1000, dt.timezone.utc), wait=False)

    def _produce(self, rate: float, handles: queue.SimpleQueue[Any]) -> None:
        start = time.monotonic()
        last_ms: dict[str, int] = {}
        for index, task in enumerate(self.tasks):
            if self._stop.is_set():
                break
            pause = start + index / rate - time.monotonic()
            if pause > 0 and not task.burst:
                time.sleep(pause)
            # scheduled times rise with seq: schedule order is time order per ordering id
            at_ms = max(int((time.time() + task.delay) * 1000),
                        last_ms.get(task.ordering_id, 0) + 1 + int(task.gap * 1000))
            last_ms[task.ordering_id] = at_ms
            task.at_ms = at_ms
            try:
                handle = self._call(task)
            except Exception as exc:
                self._retries.put((task, exc))
                continue
            handles.put((task, handle))
        handles.put(None)

    def _resolve(self, handles: queue.SimpleQueue[Any]) -> None:
        """Learn which schedule calls Kafka acknowledged; cancel the chosen ones right after."""
        while (item := handles.get()) is not None:
            task, handle = item
            try:
                handle.wait(60)
            except Exception as exc:
                self._retries.put((task, exc))
                continue
            self._accepted(task, handle)
        self._retries.put(None)

    def _retry(self) -> None:
        """Make the calls that raised again, with the same key, a second after each failure,
        until one is acknowledged or the retries are used up (then the task is not accepted).
        Many wait at once (a Kafka restart fails hundreds): none waits behind another."""
        due: list[tuple[float, int, Task]] = []  # (when, tie, task)
        waiting: list[tuple[Task, Any]] = []  # calls made, not yet resolved
        ties = itertools.count()
        more = True

        def again(task: Task, error: BaseException) -> None:
            if task.calls > self.options.retries or self._stop.is_set():
                task.accepted, task.error = False, repr(error)
            else:
                heapq.heappush(due, (time.monotonic() + 1.0, next(ties), task))

        while more or due or waiting:
            while more:
                try:
                    item = self._retries.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    more = False
                else:
                    again(*item)
            while due and due[0][0] <= time.monotonic():
                task = heapq.heappop(due)[2]
                try:
                    waiting.append((task, self._call(task)))
                except Exception as exc:
                    again(task, exc)
            still = []
            for task, handle in waiting:
                if not handle.done():
                    still.append((task, handle))
                    continue
                try:
                    handle.wait(0)
                except Exception as exc:
                    again(task, exc)
                    continue
                self._accepted(task, handle)
            waiting = still
            time.sleep(0.05)

    def _accepted(self, task: Task, handle: Any) -> None:
        task.accepted = True
        self._handles[(task.ordering_id, task.seq)] = handle
        if task.cancel:
            task.cancel_sent_ms = int(time.time() * 1000)
            try:
                handle.cancel()
                task.cancel_accepted = True
            except Exception as exc:
                task.cancel_accepted, task.error = False, repr(exc)
            task.cancel_ms = int(time.time() * 1000)

    @staticmethod
    def _release_ahead_ms() -> int:
        from celery_scheduler.config import get_settings
        from tests.apps import chaos

        return int(get_settings(chaos.app).release_ahead_seconds * 1000)

    def conditions(self) -> dict[str, str]:
        """What this run ran under, for the report: read from the app and the services."""
        from celery_scheduler.config import get_settings
        from tests.apps import chaos

        s = get_settings(chaos.app)
        conditions = {
            "start lease": f"{s.start_lease_seconds:g} s",
            "run lease": f"{s.lease_seconds:g} s (workers beat every {s.lease_seconds / 10:g} s)",
            "partition lease": f"{s.partition_lease_seconds:g} s",
            "Kafka": "1 broker, replication factor 1, producers acks=all with idempotence, "
                     "log flushed by the OS (Kafka's default)",
            "Cassandra": f"1 node, replication factor 1, writes at {s.cassandra_consistency}, "
                         f"lightweight transactions at {s.cassandra_serial_consistency}, "
                         "commitlog_sync periodic (10 s)",
            "Celery broker": {"redis": "Redis, appendonly off (a restart loses what it held)",
                              "rabbitmq": "RabbitMQ, durable queues, publisher confirms"}[
                                  self.options.broker],
        }
        if self.options.cluster:
            conditions.update({
                "Kafka": "3 brokers (KRaft, each a controller), topics at replication factor 3 "
                         "and min.insync.replicas 2, producers acks=all with idempotence, log "
                         "flushed by the OS (Kafka's default), controller.socket.timeout.ms "
                         f"{CLUSTER_CONTROLLER_SOCKET_TIMEOUT_MS}",
                "Cassandra": "3 nodes (127.0.0.2-4), NetworkTopologyStrategy datacenter1: 3, "
                             "writes at LOCAL_QUORUM, lightweight transactions at LOCAL_SERIAL, "
                             "commitlog_sync batch (a write is acknowledged once its replica "
                             "synced it)",
            })
        if self.options.periodic:
            ahead = (s.periodic_ahead_seconds if self.options.periodic_ahead is None
                     else self.options.periodic_ahead)
            conditions["periodic occurrences written ahead"] = f"{ahead:g} s"
        if self.options.hot_bursts:
            conditions["hot bursts"] = (f"{self.options.hot_bursts} of {self.options.hot_size} tasks "
                                        "of one new ordering id each, scheduled back to back, due "
                                        f"{HOT_GAP * 1000:g} ms apart")
        if self.options.far_tasks:
            low, high = self.options.far_delay
            conditions["far-ahead tasks"] = (f"{self.options.far_tasks} scheduled in the first third of "
                                             f"the run, due {low / 60:g}-{high / 60:g} min later")
        return conditions

    # --- the run ------------------------------------------------------------------------

    def execute(self, fresh: bool = True) -> RunFacts:
        """Run, on services wiped and started for it (*fresh*), or on those already up.

        A run has a topic, keyspace and queue of its own, so runs one after the other may
        share the services (the test suite's do): only the other broker is stopped.
        """
        o = self.options
        self.rng_faults = random.Random(o.seed * 7919 + 1)
        self.say(f"== services up (state {self.services.env['CELERY_SCHEDULER_STATE']})")
        if fresh:
            self.services.run("wipe")
        else:
            for other in sorted(set(BROKERS) - set(self.services.set)):
                self.services.run("down", other)
        self.services.run("up")
        with chaos_app():
            result = self.cluster.cli("init")
            if result.returncode != 0:
                raise RuntimeError(f"scheduler init failed: {result.stderr}")
            try:
                return self._execute()
            finally:
                self._stop.set()  # on Ctrl-C too: no more schedule calls or faults
                for thread in self._threads:  # a fault under way ends before the services stop
                    thread.join(timeout=300)
                self.cluster.stop_all()

    def _execute(self) -> RunFacts:
        o = self.options
        for index in range(o.dispatchers):
            self._start_dispatcher(wait=index == 0)
        for _ in range(o.workers):
            self._start_worker()
        if any(PeriodicEntry(*entry).slow_run for entry in o.periodic):
            self._start_slow_worker()
        client = self._client()
        window = o.produce_seconds or expected_window(self.lanes)
        rate = o.tasks / window
        self.say(f"== {o.tasks} tasks over {o.ordering_ids} ordering ids at {rate:.1f}/s for "
                 f"~{window:.0f}s; faults: {[[k for k, _ in lane] for lane in self.lanes]}")
        started = time.time()
        handles: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threads = [threading.Thread(target=self._produce, args=(rate, handles), name="produce"),
                   threading.Thread(target=self._resolve, args=(handles,), name="resolve"),
                   threading.Thread(target=self._retry, name="retry")]
        threads += [threading.Thread(target=self._lane, args=(lane,), name="lane") for lane in self.lanes]
        if o.pause_gap:
            threads.append(threading.Thread(target=self._pauser, args=(started + window,), name="pauser"))
        if o.reschedule_gap:
            threads.append(threading.Thread(target=self._rescheduler, args=(started + window,),
                                            name="rescheduler"))
        self._threads = threads
        for thread in threads:
            thread.start()
        last_note = 0.0
        while any(t.is_alive() for t in threads):
            self._supervise()
            self.executions.read()
            if time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                self.say(f"   {time.time() - started:5.0f}s: {len(self.executions.started)} keys ran, "
                         f"{sum(1 for t in self.tasks if t.accepted)} accepted, "
                         f"{len(self.faults)} faults done")
            time.sleep(0.5)
        produced_until = time.time()
        drained = self._drain(client.store)
        self.say("== reading the status of cancelled keys and of keys that did not run")
        self.executions.read()
        statuses = [t for t in self.tasks if t.accepted and (
            t.cancel or t.move_to_ms or (t.ordering_id, t.seq) not in self.executions.started)]
        store = client.store
        from celery_scheduler.keys import TaskKey

        for task in statuses:
            key = TaskKey(task.ordering_id, task.at_ms, f"seq-{task.seq}")
            status = store.status(key)
            task.status = None if status is None else status.state.value
        client.close()
        self.cluster.stop_all()
        self.executions.read()
        return RunFacts(self.options, self.tasks, self.faults, self.executions.events,
                        self.killed_workers, self.unexpected + self.lane_errors, started,
                        produced_until, time.time(), drained, str(self.run_dir),
                        self.conditions(), self._release_ahead_ms(), self.pauses)

    def _waiting(self, store: Any) -> list[Task]:
        """Accepted tasks that have not started and must: not those whose cancel was
        accepted, nor those whose cancel raised and yet reached the store (it may or may not
        have reached Kafka: the store says which)."""
        from celery_scheduler.errors import SchedulerError
        from celery_scheduler.keys import TaskKey

        waiting = []
        for t in self.tasks:
            if not t.accepted or t.cancel_accepted or (t.ordering_id, t.seq) in self.executions.started:
                continue
            if t.cancel and t.cancel_accepted is False:
                try:
                    status = store.status(TaskKey(t.ordering_id, t.at_ms, f"seq-{t.seq}"))
                except SchedulerError:
                    status = None
                if status is not None and status.state.value == "cancelled":
                    continue
            waiting.append(t)
        return waiting

    def _drain(self, store: Any) -> bool:
        last_due = max((t.latest_ms for t in self.tasks if t.accepted), default=0) / 1000
        deadline = max(time.time(), last_due) + self.options.drain_seconds
        self.say(f"== draining (up to {deadline - time.time():.0f}s)")
        while time.time() < deadline:
            self._supervise()
            self.executions.read()
            if not self._waiting(store) and time.time() > last_due + 2:
                time.sleep(3)  # late duplicates and cancelled runs would show up now
                self.executions.read()
                return True
            time.sleep(0.5)
        return False


def save_facts(facts: RunFacts, path: Path) -> None:
    path.write_text(json.dumps(asdict(facts)))


def load_facts(path: Path) -> RunFacts:
    """Read facts saved by :func:`save_facts` (to verify or report a run again)."""
    data = json.loads(path.read_text())
    options = data.pop("options")
    options["gap"], options["delay"], options["kinds"] = (
        tuple(options["gap"]), tuple(options["delay"]), tuple(options["kinds"]))
    options["periodic"] = tuple(PeriodicEntry(*entry) for entry in options.get("periodic", ()))
    return RunFacts(options=Options(**options), tasks=[Task(**t) for t in data.pop("tasks")],
                    faults=[Fault(**f) for f in data.pop("faults")],
                    pauses=[OperatorPause(**p) for p in data.pop("pauses", [])],
                    killed_workers={int(pid): at for pid, at in data.pop("killed_workers").items()},
                    **data)
