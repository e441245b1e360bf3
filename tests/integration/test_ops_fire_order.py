"""Jobs in fire time order as a merge of each status's range of the (status, fire_at, id) index."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from demo.tasks import noop
from django.db import connection
from django.test.utils import CaptureQueriesContext
from helpers import sql

import cron_at_scale
from cron_at_scale.models import Job, Status
from cron_at_scale.ops.fire_order import in_fire_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def mixed():
    """24 jobs: 18 over every status, fire times interleaved across statuses, three sharing one fire_at;
    the 6 earliest all pending (a window from one status alone)."""
    jobs = [cron_at_scale.schedule(noop, countdown=60) for _ in range(18)]
    (now,), = sql("SELECT statement_timestamp()")[0:1]
    statuses = list(Status.values)
    for i, job in enumerate(jobs):
        at = now + timedelta(seconds=(i * 7) % 18) if i % 6 else now + timedelta(seconds=100)  # 3 ties at +100 s
        sql("UPDATE cron_at_scale_job SET status = %s, fire_at = %s WHERE id = %s",
            [statuses[i % len(statuses)], at, job.id])
    for i, job in enumerate(cron_at_scale.schedule(noop, countdown=60) for _ in range(6)):  # the 6 first: pending
        sql("UPDATE cron_at_scale_job SET fire_at = %s WHERE id = %s", [now - timedelta(seconds=1 + i), job.id])
    sql("ANALYZE cron_at_scale_job")
    return [(j.fire_at, j.id) for j in Job.objects.all()]


def test_every_window_is_the_sorted_lists_window_both_ways_as_models_and_as_dicts(mixed):
    for descending in (False, True):
        want = [i for _, i in sorted(mixed, reverse=descending)]
        for start in range(0, 25, 3):
            for stop in range(start, 27, 4):
                rows = in_fire_order(Job.objects.all(), start=start, stop=stop, descending=descending)
                assert [r.id for r in rows] == want[start:stop], (descending, start, stop)
        dicts = in_fire_order(Job.objects.values("id", "fire_at"), stop=24, descending=descending)
        assert [r["id"] for r in dicts] == want


def test_a_filter_stays_and_each_status_reads_one_bounded_index_range(mixed):
    some = Job.objects.filter(status__in=[Status.PENDING, Status.FAILED])
    want = [j.id for j in some.order_by("-fire_at", "-id")]
    with CaptureQueriesContext(connection) as queries:
        rows = in_fire_order(some, stop=5, descending=True)
    assert [r.id for r in rows] == want[:5]
    *ranges, rows_by_id = [q["sql"] for q in queries.captured_queries]
    assert len(ranges) == len(Status.values)  # one per status, each bounded, keys only
    assert all(re.search(r"LIMIT 5\b", s) and '"payload"' not in s for s in ranges)
    assert '"payload"' in rows_by_id and " IN (" in rows_by_id  # then the window's rows, by id
    sql("SET LOCAL enable_sort = off")  # a table this small would be sorted; can an index give the order?
    sql("SET LOCAL enable_seqscan = off")
    for status in set(Status.values) - {Status.PENDING}:  # an ordered walk of the status index: no sort of the table
        plan = "\n".join(r[0] for r in sql(
            "EXPLAIN SELECT id FROM cron_at_scale_job WHERE status = %s ORDER BY fire_at DESC, id DESC LIMIT 5",
            [status]))
        assert "cron_job_status_fire_at" in plan and "Sort" not in plan, plan
    # pending rows: each shard's ordered walk of the claim's index (ties on fire_at sorted by id as
    # they come), merged
    plan = "\n".join(r[0] for r in sql(
        "EXPLAIN SELECT id FROM cron_at_scale_job WHERE status = 'pending' AND shard = 3 "
        "ORDER BY fire_at DESC, id DESC LIMIT 5"))
    assert "cron_job_pending_shard" in plan and "Incremental Sort" in plan, plan


def test_no_rows_asked_none_read_and_a_negative_bound_is_refused(mixed):
    with CaptureQueriesContext(connection) as queries:
        assert in_fire_order(Job.objects.all(), start=3, stop=3) == []
    assert queries.captured_queries == []
    with pytest.raises(ValueError, match="start and stop"):
        in_fire_order(Job.objects.all(), start=-1, stop=3)


def test_a_job_whose_status_changes_between_two_ranges_is_listed_once(mixed):
    """Each range is its own statement: a job paused right after the pending range was read shows up
    in the paused range too, and is still listed once."""
    moved = Job.objects.filter(status=Status.PENDING).order_by("fire_at", "id").first()
    done: list[bool] = []

    def pause_after_the_pending_range(execute, query, params, many, context):
        result = execute(query, params, many, context)
        if not done and Status.PENDING in (params or ()):
            done.append(True)
            with connection.cursor() as cur:
                cur.execute("UPDATE cron_at_scale_job SET status = 'paused' WHERE id = %s", [moved.id])
        return result

    with connection.execute_wrapper(pause_after_the_pending_range):
        rows = in_fire_order(Job.objects.all(), stop=len(mixed))
    assert done
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)) == len(mixed) and moved.id in ids


def _plan_rows(node: dict) -> int:
    """Rows the plan's scans of the job table read: returned plus filtered out, over all loops."""
    own = 0
    if node.get("Relation Name") == "cron_at_scale_job":
        own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
    return own + sum(_plan_rows(child) for child in node.get("Plans", []))


def _nodes(node: dict) -> list:
    """The plan's nodes, flat: (type, index, rows, rows removed by filter, index condition)."""
    return [(node["Node Type"], node.get("Index Name"), node.get("Actual Rows"), node.get("Rows Removed by Filter"),
             node.get("Index Cond"))] + [n for child in node.get("Plans", []) for n in _nodes(child)]


def _explained(query: str) -> dict:
    (plan,), = sql("EXPLAIN (ANALYZE, FORMAT JSON) " + query)
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return plan[0]["Plan"]


@pytest.fixture
def many_pending():
    """49,997 pending jobs due in 2 to 16 hours, 300 due now (past), 60 of them sharing one fire_at, and 405
    finished or failed ones in between: the pending ones sorted by (fire_at, id) as a list."""
    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, status)
           SELECT gen_random_uuid(), statement_timestamp() + interval '2 hours' + g * interval '1 second',
                  'demo.tasks.noop',
                  '{}', '{}', CASE WHEN g %% 125 = 0 THEN 'completed' ELSE 'pending' END
           FROM generate_series(1, 50400) AS g""")
    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, status)
           SELECT gen_random_uuid(), date_trunc('second', statement_timestamp())
                  - (CASE WHEN g <= 60 THEN 30 ELSE g END) * interval '1 second', 'demo.tasks.noop', '{}', '{}',
                  CASE WHEN g %% 150 = 0 THEN 'failed' ELSE 'pending' END
           FROM generate_series(1, 302) AS g""")
    sql("ANALYZE cron_at_scale_job")
    return [tuple(r) for r in sql("SELECT fire_at, id FROM cron_at_scale_job WHERE status = 'pending' "
                                  "ORDER BY fire_at, id")]


def test_pending_rows_in_fire_order_are_the_shards_ranges_merged_reading_about_the_window(many_pending):
    from cron_at_scale.ops.fire_order import pending_in_fire_order, pending_keys

    assert len(many_pending) == 50_400 - 403 + 300
    for descending in (False, True):
        want = list(reversed(many_pending)) if descending else many_pending
        for start, stop in ((0, 1), (0, 100), (250, 350), (20_000, 20_100)):
            with CaptureQueriesContext(connection) as queries:
                keys = pending_keys(Job.objects.all(), start=start, stop=stop, descending=descending)
            assert keys == want[start:stop], (descending, start, stop)
            (query,) = [q["sql"] for q in queries.captured_queries]
            plan = _explained(query)
            text = json.dumps(plan)
            assert "cron_job_pending_shard" in text and "Merge Append" in text, text[:2000]
            assert '"Seq Scan"' not in text and '"Bitmap Heap Scan"' not in text
            # each shard's walk stops where the merge does: about the window's end, not the shard's rows
            # (an incremental sort by id reads 32 rows at least, and a tie of 60 on one fire_at whole)
            assert _plan_rows(plan) <= stop + 64 * 33 + 60, (_plan_rows(plan), stop)
    # a filter of the caller's stays: the due ones only, and the rows come back as the queryset gives them
    due = [i for at, i in many_pending[:300]]
    rows = pending_in_fire_order(Job.objects.filter(fire_at__lte=many_pending[299][0]).values("id", "task"),
                                 start=10, stop=70)
    assert [r["id"] for r in rows] == due[10:70] and rows[0]["task"] == "demo.tasks.noop"
    assert pending_keys(Job.objects.filter(status=Status.FAILED), stop=10) == []
    with pytest.raises(ValueError, match="start and stop"):
        pending_keys(Job.objects.all(), start=-1, stop=3)


def test_the_dashboards_pending_figures_count_each_shards_range_not_the_claims_whole_index(many_pending):
    from cron_at_scale.ops import status as opstatus

    with CaptureQueriesContext(connection) as queries:
        figures = opstatus.snapshot()
    assert {k: figures.pending[k] for k in ("overdue", "next_minute", "next_hour", "next_day", "later")} \
        == {"overdue": 300, "next_minute": 0, "next_hour": 0, "next_day": 50_400 - 403, "later": 0}
    assert figures.oldest_overdue_seconds >= 302  # the oldest pending job
    counted = [q["sql"] for q in queries.captured_queries if "status = 'pending'" in q["sql"] and "fire_at <=" in q["sql"]]
    assert len(counted) == 4, counted  # the four buckets up to a day
    for query in counted:  # a small bucket's count reads one range of the claim's index per shard
        (n,), = sql(query)
        plan = _explained(query)
        if n < 10_000:  # (not all the index: its second column, fire_at, bounds a walk only under a shard)
            assert _plan_rows(plan) <= n + 64, _nodes(plan)
            assert any(index == "cron_job_pending_shard" and "(shard = ANY" in (cond or "")
                       for _t, index, _r, _f, cond in _nodes(plan)), _nodes(plan)
    queues = opstatus.oldest_due_per_queue(scan=640)
    assert [(q["queue"], q["id"]) for q in queues] == [("", many_pending[0][1])]
