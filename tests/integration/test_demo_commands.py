"""The demo's summary (example_project/demo/management/commands/demo.py): re-fires counted, and the
firing lag split into the scheduler's part and the workers' part, per run, from the attempt log."""

from __future__ import annotations

from datetime import timedelta

import pytest
from demo.management.commands.demo import Command, run_stats, summary_lines
from django.db import connection
from helpers import sql

import cron_at_scale

pytestmark = pytest.mark.django_db

# The JSON line's fields that are public (README, `make demo ARGS=--json`): kept, whatever is added.
PUBLIC = {"scheduled", "completed", "cancelled", "cron_runs", "missed", "duplicates", "lag_ms", "dispatch_lag_ms",
          "queue_wait_ms"}


def attempt(job, n: int, scheduled: float, dispatched: float, started: float | None, outcome: str, due) -> None:
    """Attempt ``n`` of ``job``: scheduled, dispatched and started so many seconds after ``due``."""
    at = [due + timedelta(seconds=s) if s is not None else None for s in (scheduled, dispatched, started)]
    sql("INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at, finished_at, "
        "outcome) VALUES (%s, %s, %s, %s, %s, %s, %s)", [job.id, n, at[0], at[1], at[2], at[1] + timedelta(seconds=60),
                                                     outcome])


def stats() -> dict:
    with connection.cursor() as cur:
        return run_stats(cur)


def test_a_refire_after_a_lease_ran_out_in_the_queue_is_counted_and_its_wait_is_the_workers():
    due = cron_at_scale.schedule("demo.tasks.record").fire_at
    once, cron = cron_at_scale.schedule("demo.tasks.record"), cron_at_scale.schedule("demo.tasks.record", cron="* * * * *")
    plain = cron_at_scale.schedule("demo.tasks.record")
    # one-off: dispatched after 0.1 s, lost in the queue; fired again at 30 s (its new fire_at), started at 30.5 s
    attempt(once, 1, 0, 0.1, None, "lost", due)
    attempt(once, 2, 30, 30, 30.5, "succeeded", due)
    # a cron occurrence: dispatched on time, lost in the queue, fired again for the same occurrence at 30 s
    attempt(cron, 1, 0, 0, None, "lost", due)
    attempt(cron, 2, 0, 30, 30.2, "succeeded", due)
    attempt(cron, 3, 1, 1, None, "lost", due)  # the next occurrence: a worker started it, then died
    sql("UPDATE cron_at_scale_jobattempt SET started_at = scheduled_at + interval '0.1 s' WHERE attempt = 3")
    attempt(plain, 1, 0, 0.2, 0.3, "succeeded", due)
    figures = stats()
    assert (figures["attempts"], figures["refires"]) == (6, 2)
    assert (figures["lost_before_start"], figures["lost_while_running"]) == (2, 1)
    assert figures["lag_ms"]["max"] == pytest.approx(30500, abs=1)  # from the one-off's first fire_at, not its re-fire's
    # the scheduler dispatched each run on time (the cron re-fire's 30 s, once called its part, is not)
    assert figures["dispatch_lag_ms"]["max"] == pytest.approx(200, abs=1)
    assert figures["queue_wait_ms"]["max"] == pytest.approx(30400, abs=1)  # the workers' queue, and the re-fires


def test_the_summary_names_each_part_of_the_lag_and_the_refires():
    text = summary_lines({"scheduled": 10, "completed": 9, "cancelled": 1, "cron_runs": 0, "missed": 0,
                          "duplicates": 0, "lag_ms": {"p50": 1, "p95": 2, "p99": 3, "max": 4},
                          "dispatch_lag_ms": {"p50": 5, "p95": 5, "p99": 6, "max": 7},
                          "queue_wait_ms": {"p50": 8, "p95": 8, "p99": 9, "max": 30000}, "attempts": 11,
                          "refires": 1, "lost_before_start": 1, "lost_while_running": 0, "elapsed_s": 3})
    lines = text.splitlines()
    assert "re-fires 1 of 11 attempts" in lines[0]
    assert lines[2].lstrip().startswith("the scheduler's part ms: p50 5 ") and "fire_at -> first dispatch" in lines[2]
    assert lines[3].lstrip().startswith("the workers' part ms: p50 8 ") and "max 30000" in lines[3]
    assert "scheduler" not in lines[3]
    assert lines[4].startswith("re-fired attempts: 1 (an attempt lost: 1 before a worker started it")


def test_the_json_line_keeps_its_public_fields_and_adds_the_refires():
    (stopped_at,), = sql("SELECT statement_timestamp()")
    summary = Command().summarize(10, [], [], stopped_at, 1.0)
    assert PUBLIC <= set(summary) and {"attempts", "refires", "lost_before_start", "lost_while_running"} <= set(summary)
    assert all(set(summary[k]) == {"p50", "p95", "p99", "max"} for k in ("lag_ms", "dispatch_lag_ms", "queue_wait_ms"))


def test_runs_moved_to_the_history_still_count():
    from cron_at_scale.maintenance import archive

    archive.keep_partitions(86400, None)
    due = cron_at_scale.schedule("demo.tasks.record").fire_at
    once = cron_at_scale.schedule("demo.tasks.record")
    attempt(once, 1, 0, 0.1, 0.2, "succeeded", due)
    sql("UPDATE cron_at_scale_job SET status = 'completed' WHERE id = %s", [once.id])
    before = stats()
    assert archive.move(0) == (1, False)  # its attempt finished a minute after its dispatch: it may move
    assert stats() == before and before["lag_ms"]["max"] == pytest.approx(200.0)
