"""The worker process's writer: completions ride on the next start (or its thread writes them), kept on a database error."""

from __future__ import annotations

import pytest
from demo.tasks import noop
from django.db import connection, connections
from helpers import sql, wait_until

import cron_at_scale
from cron_at_scale import db, worker
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started(monkeypatch):
    """``started(n)``: n one-off jobs claimed (not published) and started, as a worker would; [(job_id, attempt)]."""
    monkeypatch.setattr("cron_at_scale.dispatcher.Publisher.publish", lambda self, batch: len(batch))

    def make(n: int) -> list[tuple[str, int]]:
        cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(n)])
        runs = Dispatcher(name="t", shards="all").claim()
        out = []
        for run in runs:
            row = worker.AttemptWriter().start(str(run.job_id), run.attempt, "w")
            assert row is not None and row[0] == "running"
            out.append((str(run.job_id), run.attempt))
        return out

    return make


def outcomes() -> dict[str, tuple[str, str]]:
    return {str(a.job_id): (a.outcome, a.job.status) for a in JobAttempt.objects.select_related("job")}


def test_completions_handed_over_are_written_by_the_thread_in_one_statement(started, monkeypatch, request):
    runs = started(5)
    cancelled = runs[0][0]
    assert cron_at_scale.cancel(cancelled)  # cancelled while it ran: its attempt ends 'cancelled'
    statements = []
    real_run = db.run
    monkeypatch.setattr(db, "run", lambda name, *a, **k: statements.append(name) or real_run(name, *a, **k))
    monkeypatch.setattr(worker, "COMPLETION_DELAY", 0.3)  # all five are handed over within the delay
    writer = worker.AttemptWriter()
    request.addfinalizer(writer.stop)
    for job_id, attempt in runs:
        writer.completed(job_id, attempt)
    assert all(o == ("running", "in_progress") for j, o in outcomes().items() if j != cancelled)  # not on the task's path
    wait_until(lambda: all(o[0] != "running" for o in outcomes().values()), timeout=10, what="the writer")
    got = outcomes()
    assert got.pop(cancelled) == ("cancelled", "cancelled")
    assert set(got.values()) == {("succeeded", "completed")}
    assert statements.count("start_attempt") == 1  # the five in one statement
    assert JobAttempt.objects.filter(finished_at__isnull=True).count() == 0


def test_a_completion_rides_on_the_next_start_in_the_same_statement(started, monkeypatch, request):
    (first, second), = [started(1) + started_pending()]
    statements = []
    real_run = db.run
    monkeypatch.setattr(db, "run", lambda name, *a, **k: statements.append(name) or real_run(name, *a, **k))
    monkeypatch.setattr(worker, "COMPLETION_DELAY", 30.0)  # the thread stays out of it
    writer = worker.AttemptWriter()
    request.addfinalizer(writer.stop)
    writer.completed(*first)
    assert outcomes()[first[0]] == ("running", "in_progress")
    assert writer.start(second[0], second[1], "w")[0] == "running"
    assert statements == ["start_attempt"]
    got = outcomes()
    assert got[first[0]] == ("succeeded", "completed") and got[second[0]] == ("running", "in_progress")
    assert writer.done == []


def started_pending() -> list[tuple[str, int]]:
    """One more job claimed but not started: [(job_id, attempt)]."""
    cron_at_scale.schedule(noop)
    run, = Dispatcher(name="t2", shards="all").claim()
    return [(str(run.job_id), run.attempt)]


def test_a_failed_write_keeps_the_completions_queued_until_the_database_takes_them(started):
    runs = started(3)
    writer = worker.AttemptWriter()
    writer.done.extend(runs)  # handed over, thread not started: this test flushes by hand
    name = connection.settings_dict["NAME"]
    locker = connections.create_connection("default")  # another session, holding a lock
    locker.set_autocommit(False)
    try:
        locker.cursor().execute("LOCK TABLE cron_at_scale_jobattempt IN ACCESS EXCLUSIVE MODE")
        sql(f'ALTER DATABASE "{name}" SET lock_timeout = \'300ms\'')  # the reconnect of db.run's retry too
        sql("SET lock_timeout = '300ms'")
        with pytest.raises(Exception, match="lock"):
            writer.flush()
    finally:
        locker.rollback()
        locker.close()
        sql(f'ALTER DATABASE "{name}" RESET lock_timeout')
    assert writer.done == runs  # nothing lost
    assert Job.objects.filter(status="completed").count() == 0
    sql("RESET lock_timeout")
    assert writer.flush() == 3
    assert writer.done == []
    assert set(outcomes().values()) == {("succeeded", "completed")}



def _rows_read_from_attempts(name: str, params: dict) -> int:
    """Run prepared statement ``name`` under EXPLAIN ANALYZE, as the worker sends it; the most
    rows any one scan of the attempt table returned."""
    template = db._templates[connection.connection][name]
    with connection.cursor() as cur:
        cur.execute(template.replace("EXECUTE", "EXPLAIN (ANALYZE, COSTS off) EXECUTE"), params)
        plan = [r[0] for r in cur.fetchall()]
    scans = [int(line.rsplit("rows=", 1)[1].split()[0]) for line in plan
             if "Scan" in line and "cron_at_scale_jobattempt" in line and "actual" in line]
    assert scans, plan
    return max(scans)


def test_worker_statements_read_only_the_attempts_they_name_whatever_the_statistics(started):
    """Their one generic plan is made at the first EXECUTE of a connection. Made while the
    table looked empty, a plain join was planned as a scan of every unfinished attempt,
    run at every task: O(jobs in flight) per task."""
    sql("ANALYZE cron_at_scale_jobattempt")  # the statistics of an empty table
    connection.close()  # a new connection: plans are made afresh
    writer = worker.AttemptWriter()
    assert writer.start("00000000-0000-7000-8000-000000000000", 1, "w") is None  # prepared and planned now
    db.run("heartbeat", {"lease": 60.0, "job_ids": [], "attempts": []})
    runs = started(1500)  # then 1,500 attempts in flight
    (job_id, attempt), (next_id, next_attempt) = runs[0], runs[1]
    sql("UPDATE cron_at_scale_jobattempt SET outcome = 'dispatched', started_at = NULL WHERE job_id = %s", [next_id])
    read = _rows_read_from_attempts("start_attempt", {
        "job_id": next_id, "attempt": next_attempt, "worker": "w", "lease": 60.0,
        "done_job_ids": [job_id], "done_attempts": [attempt]})
    assert read <= 2
    assert _rows_read_from_attempts("heartbeat", {"lease": 60.0, "job_ids": [runs[2][0]], "attempts": [runs[2][1]]}) <= 2
    assert {(str(a.job_id), a.outcome) for a in JobAttempt.objects.filter(job_id__in=[job_id, next_id])} == {
        (job_id, "succeeded"), (next_id, "running")}
