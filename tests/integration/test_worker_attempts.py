"""The worker process's writer: completions ride on the next start (or its thread writes them), kept on a database error."""

from __future__ import annotations

import re
from datetime import timedelta
from uuid import uuid4

import pytest
from demo.tasks import noop
from django.db import connection, connections
from helpers import RecordingPublisher, sql, wait_until

import cron_at_scale
from cron_at_scale import sql as db
from cron_at_scale import worker
from cron_at_scale.broker.message import HEADER
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.worker import attempts as completer
from cron_at_scale.worker import batch_start
from cron_at_scale.worker.middleware.base import Run, SkipJob
from cron_at_scale.worker.middleware.start import IdempotentStart

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started(monkeypatch):
    """``started(n)``: n one-off jobs claimed (not published) and started, as a worker would; [(job_id, attempt)]."""

    def make(n: int) -> list[tuple[str, int]]:
        cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(n)])
        runs = Dispatcher(name="t", shards="all", publisher=RecordingPublisher()).claim()
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
    monkeypatch.setattr(completer, "COMPLETION_DELAY", 0.3)  # all five are handed over within the delay
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
    monkeypatch.setattr(completer, "COMPLETION_DELAY", 30.0)  # the thread stays out of it
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
    for job_id, attempt in runs:  # handed over, thread not started: this test flushes by hand
        writer.write_later(job_id, attempt)
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
    assert [d[:2] for d in writer.done] == runs  # nothing lost
    assert Job.objects.filter(status="completed").count() == 0
    sql("RESET lock_timeout")
    assert writer.flush() == 3
    assert writer.done == []
    assert set(outcomes().values()) == {("succeeded", "completed")}



def _plan(name: str, params: dict) -> list[str]:
    """EXPLAIN ANALYZE prepared statement ``name`` exactly as the worker sends it."""
    template = db._templates[connection.connection][name].sql(bare=False)
    with connection.cursor() as cur:
        cur.execute(template.replace("EXECUTE", "EXPLAIN (ANALYZE, COSTS off) EXECUTE"), params)
        return [r[0] for r in cur.fetchall()]


# How each table may be reached: by primary key, or an attempt by (job_id, attempt).
LOOKUPS = {"cron_at_scale_job": {"cron_at_scale_job_pkey"},
           "cron_at_scale_jobattempt": {"cron_at_scale_jobattempt_pkey", "cron_attempt_job_attempt"}}


def _scans(plan: list[str]) -> list[tuple[str, str, int]]:
    """(table, index, rows read: returned + removed by filter) of each scan node."""
    out = []
    for i, line in enumerate(plan):
        # PostgreSQL 18 prints actual rows with two decimals (rows=1.00).
        m = re.search(r"(\w+ Scan)(?: using (\w+))? on (cron_at_scale_\w+).*rows=(\d+(?:\.\d+)?) loops=(\d+)", line)
        if not m:
            continue
        removed = 0
        for nxt in plan[i + 1:]:
            if "->" in nxt:
                break
            r = re.search(r"Rows Removed by Filter: (\d+(?:\.\d+)?)", nxt)
            removed += float(r.group(1)) if r else 0
        out.append((m.group(3), m.group(2) or m.group(1), round((float(m.group(4)) + removed) * int(m.group(5)))))
    return out


def test_worker_statements_reach_rows_by_key_once_the_tables_have_grown(started, monkeypatch):
    """Each statement's one generic plan is made for the tables as they are when it is prepared:
    made while they were empty, PostgreSQL's pick of index is a coin toss (a walk of the whole
    job table's admin index, of every attempt ever kept), and a plain join was planned as a
    scan of every unfinished attempt. The statements are prepared again every REPLAN_EVERY
    executions (or REPLAN_SECONDS); prepared on grown tables, they read only the rows named by
    their parameters, through the primary key or (job_id, attempt)."""
    sql("ANALYZE cron_at_scale_job")
    sql("ANALYZE cron_at_scale_jobattempt")  # the statistics of empty tables
    connection.close()
    writer = worker.AttemptWriter()
    assert writer.start("00000000-0000-7000-8000-000000000000", 1, "w") is None  # prepared on empty tables
    assert completer.write_many([("00000000-0000-7000-8000-000000000000", 1, str(uuid4()))], "w") == []
    db.run("heartbeat", {"lease": 60.0, "job_ids": [], "attempts": []})
    monkeypatch.setattr(db, "REPLAN_EVERY", 50)
    monkeypatch.setattr(db, "REPLAN_MIN_SECONDS", 0.0)
    runs = started(300)  # 300 started: start_attempt runs 300 times, so it was prepared again
    (generic,), = sql("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'cas_start_attempt'")
    assert generic <= 50
    for job_id, attempt in runs[:100]:  # 100 of them finished
        writer.write_later(job_id, attempt)
    writer.flush()
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(2700)])
    fresh = Dispatcher(name="t2", shards="all", batch_size=5000).claim()  # 2,700 more in flight
    sql("ANALYZE cron_at_scale_job")
    sql("ANALYZE cron_at_scale_jobattempt")  # as autovacuum does after such growth
    monkeypatch.setattr(db, "REPLAN_SECONDS", 0.0)  # the statements measured below are prepared now
    (done_id, done_attempt), nxt = runs[100], fresh[0]
    start_plan = _plan("start_attempt", {"job_id": str(nxt.job_id), "attempt": nxt.attempt, "worker": "w", "token": None,
                                         "fire_at": nxt.fire_at, "lease": 60.0, "done_job_ids": [done_id], "done_attempts": [done_attempt]})
    beat_plan = _plan("heartbeat", {"lease": 60.0, "job_ids": [runs[101][0]], "attempts": [runs[101][1]]})
    batch_plan = _plan("start_attempts", {"job_ids": [str(r.job_id) for r in fresh[1:4]],
                                          "attempts": [r.attempt for r in fresh[1:4]],
                                          "tokens": [str(uuid4()) for _ in range(3)],
                                          "fire_ats": [r.fire_at for r in fresh[1:4]], "worker": "w", "lease": 60.0})
    for plan, per in ((start_plan, 1), (beat_plan, 1), (batch_plan, 3)):  # rows read: 2 per message at most
        scans = _scans(plan)
        assert scans, plan
        for table, index, read in scans:
            if table in LOOKUPS:
                assert index in LOOKUPS[table] and read <= 2 * per, "\n".join(plan)
    assert {(str(a.job_id), a.outcome) for a in JobAttempt.objects.filter(job_id__in=[done_id, nxt.job_id])} == {
        (done_id, "succeeded"), (str(nxt.job_id), "running")}


def test_a_statement_is_prepared_again_at_most_once_a_replan_interval(started, monkeypatch):
    """Preparing and planning the start statement again costs milliseconds of PostgreSQL's CPU: past
    REPLAN_EVERY executions it is prepared again only once REPLAN_MIN_SECONDS have passed since its
    last PREPARE, so a busy worker does not pay it every few hundred tasks."""
    monkeypatch.setattr(db, "REPLAN_EVERY", 20)
    monkeypatch.setattr(db, "REPLAN_MIN_SECONDS", 3600.0)
    connection.close()
    started(100)  # start_attempt runs 100 times on this connection, five times REPLAN_EVERY

    def generic_plans() -> int:
        (n,), = sql("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'cas_start_attempt'")
        return n

    assert generic_plans() == 100  # one PREPARE, its plan used by every execution
    monkeypatch.setattr(db, "REPLAN_MIN_SECONDS", 0.0)
    started(5)
    assert generic_plans() == 5  # prepared again at the first execution past the interval


def test_a_stale_message_of_a_lost_claim_never_runs_another_occurrence_under_its_number(monkeypatch):
    """A claim commits asynchronously: PostgreSQL can lose it in a crash after its message went out.
    The recurring job's attempt counter then hands the same number out again, here first to the
    reaper's re-fire of an earlier occurrence. The lost claim's message must not start that run
    (it would run occurrence W as X, and W's own message would be skipped), by any start path; the
    re-fire's own message does. A one-off job's stale message still runs its job's attempt."""
    monkeypatch.setattr("cron_at_scale.broker.dlq.announce", lambda *a: None)
    d = Dispatcher(name="t", shards="all", lease=30, lookahead=0, publisher=RecordingPublisher())
    job = cron_at_scale.schedule(noop, cron="* * * * * *", catchup="all", overlap="allow")
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '3 seconds', "
        "occurrence_at = occurrence_at - interval '3 seconds' WHERE id = %s", [job.id])
    runs = sorted((r for r in d.claim() if r.job_id == job.id), key=lambda r: r.attempt)
    assert len(runs) >= 2, runs  # catch-up: the missed occurrences each fired
    w, x = runs[0], runs[1]  # occurrence W (attempt 1) and X (attempt 2), both messages sent
    # The claim of X is lost with its messages out: its attempt rows gone, the counter back.
    sql("DELETE FROM cron_at_scale_jobattempt WHERE job_id = %s AND attempt >= %s", [job.id, x.attempt])
    sql("UPDATE cron_at_scale_job SET attempts = %s, fire_at = %s, occurrence_at = %s WHERE id = %s",
        [w.attempt, x.fire_at, x.occurrence or x.fire_at, job.id])
    # W's run was lost too (its worker died before starting it): the reaper fires it again, and
    # the counter gives the re-fire X's old number.
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second' "
        "WHERE job_id = %s AND attempt = %s", [job.id, w.attempt])
    d.publisher.published.clear()
    assert d.reap() == 1
    (refire,) = d.publisher.published
    assert (refire.attempt, refire.fire_at) == (x.attempt, w.fire_at)
    stale = (str(job.id), x.attempt)
    assert completer.write(*stale, "w", str(uuid4()), [], x.fire_at.isoformat()) is None
    assert completer.write_many([(*stale, str(uuid4()), x.fire_at.isoformat())], "w") == []
    # The same through what a worker runs: a pool process's start, and a batch's in the main process.
    header = {"job_id": stale[0], "attempt": stale[1], "fire_at": x.fire_at.isoformat()}

    class Task:
        class request:
            pass

    with pytest.raises(SkipJob):
        IdempotentStart(completer.BatchCompleter()).before_run(Run(Task, dict(header), "host:2"))

    class Request:  # Celery's request as the strategy hands it over
        id, worker_pid = str(uuid4()), None
        request_dict = {HEADER: dict(header)}

    starter = batch_start.BatchStarter()
    starter.waiting.thread_host.stop()
    starter.queue.append((lambda r: None, Request))
    starter.flush()
    assert batch_start.started_of(Request)["row"] is None  # found not to run
    row = JobAttempt.objects.get(job_id=job.id, attempt=x.attempt)
    assert (row.outcome, row.started_at) == ("dispatched", None)
    started = completer.write(*stale, "w", str(uuid4()), [], refire.fire_at.isoformat())  # the re-fire's own message
    assert started is not None and started.outcome == "running" and started.scheduled_at == w.fire_at
    # A one-off job's message runs its job's attempt of that number, whatever fire time it carries.
    once = cron_at_scale.schedule(noop)
    (o,) = [r for r in d.claim() if r.job_id == once.id]
    other = (o.fire_at - timedelta(seconds=7)).isoformat()
    (row,) = completer.write_many([(str(once.id), o.attempt, str(uuid4()), other)], "w")
    assert row.outcome == "running"
