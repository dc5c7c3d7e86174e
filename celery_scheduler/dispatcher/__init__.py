"""The dispatcher: one process of the Kafka consumer group on the scheduler topic, which
persists what it reads and releases what falls due, for the partitions it owns.

One task's way through it, by module (the Kafka clients are the task log's:
:mod:`celery_scheduler.tasklog`; nothing here imports the driver)::

    Kafka topic ──▶ ingest ──────────────▶ store (Cassandra)            persist, then commit
                    rounds, carrying, naming, claims, caught_up
                          │ persisted / cancelled / moved
                          ▼
    leases ──fence──▶ engine ◀── loader (the schedule, read forward)   one thread owns
                      timetable (a queue per ordering id)               what is in memory
                      pausing, limits (the operators' levers)
                          │ due: rules decide
                          ▼
                      releasing ──▶ ontime ──▶ routing ──▶ release/    marked, then sent
                                                   (tasklog.delivery: a delayed Kafka message)
                          ▲
    outcomes topic ──▶ tasklog.outcomes ──▶ settling, beats, cancels   finish, retry, fail,
                                                                       block; keep a lease

- :mod:`~celery_scheduler.dispatcher.service` starts the process: the Kafka clients
  (:mod:`celery_scheduler.tasklog.clients` makes them), the store, the threads (ingest, the
  engine, outcomes, on-time sends) and their shutdown.
- :mod:`~celery_scheduler.dispatcher.ingest` writes each batch it reads through the task
  log's reader port (:class:`~celery_scheduler.tasklog.base.TaskLogReader`) to the store
  before it commits its offsets, in rounds (:mod:`~celery_scheduler.dispatcher.rounds`), a
  hot ordering id's records a few rounds a batch (:mod:`~celery_scheduler.dispatcher.carrying`);
  :mod:`~celery_scheduler.dispatcher.naming` resolves task ids to keys,
  :mod:`~celery_scheduler.dispatcher.claims` keeps it and the engine off the same key, and
  :mod:`~celery_scheduler.dispatcher.caught_up` says how far in time it has read.
- :mod:`~celery_scheduler.dispatcher.engine` is the release loop; what it holds is in
  :mod:`~celery_scheduler.dispatcher.state` and
  :mod:`~celery_scheduler.dispatcher.timetable`, how fast it goes in
  :mod:`~celery_scheduler.dispatcher.pace`, and what it decides, as pure functions, in
  :mod:`~celery_scheduler.dispatcher.rules`.
- :mod:`~celery_scheduler.dispatcher.leases` fences each partition; while a lease is not
  certainly valid, nothing of the partition is released.
- :mod:`~celery_scheduler.dispatcher.releasing` marks due tasks released and hands them to
  :mod:`~celery_scheduler.dispatcher.ontime`, which sends each at its time through
  :mod:`~celery_scheduler.dispatcher.routing`: a Celery task to the broker
  (:mod:`celery_scheduler.release`), a delayed Kafka message to Kafka
  (:mod:`celery_scheduler.tasklog.delivery`).
- :mod:`celery_scheduler.tasklog.outcomes` reads the workers' reports;
  :mod:`~celery_scheduler.dispatcher.settling` and
  :mod:`~celery_scheduler.dispatcher.beats` turn them into the key's next state,
  :mod:`~celery_scheduler.dispatcher.expiry` judges leases that end without one, and
  :mod:`~celery_scheduler.dispatcher.cancels` drops cancelled and moved keys.
- :mod:`~celery_scheduler.dispatcher.firer` and :mod:`~celery_scheduler.dispatcher.firing`
  schedule the periodic entries of the partitions owned; :mod:`~celery_scheduler.dispatcher.kept`
  and :mod:`~celery_scheduler.dispatcher.membership` keep the partitions through a rebalance
  of the group.
"""
