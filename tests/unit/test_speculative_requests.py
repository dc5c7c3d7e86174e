"""A Cassandra node that stalls: which requests go to another replica, and how long a
lightweight transaction waits (store/cqlsession.py). The stalled node itself is in
tests/integration/test_replicated_cassandra.py."""

from __future__ import annotations

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.policies import ConstantSpeculativeExecutionPolicy, TokenAwarePolicy

from celery_scheduler.store import cassandra_leases, cql
from celery_scheduler.store.cqlsession import LWT_PROFILE, LWT_TIMEOUT_SECONDS, idempotent, profiles
from celery_scheduler.store.lifecycle import Expiry


def test_every_statement_but_a_conditional_one_may_be_sent_twice() -> None:
    writes = [cql.DELETE_ROW, cql.INSERT_ROW, cql.SELECT_STATUSES,
              *(cql.status_write(("state", "attempts"), expiry) for expiry in Expiry),
              cql.row_update(("attempts", "lease_until_ms"))]
    assert all(idempotent(statement) for statement in writes)
    leases = [cassandra_leases._INSERT, cassandra_leases._TAKE, cassandra_leases._EXTEND]
    assert not any(idempotent(statement) for statement in leases)
    assert idempotent("SELECT modified, notified FROM t WHERE gift = ?")  # words, not a condition
    assert not idempotent("update t set a = ? where k = ? if a = ?")


def test_the_default_profile_asks_another_replica_and_a_transaction_waits_briefly() -> None:
    found = profiles(ConsistencyLevel.LOCAL_QUORUM, ConsistencyLevel.LOCAL_SERIAL, 10.0)
    default, lwt = found[EXEC_PROFILE_DEFAULT], found[LWT_PROFILE]
    assert isinstance(default.speculative_execution_policy, ConstantSpeculativeExecutionPolicy)
    assert default.speculative_execution_policy.delay <= 0.5
    assert default.request_timeout == 10.0
    assert lwt.request_timeout == LWT_TIMEOUT_SECONDS < 10.0
    for profile in (default, lwt):
        policy = profile.load_balancing_policy
        assert isinstance(policy, TokenAwarePolicy) and policy.shuffle_replicas
    assert profiles(ConsistencyLevel.ONE, ConsistencyLevel.SERIAL, 1.0)[LWT_PROFILE].request_timeout == 1.0
