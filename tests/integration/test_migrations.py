"""Upgrading a database with jobs in it: migration 0007 (UUIDv7 ids, shard from the id's last 32 bits)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from helpers import sql

from cron_at_scale.models import NUM_SHARDS, Job

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("cron_at_scale", "0006_attempt_job_no_db_constraint")]


def _latest():
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == "cron_at_scale"]


def test_jobs_stored_before_0007_keep_a_uniform_shard_and_are_all_claimed(monkeypatch):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        ids = [uuid.uuid4() for _ in range(3000)]  # the ids made before 0007
        sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
               SELECT i, statement_timestamp() - interval '1 second', 'demo.tasks.noop', '{}', '{}'
               FROM unnest(%s::uuid[]) AS i""", [ids])
        old = dict(sql("SELECT id, shard FROM cron_at_scale_job"))
        assert old[ids[0]] == (int(ids[0].hex[:8], 16) & 0x7FFFFFFF) % NUM_SHARDS  # 0006: the first 32 bits
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(_latest())
    new = dict(sql("SELECT id, shard FROM cron_at_scale_job"))
    assert new.keys() == old.keys()
    assert all(new[i] == (int(i.hex[-8:], 16) & 0x7FFFFFFF) % NUM_SHARDS for i in ids)
    assert len(set(new.values())) == NUM_SHARDS
    (plan,), = sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'cron_job_pending_shard'")
    assert plan == 1

    # Every old job is claimed by the dispatchers that split the shards between them.
    from cron_at_scale.dispatcher import Dispatcher

    monkeypatch.setattr("cron_at_scale.dispatcher.Publisher.publish", lambda self, batch: len(batch))
    halves = [set(range(0, 32)), set(range(32, 64))]
    claimed = []
    for shards in halves:
        d = Dispatcher(name=f"d{min(shards)}", batch_size=5000)
        d._next_shards, d.shards.owned = float("inf"), shards  # holds these 32 shards
        got = d.claim()
        assert all(new[r.job_id] in shards for r in got)
        claimed += [r.job_id for r in got]
    assert sorted(claimed) == sorted(ids)
    assert Job.objects.filter(status="in_progress").count() == 3000


def test_0010_leaves_stored_jobs_as_they_were_and_rewrites_nothing():
    executor = MigrationExecutor(connection)
    executor.migrate([("cron_at_scale", "0009_worker_health")])
    try:
        sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
               VALUES (%s, statement_timestamp(), 'demo.tasks.noop', '{}', '{}')""", [uuid.uuid4()])
        (before,), = sql("SELECT relfilenode FROM pg_class WHERE relname = 'cron_at_scale_job'")
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(_latest())
    (after,), = sql("SELECT relfilenode FROM pg_class WHERE relname = 'cron_at_scale_job'")
    assert after == before  # no table rewrite
    assert [r[0] for r in sql("SELECT max_retries FROM cron_at_scale_job")] == [3]  # the default it was stored with
    (nullable, default), = sql("""SELECT is_nullable, column_default FROM information_schema.columns
                                  WHERE table_name = 'cron_at_scale_job' AND column_name = 'max_retries'""")
    assert (nullable, default) == ("YES", None)  # a job inserted without it takes the task's
