"""Leases and the reaper, in process on PostgreSQL: lost attempts fire again, poison jobs end failed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from demo.tasks import noop
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale import ValidationError
from cron_at_scale import sql as db
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


@pytest.fixture
def dispatcher(monkeypatch):
    announced = []
    monkeypatch.setattr("cron_at_scale.broker.dlq.announce", lambda *a: announced.append(a))
    d = Dispatcher(name="t", lease=30, publisher=RecordingPublisher())
    d.published, d.announced = d.publisher.published, announced
    return d


def expire_leases(started: bool = False):
    """Expire every open lease; ``started``: as if a worker had started the attempts (then died)."""
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second', "
        "started_at = CASE WHEN %s THEN statement_timestamp() END WHERE finished_at IS NULL", [started])


def test_unexpired_leases_are_left_alone(dispatcher):
    cron_at_scale.schedule(noop)
    dispatcher.claim()
    assert dispatcher.reap() == 0
    assert Job.objects.get().status == "in_progress"


def test_lost_attempt_fires_again_with_the_next_attempt_number(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    expire_leases(started=True)  # its worker died
    assert dispatcher.reap() == 1
    row = Job.objects.get(id=job.id)
    assert (row.status, row.lost_attempts, row.retries) == ("pending", 1, 0)
    assert JobAttempt.objects.get(job_id=job.id, attempt=1).outcome == "lost"
    batch = dispatcher.claim()
    assert [(str(c.job_id), c.attempt) for c in batch] == [(str(job.id), 2)]


def test_a_job_that_keeps_losing_its_attempts_fails_and_is_dead_lettered(dispatcher, settings):
    settings.CRON_AT_SCALE = {"MAX_LOST_ATTEMPTS": 3}
    dispatcher.max_lost = 3
    job = cron_at_scale.schedule(noop)
    for _ in range(3):
        assert len(dispatcher.claim()) == 1
        expire_leases(started=True)  # a poison job: its worker dies while running it
        dispatcher.reap()
    row = Job.objects.get(id=job.id)
    assert (row.status, row.lost_attempts) == ("failed", 3)
    assert [a[1:3] for a in dispatcher.announced] == [(job.id, 3)]
    assert dispatcher.claim() == []


def test_attempts_lost_before_any_worker_started_them_never_fail_the_job(dispatcher):
    # A backlog or a broker outage longer than the dispatch lease: the job is not at fault.
    job = cron_at_scale.schedule(noop)
    leases = []
    for _ in range(7):
        assert len(dispatcher.claim()) == 1
        (lease,), = sql("SELECT extract(epoch FROM locked_until - dispatched_at) FROM cron_at_scale_jobattempt "
                        "WHERE finished_at IS NULL")
        leases.append(round(float(lease)))
        expire_leases(started=False)
        dispatcher.reap()
    row = Job.objects.get(id=job.id)
    assert (row.status, row.lost_attempts, row.attempts) == ("pending", 0, 7)
    assert leases == [30, 60, 120, 240, 480, 480, 480]  # re-fires back off so they do not outrun the workers


def test_finished_attempts_are_never_reaped(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    sql("UPDATE cron_at_scale_jobattempt SET finished_at = statement_timestamp(), outcome = 'succeeded'")
    expire_leases()
    assert dispatcher.reap() == 0
    assert Job.objects.get(id=job.id).status == "in_progress"


def test_a_lost_cron_run_fires_again_for_the_same_occurrence(dispatcher):
    job = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '1 second', occurrence_at = "
        "statement_timestamp() - interval '1 second'")
    (scheduled,), = sql("SELECT fire_at FROM cron_at_scale_job")
    dispatcher.claim()
    expire_leases()
    assert dispatcher.reap() == 1
    assert [(c.attempt, c.fire_at) for c in dispatcher.published] == [(2, scheduled)]
    attempts = dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "outcome"))
    assert attempts == {1: "lost", 2: "dispatched"}
    row = Job.objects.get(id=job.id)
    assert row.status == "pending" and row.fire_at > scheduled  # the schedule moved on regardless


def test_a_recurring_run_lost_before_any_start_fires_again_with_a_longer_lease_until_one_starts(dispatcher):
    # A burst of cron runs on a slow fleet: each re-fire of an occurrence that nobody started waits
    # twice as long as the last (up to 16x), so re-fires do not outrun the workers. A run of it that
    # started and was lost is the worker's loss, not the queue's: the plain lease again.
    job = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '1 second', occurrence_at = "
        "statement_timestamp() - interval '1 second'")

    def lease() -> int:
        (seconds,), = sql("SELECT extract(epoch FROM locked_until - GREATEST(dispatched_at, scheduled_at)) "
                          "FROM cron_at_scale_jobattempt WHERE finished_at IS NULL")
        return round(float(seconds))

    dispatcher.claim()  # attempt 1
    leases = [lease()]
    for _ in range(6):
        expire_leases(started=False)  # lost in the queue
        assert dispatcher.reap() == 1
        leases.append(lease())
    assert leases == [30, 60, 120, 240, 480, 480, 480]
    assert _start(job.id, 7) == ("running", 7)  # a worker starts attempt 7, then dies
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second' "
        "WHERE finished_at IS NULL")
    assert dispatcher.reap() == 1
    assert lease() == 30
    expire_leases(started=False)
    assert dispatcher.reap() == 1
    assert lease() == 60
    assert sql("SELECT count(DISTINCT scheduled_at) FROM cron_at_scale_jobattempt") == [(1,)]  # one occurrence
    assert [c.attempt for c in dispatcher.published] == list(range(2, 10))
    assert list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt")
                .values_list("dispatch_losses", "occurrence_losses")) == [
        (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (0, 1), (1, 1)]
    assert Job.objects.get(id=job.id).lost_attempts == 1  # only the started run counts toward MAX_LOST_ATTEMPTS


def test_a_cancelled_cron_jobs_lost_run_is_not_fired_again(dispatcher):
    job = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '1 second', occurrence_at = "
        "statement_timestamp() - interval '1 second'")
    dispatcher.claim()
    cron_at_scale.cancel(job.id)
    expire_leases()
    assert dispatcher.reap() == 1
    assert dispatcher.published == []


def _as_if_the_clock_stepped(reaper, seconds: float) -> None:
    """The reaper's last reading of the database clock moved so that its next pass sees a step of
    ``seconds`` (+ forward): the clock itself cannot be stepped here (the fault suite does it)."""
    reaper.watch_clock()
    db_time, mono = reaper._reading
    reaper._reading = (db_time - seconds, mono)


def test_a_forward_step_of_the_database_clock_reaps_no_running_attempt_until_heartbeats_renewed(dispatcher):
    running, queued = cron_at_scale.schedule(noop), cron_at_scale.schedule(noop)
    dispatcher.claim()
    expire_leases(started=False)
    sql("UPDATE cron_at_scale_jobattempt SET started_at = statement_timestamp() WHERE job_id = %s", [running.id])
    reaper = dispatcher.reaper
    reaper.run_lease = 1.0  # the hold lasts one run lease
    _as_if_the_clock_stepped(reaper, 40.0)
    assert dispatcher.reap() == 1  # the queued message's lease only
    assert reaper.steps and 38 < reaper.steps[-1] < 42
    outcomes = dict(JobAttempt.objects.values_list("job_id", "outcome"))
    assert (outcomes[running.id], outcomes[queued.id]) == ("dispatched", "lost")
    time.sleep(1.1)  # a live heartbeat would have renewed it by now: this one is dead
    assert dispatcher.reap() == 1
    assert JobAttempt.objects.get(job_id=running.id, attempt=1).outcome == "lost"


def test_the_reap_statement_leaves_a_running_attempt_when_its_clock_is_past_the_readers():
    job = cron_at_scale.schedule(noop)
    Dispatcher(name="t", publisher=RecordingPublisher()).claim()
    expire_leases(started=True)
    past = db.db_now() - timedelta(seconds=5)  # the reaper read the clock, then it stepped 5 s forward
    assert db.run("reap", {"limit": 10, "running_until": past}) == []
    assert db.run("reap", {"limit": 10, "running_until": None}) == []  # a step being waited out
    assert [(r.job_id, r.attempt) for r in db.run("reap", {"limit": 10, "running_until": past + timedelta(60)})] == [
        (job.id, 1)]


def test_after_a_backward_step_a_lease_written_before_it_runs_out_on_the_monotonic_clock(dispatcher):
    dead, alive = cron_at_scale.schedule(noop), cron_at_scale.schedule(noop)
    dispatcher.claim()
    # both leases written before a 40 s step back, 1 s left: on the stepped clock they end in 41 s
    sql("UPDATE cron_at_scale_jobattempt SET started_at = statement_timestamp(), outcome = 'running', "
        "locked_until = statement_timestamp() + interval '41 seconds'")
    reaper = dispatcher.reaper
    reaper.run_lease = 4.0  # a lease ending 41 s ahead was not written by a heartbeat on this clock
    reaper.heartbeat_interval = 0.2  # counted no sooner than a heartbeat (and the tolerance) would change it
    _as_if_the_clock_stepped(reaper, -40.0)
    assert dispatcher.reap() == 0
    assert sorted(reaper._stale) == sorted(JobAttempt.objects.values_list("id", flat=True))
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() + interval '4 seconds' "
        "WHERE job_id = %s", [alive.id])  # its heartbeat, on the new clock
    time.sleep(1.3)
    assert dispatcher.reap() == 1
    outcomes = dict(JobAttempt.objects.values_list("job_id", "outcome"))
    assert (outcomes[dead.id], outcomes[alive.id]) == ("lost", "running")
    assert "step back" in JobAttempt.objects.get(job_id=dead.id).error


def test_requeue_puts_failed_jobs_back_with_retries_reset():
    a = cron_at_scale.schedule(noop)
    b = cron_at_scale.schedule("demo.tasks.record")
    c = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'failed', retries = 3, lost_attempts = 1 WHERE id <> %s", [c.id])
    assert cron_at_scale.requeue(a.id) == 1
    row = Job.objects.get(id=a.id)
    assert (row.status, row.retries, row.lost_attempts) == ("pending", 0, 0)
    assert cron_at_scale.requeue(a.id) == 0  # not failed any more
    assert cron_at_scale.requeue(task="demo.tasks.record") == 1
    assert Job.objects.get(id=b.id).status == "pending"
    with pytest.raises(ValidationError):
        cron_at_scale.requeue()  # neither an id nor a filter nor all_failed=True
    with pytest.raises(ValidationError):
        cron_at_scale.requeue("nope")


def test_requeue_leaves_a_job_whose_key_is_live_again():
    old = cron_at_scale.schedule(noop, key="k")
    sql("UPDATE cron_at_scale_job SET status = 'failed'")
    cron_at_scale.schedule(noop, key="k")
    assert cron_at_scale.requeue(all_failed=True) == 0
    assert Job.objects.get(id=old.id).status == "failed"


def test_cron_requeue_command(capsys):
    from django.core.management import CommandError, call_command

    job = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'failed'")
    call_command("cron_requeue", str(job.id))
    assert "requeued 1 job" in capsys.readouterr().out
    with pytest.raises(CommandError, match="not a failed job"):
        call_command("cron_requeue", str(job.id))
    with pytest.raises(CommandError, match="--all-failed"):
        call_command("cron_requeue")


def test_worker_statements_are_prepared_and_survive_a_session_reset():
    from cron_at_scale import sql as db

    job = cron_at_scale.schedule(noop)
    Dispatcher(name="p").claim()
    row = db.run("start_attempt", {"job_id": str(job.id), "attempt": 1, "worker": "w", "token": None, "fire_at": None, "lease": 60.0,
                                   "done_job_ids": [], "done_attempts": []}, fetch="one")
    assert row is not None
    assert sql("SELECT count(*) FROM pg_prepared_statements WHERE name = 'cas_start_attempt'")[0][0] == 1
    sql("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does behind our back
    db._templates.clear()
    assert db.run("finish_attempt", {"job_id": str(job.id), "attempt": 1, "outcome": "succeeded",
                                     "status": "completed", "error": "", "traceback": ""}, fetch="count") == 1
    assert Job.objects.get(id=job.id).status == "completed"


def _start(job_id, attempt: int):
    from cron_at_scale import worker

    row = worker.AttemptWriter().start(str(job_id), attempt, "w")
    return None if row is None else (row[0], row[-1])  # (outcome, the attempt started)


def test_a_message_reaped_in_the_queue_runs_the_attempt_that_fired_it_again(dispatcher):
    """A backlog longer than the dispatch lease: attempt 1's message was still queued when its lease
    ran out, and the job fired again as attempt 2. Attempt 1's message, first in the queue, starts
    attempt 2 (the job runs now, not a whole queue later); attempt 2's own message is then skipped."""
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    expire_leases()  # not started: lost in the queue
    assert dispatcher.reap() == 1
    assert [c.attempt for c in dispatcher.claim()] == [2]
    assert _start(job.id, 1) == ("running", 2)
    assert _start(job.id, 2) is None  # its own message, later in the queue
    assert _start(job.id, 1) is None  # a redelivered copy of the first
    attempts = dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "outcome"))
    assert attempts == {1: "lost", 2: "running"}


def test_only_a_message_lost_before_any_start_takes_over(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    expire_leases(started=True)  # attempt 1 ran, and its worker died
    assert dispatcher.reap() == 1
    dispatcher.claim()
    assert _start(job.id, 1) is None  # a redelivery of the dead run's message runs nothing
    assert _start(job.id, 2) == ("running", 2)


def test_a_reaped_cron_runs_message_takes_over_the_same_occurrence_only(dispatcher):
    job = cron_at_scale.schedule(noop, cron="* * * * * *", overlap="allow")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '1 second', occurrence_at = "
        "statement_timestamp() - interval '1 second'")
    # no look-ahead: with overlap allow it would also fire the next second's occurrence early
    Dispatcher(name="t", lease=30, lookahead=0.0).claim()  # occurrence t: attempt 1
    expire_leases()
    assert dispatcher.reap() == 1  # occurrence t fired again as attempt 2
    # the look-ahead may have claimed the next second's occurrence: make it past, so that it may start
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = scheduled_at - interval '2 seconds'")
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = scheduled_at - interval '1 minute' WHERE attempt = 1")
    assert _start(job.id, 1) is None  # attempt 2 is another occurrence's run now: not attempt 1's to take
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = scheduled_at + interval '1 minute' WHERE attempt = 1")
    assert _start(job.id, 1) == ("running", 2)


def test_a_late_message_never_takes_over_a_retry_waiting_for_its_backoff(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    expire_leases()
    dispatcher.reap()  # attempt 1 lost in the queue
    dispatcher.claim()
    assert _start(job.id, 2) == ("running", 2)  # attempt 2 ran, failed, and is retried
    from cron_at_scale import sql as db

    db.run("retry_attempt", {"job_id": str(job.id), "attempt": 2, "error": "e", "traceback": "", "delay": 0.0},
           fetch="count")
    dispatcher.claim()  # attempt 3, the retry, dispatched
    assert _start(job.id, 1) is None  # attempt 1's message, redelivered late: attempt 2 started in between
    assert _start(job.id, 3) == ("running", 3)


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker: inside a transaction the error aborts it
def test_worker_statements_are_prepared_again_when_the_session_lost_them():
    from cron_at_scale import sql as db

    job = cron_at_scale.schedule(noop)
    Dispatcher(name="p").claim()
    assert db.run("heartbeat", {"lease": 60.0, "job_ids": [], "attempts": []}) == []  # prepared: cas_heartbeat
    assert db.run("start_attempt", {"job_id": str(job.id), "attempt": 1, "worker": "w", "token": None, "fire_at": None, "lease": 60.0,
                                    "done_job_ids": [], "done_attempts": []}, fetch="one")[0] == "running"
    sql("DEALLOCATE ALL")  # a pooler's DISCARD ALL, behind our back: our cache still says prepared
    assert db.run("finish_attempt", {"job_id": str(job.id), "attempt": 1, "outcome": "succeeded",
                                     "status": "completed", "error": "", "traceback": ""}, fetch="count") == 1
    assert Job.objects.get(id=job.id).status == "completed"


def test_the_reaper_runs_on_its_own_interval_and_publishes_through_its_caller(dispatcher):
    """The reaper as a service of its own: a pass only once ``interval`` seconds have passed, and a lost
    cron run's new attempt goes out through the ``publish`` it was given."""
    from cron_at_scale.maintenance.reaper import Reaper

    job = cron_at_scale.schedule(noop, cron="* * * * * *", overlap="allow")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '1 second', occurrence_at = "
        "statement_timestamp() - interval '1 second'")
    Dispatcher(name="t", lease=30, lookahead=0.0).claim()  # attempt 1 (no look-ahead: no early second run)
    sent = []
    reaper = Reaper(sent.extend, dispatcher.app, lease=30, batch_size=10, interval=60)
    assert reaper.maybe_reap(now=1000.0) == 0  # the first pass: nothing expired yet
    expire_leases()
    assert reaper.maybe_reap(now=1059.0) == 0  # not due: the lease stays expired
    assert reaper.maybe_reap(now=1060.0) == 1
    assert [(c.job_id, c.attempt) for c in sent] == [(job.id, 2)]
    assert dispatcher.published == []  # the dispatcher's own publisher was not used


def _explained(picks, plans: list):
    """A Django ``execute_wrapper``: each statement ``picks(sql)`` chooses is first run under
    ``EXPLAIN (ANALYZE, BUFFERS)`` in a savepoint rolled back (its plan appended to ``plans``),
    then as sent."""
    def explain(execute, query, params, many, context):
        if picks(query):
            execute("SAVEPOINT explained", None, False, context)
            execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, many, context)
            plans.append(context["cursor"].fetchone()[0][0])
            execute("ROLLBACK TO SAVEPOINT explained", None, False, context)
        return execute(query, params, many, context)
    return explain


def test_the_reapers_refire_of_a_lost_cron_run_reads_little_whatever_the_jobs_history(dispatcher):
    # A cron job with 100,000 attempts behind it loses a run while it runs: the re-fire (refire_cron,
    # inside reap()'s transaction, row locks held) must not read the job's history (a count of the
    # occurrence's lost runs over every attempt took 27 ms at 300,000 attempts; the count is now
    # carried on the attempt rows). EXPLAIN (ANALYZE, BUFFERS) of the statement as reap() sends it.
    from django.db import connection

    job = cron_at_scale.schedule(noop, cron="* * * * *")
    sql("""INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at,
                                                finished_at, outcome)
           SELECT %s, g, now() - g * interval '1 minute', now(), now(), now(), 'succeeded'
           FROM generate_series(1, 100000) AS g""", [job.id])
    sql("UPDATE cron_at_scale_job SET attempts = 100000, fire_at = statement_timestamp() - interval '1 second', "
        "occurrence_at = statement_timestamp() - interval '1 second'")
    sql("ANALYZE cron_at_scale_jobattempt")
    dispatcher.claim()
    expire_leases(started=True)
    plans: list = []
    refire_cron = lambda q: "lost_attempts = j.lost_attempts + CASE" in q and "schedule_type <> 'once'" in q  # noqa: E731
    with connection.execute_wrapper(_explained(refire_cron, plans)):
        assert dispatcher.reap() == 1
    assert [c.attempt for c in dispatcher.published] == [100002]  # fired again
    assert plans[0]["Plan"]["Shared Hit Blocks"] + plans[0]["Plan"].get("Shared Read Blocks", 0) < 100, plans[0]


def test_the_reaper_reads_the_unfinished_attempts_not_the_table(dispatcher):
    # No index holds locked_until (a start and a heartbeat stay HOT updates): the reaper reads the
    # unfinished attempts through their partial index and tests each lease. Beside 100,000
    # finished attempts, the rows it reads stay those of the few in flight. EXPLAIN (ANALYZE,
    # BUFFERS) of the statement as reap() sends it.
    from django.db import connection

    old = cron_at_scale.schedule(noop, cron="* * * * *")
    sql("""INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at,
                                                finished_at, outcome, locked_until)
           SELECT %s, g, now() - g * interval '1 minute', now(), now(), now(), 'succeeded',
                  now() - g * interval '1 minute'
           FROM generate_series(1, 100000) AS g""", [old.id])
    sql("UPDATE cron_at_scale_job SET attempts = 100000, fire_at = now() + interval '1 hour' WHERE id = %s", [old.id])
    jobs = [cron_at_scale.schedule(noop) for _ in range(3)]
    dispatcher.claim()
    expire_leases()
    sql("ANALYZE cron_at_scale_jobattempt")
    plans: list = []
    reap = lambda q: "SET outcome = 'lost'" in q and "ORDER BY locked_until" in q  # noqa: E731
    with connection.execute_wrapper(_explained(reap, plans)):
        assert dispatcher.reap() == 3
    assert {j.status for j in Job.objects.filter(id__in=[j.id for j in jobs])} == {"pending"}  # to fire again
    scans = list(_scans(plans[0]["Plan"]))
    assert scans, plans[0]
    for node in scans:  # rows, not buffers: earlier tests' rolled-back attempts leave dead index entries
        read = node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
        assert read < 100, (node["Node Type"], node.get("Index Name"), read, plans[0])


def _scans(node: dict):
    """The plan's reads of the attempt table (its scans, below any sort or lock)."""
    if node.get("Relation Name") == "cron_at_scale_jobattempt" and "Scan" in node["Node Type"]:
        yield node
    for child in node.get("Plans", ()):
        yield from _scans(child)
