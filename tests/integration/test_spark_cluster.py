"""The bulk job on a standalone Spark cluster, not only on local Spark.

A master and one worker are started on loopback with the PySpark distribution's own
``spark-class`` (as a cluster's machines would run them), the job is submitted to the
master's URL, and the records it wrote are counted in the topic.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.raw_topic import PARTITIONS, read_topic
from tests.services import REPO

# the Spark modules on one test process, one after the other: one Spark JVM at a time
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.xdist_group("spark"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
UTC = dt.timezone.utc
ROWS = 5_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
            state = json.load(answer)
    except OSError:
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker on loopback; yields the master URL."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work")}
    logs = [(tmp_path / name).open("wb") for name in ("master.log", "worker.log")]
    master = subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui)],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
         "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui), url],
        env=env, stdout=logs[1], stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while _alive_workers(ui) < 1:
            assert master.poll() is None and worker.poll() is None, (
                (tmp_path / "master.log").read_text()[-3000:] + (tmp_path / "worker.log").read_text()[-3000:])
            assert time.monotonic() < deadline, "the worker did not register with the master"
            time.sleep(0.5)
        yield url
    finally:
        for process in (worker, master):
            process.terminate()
        for process in (worker, master):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()


def test_the_bulk_job_runs_on_a_standalone_cluster(
        cluster: str, scheduler: Scheduler, schedule: Callable[..., Any], kafka_bootstrap: str) -> None:
    from celery_scheduler.spark import schedule_dataframe, session

    # the executors run this Python, and import the task's module from this checkout
    config = {"spark.pyspark.python": sys.executable, "spark.executor.memory": "768m",
              "spark.executorEnv.PYTHONPATH": str(REPO),
              **{f"spark.executorEnv.{name}": value for name, value in scheduler.env.items()
                 if name.startswith("CELERY_SCHEDULER_")}}
    spark = session(cluster, "celery_scheduler cluster check", config)
    try:
        assert spark.sparkContext.master == cluster
        later = (dt.datetime.now(UTC) + dt.timedelta(days=1)).replace(microsecond=0, tzinfo=None)
        df = spark.createDataFrame([(f"cluster-{n % 100}", n, later) for n in range(ROWS)],
                                   "customer string, seq long, due timestamp").repartition(4)
        result = schedule_dataframe(df, schedule.record, at="due", args=["customer", "seq"])
        assert (result.accepted, result.rejected_count) == (ROWS, 0)
    finally:
        spark.stop()
        gc.collect()
    found = read_topic(kafka_bootstrap, scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"], ROWS)
    assert sum(map(len, found.values())) == ROWS and len(found) == PARTITIONS
