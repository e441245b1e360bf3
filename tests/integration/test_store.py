"""The job store's shape on PostgreSQL: partial index, UUID keys, timestamptz, and the claim's plan."""

from __future__ import annotations

import pytest
from helpers import sql

from cron_at_scale.sql import QUERIES

pytestmark = pytest.mark.django_db

NOTHING_HELD = {"held_queues": [], "held_blank": False, "blank_tasks": []}


def test_pending_index_is_partial_on_fire_at():
    (indexdef,), = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'cron_job_pending_fire_at'")
    assert "(fire_at)" in indexdef
    assert "WHERE ((status)::text = 'pending'::text)" in indexdef


def test_ids_are_uuid_and_times_are_timestamptz():
    cols = dict(sql("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'cron_at_scale_job'"))
    assert cols["id"] == "uuid"
    for name in ("fire_at", "locked_until", "created_at", "updated_at"):
        assert cols[name] == "timestamp with time zone", name
    cols = dict(sql("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'cron_at_scale_jobattempt'"))
    for name in ("scheduled_at", "dispatched_at", "started_at", "finished_at", "locked_until"):
        assert cols[name] == "timestamp with time zone", name


def test_attempt_log_is_unique_per_job_and_attempt():
    (indexdef,), = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'cron_attempt_job_attempt'")
    assert "UNIQUE" in indexdef and "(job_id, attempt)" in indexdef


def test_claim_walks_the_partial_index_beside_many_future_jobs():
    # 50,000 future jobs and 200 due ones: the claim must not scan the table.
    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status)
        SELECT gen_random_uuid(), 'once', now() + (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending'
        FROM generate_series(1, 50000) g
    """)
    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status)
        SELECT gen_random_uuid(), 'once', now() - (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending'
        FROM generate_series(1, 200) g
    """)
    sql("ANALYZE cron_at_scale_job")
    params = {"limit": 1000, "dispatcher": "t", "lease": 30.0, "lookahead": 1.0, **NOTHING_HELD}
    plan = "\n".join(r[0] for r in sql("EXPLAIN " + QUERIES["claim"], {**params, "all_shards": True, "shards": [-1]}))
    assert "cron_job_pending_fire_at" in plan, plan
    assert "Seq Scan on cron_at_scale_job" not in plan, plan
    # A dispatcher holding a few shards: still an index on pending rows, never the table.
    plan = "\n".join(r[0] for r in sql("EXPLAIN " + QUERIES["claim"], {**params, "all_shards": False, "shards": [3, 7]}))
    assert "cron_job_pending" in plan, plan
    assert "Seq Scan on cron_at_scale_job" not in plan, plan


@pytest.mark.parametrize("held", [
    {"held_queues": ["dead"], "held_blank": False, "blank_tasks": []},
    {"held_queues": ["dead", "celery"], "held_blank": True, "blank_tasks": ["demo.tasks.noop"]},
    {"held_queues": [], "held_blank": False, "blank_tasks": ["demo.tasks.record", "demo.tasks.noop"]},
])
def test_the_claim_with_held_queues_still_walks_the_partial_fire_at_index(held):
    # 20,000 due jobs, half for a held queue, 50,000 future ones; statistics taken. Read with the
    # claim's own settings (claim_settings: SET LOCAL in the claim's transaction), as it runs.
    from django.db import transaction

    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status, queue)
        SELECT gen_random_uuid(), 'once', now() + (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending', CASE WHEN mod(g, 2) = 0 THEN 'dead' ELSE '' END
        FROM generate_series(-20000, 50000) g
    """)
    sql("ANALYZE cron_at_scale_job")
    params = {"limit": 1000, "dispatcher": "t", "lease": 30.0, "lookahead": 1.0, "all_shards": True,
              "shards": [-1], **held}
    with transaction.atomic():
        sql(QUERIES["claim_settings"])
        plan = "\n".join(r[0] for r in sql("EXPLAIN " + QUERIES["claim"], params))
        transaction.set_rollback(True)
    assert "Index Scan using cron_job_pending_fire_at on cron_at_scale_job" in plan, plan
    assert "Seq Scan on cron_at_scale_job" not in plan and "Sort" not in plan, plan
