"""Jobs in fire time order as a merge of each status's range of the (status, fire_at, id) index."""

from __future__ import annotations

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
    for status in Status.values:  # an ordered walk of the status index: no sort of the table
        plan = "\n".join(r[0] for r in sql(
            "EXPLAIN SELECT id FROM cron_at_scale_job WHERE status = %s ORDER BY fire_at DESC, id DESC LIMIT 5",
            [status]))
        assert "cron_job_status_fire_at" in plan and "Sort" not in plan, plan


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
