"""Benchmarks of celery_scheduler against Celery's own ``eta=``, RQ and the raw clients.

Run ``scripts/bench [--quick]`` (or ``python -m benchmarks``): it starts the services,
runs every scenario against real Kafka, Cassandra, Redis, dispatchers and Celery workers,
and writes ``BENCHMARKS.md``. See that file for what each scenario measures.
"""
