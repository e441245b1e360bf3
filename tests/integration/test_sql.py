"""The promises of the attempt log, statement by statement on PostgreSQL: a success is never discarded,
nothing starts before its fire_at, a retried start runs its own attempt, and the dispatcher's
bookkeeping survives requeues, pauses and shard handovers. (PostgreSQL crashes: tests/faults.)"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import psycopg2
import pytest
from demo.tasks import noop
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale import conf, worker
from cron_at_scale import sql as db
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.worker import attempts

pytestmark = pytest.mark.django_db


@pytest.fixture
def dispatcher(monkeypatch):
    monkeypatch.setattr("cron_at_scale.broker.dlq.announce", lambda *a: None)
    d = Dispatcher(name="t", lease=30, lookahead=0, publisher=RecordingPublisher())
    d.published = d.publisher.published
    return d


def expire(job_id, attempt):
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second' "
        "WHERE job_id = %s AND attempt = %s", [job_id, attempt])


def start(job_id, attempt: int, token: str | None = None):
    return db.run("start_attempt", {"job_id": str(job_id), "attempt": attempt, "worker": "w", "token": token, "fire_at": None,
                                    "lease": 60.0, "done_job_ids": [], "done_attempts": []}, fetch="one")


def outcomes(job_id):
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt").values_list("outcome", flat=True))


# -- a success is never discarded ---------------------------------------------------------------


def test_the_success_of_a_run_reaped_while_it_stalled_completes_its_job(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    writer = worker.AttemptWriter()
    assert writer.start(str(job.id), 1, "w")[0] == "running"
    for attempt in (1, 2, 3):  # stalls longer than RUN_LEASE, each reaped and fired again
        expire(job.id, attempt)
        assert dispatcher.reap() == 1
        assert len(dispatcher.claim()) == 1
        if attempt < 3:
            assert writer.start(str(job.id), attempt + 1, "w")[0] == "running"
    writer.write_now(str(job.id), 1)  # the first run, resumed, returns
    row = Job.objects.get(id=job.id)
    assert row.status == "completed"
    assert outcomes(job.id) == ["succeeded", "lost", "lost", "dispatched"]
    # the run fired again after the success is not run: its job is done
    assert writer.start(str(job.id), 4, "w")[0] == "skipped"
    assert outcomes(job.id)[-1] == "skipped"


def test_a_job_failed_for_lost_runs_is_completed_when_one_of_them_returns(dispatcher, settings):
    settings.CRON_AT_SCALE = {"MAX_LOST_ATTEMPTS": 2}
    dispatcher.max_lost = 2
    job = cron_at_scale.schedule(noop)
    writer = worker.AttemptWriter()
    for attempt in (1, 2):
        dispatcher.claim()
        writer.start(str(job.id), attempt, "w")
        expire(job.id, attempt)
        dispatcher.reap()
    assert Job.objects.get(id=job.id).status == "failed"
    writer.write_now(str(job.id), 2)
    assert Job.objects.get(id=job.id).status == "completed"


def test_a_running_task_learns_that_its_lease_was_lost(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    writer = worker.AttemptWriter()
    row = writer.start(str(job.id), 1, "w")
    ctx = worker.JobContext(job.id, 1, row[1], "once", 0, 3)
    writer.add(ctx)
    try:
        writer.beat()
        assert not ctx.lease_lost
        expire(job.id, 1)
        dispatcher.reap()
        writer.beat()
        assert ctx.lease_lost and not ctx.cancel_requested
    finally:
        writer.remove(ctx)
        writer.stop()


# -- nothing starts before its fire_at --------------------------------------------------------


def test_settings_that_would_fire_early_are_refused_naming_both(settings):
    settings.CRON_AT_SCALE = {"LOOKAHEAD": 5.0, "DISPATCH_LEASE": 5.0}
    problems = conf.problems()
    assert any("LOOKAHEAD" in p and "DISPATCH_LEASE" in p for p in problems), problems
    with pytest.raises(ImproperlyConfigured, match="DISPATCH_LEASE"):
        Dispatcher(name="x")
    settings.CRON_AT_SCALE = {}
    with pytest.raises(ImproperlyConfigured, match="LOOKAHEAD"):
        Dispatcher(name="x", lookahead=2.0, lease=1.0)
    settings.CRON_AT_SCALE = {"HEARTBEAT_INTERVAL": 60.0, "RUN_LEASE": 60.0}
    assert any("HEARTBEAT_INTERVAL" in p and "RUN_LEASE" in p for p in conf.problems())


def test_eta_lead_longer_than_the_lookahead_or_the_lease_is_refused_naming_both(settings):
    settings.CRON_AT_SCALE = {"ETA_LEAD": 2.0, "LOOKAHEAD": 1.0}
    assert any("ETA_LEAD" in p and "LOOKAHEAD" in p for p in conf.problems())
    with pytest.raises(ImproperlyConfigured, match="ETA_LEAD"):
        Dispatcher(name="x")
    settings.CRON_AT_SCALE = {"ETA_LEAD": 5.0, "LOOKAHEAD": 5.0, "DISPATCH_LEASE": 5.0}
    assert any("ETA_LEAD" in p and "DISPATCH_LEASE" in p for p in conf.problems())
    settings.CRON_AT_SCALE = {"ETA_LEAD": -1}
    assert any("ETA_LEAD" in p for p in conf.problems())
    settings.CRON_AT_SCALE = {}
    with pytest.raises(ImproperlyConfigured, match="ETA_LEAD"):
        Dispatcher(name="x", lookahead=0.5, eta_lead=0.6)
    assert Dispatcher(name="x", lookahead=0).eta_lead == 0  # a look-ahead given bounds the setting's lead
    assert Dispatcher(name="x").eta_lead == 1.0  # by default: 1 s, or the look-ahead if shorter
    settings.CRON_AT_SCALE = {"LOOKAHEAD": 0.5, "DISPATCH_LEASE": 1.0}
    assert conf.problems() == [] and Dispatcher(name="x").eta_lead == 0.5


def test_a_start_before_its_fire_at_by_the_database_clock_is_refused_and_says_how_early(dispatcher):
    # A message published ETA_LEAD ahead, run by a worker whose clock is ahead: nothing starts.
    job = cron_at_scale.schedule(noop, countdown=2)
    assert len(Dispatcher(name="t2", lookahead=3).claim()) == 1
    row = start(job.id, 1)
    assert row.outcome == "early" and 1.0 < row.early_by <= 2.0 and row.attempt == 1
    assert outcomes(job.id) == ["dispatched"]
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = statement_timestamp() - interval '1 ms'")
    assert start(job.id, 1).outcome == "running"  # due now: it starts


def test_a_run_held_for_its_fire_at_has_a_lease_that_counts_from_it():
    job = cron_at_scale.schedule(noop, countdown=0.9)
    runs = Dispatcher(name="t", lease=1.0, lookahead=0.95).claim()
    assert [r.job_id for r in runs] == [job.id]
    (locked_until, fire_at), = sql("SELECT a.locked_until, j.fire_at FROM cron_at_scale_jobattempt a "
                                   "JOIN cron_at_scale_job j ON j.id = a.job_id")
    assert locked_until >= fire_at + timedelta(seconds=1.0)


def test_a_run_reaped_before_its_fire_at_is_not_due_again_before_it(dispatcher):
    job = cron_at_scale.schedule(noop, countdown=30)
    d = Dispatcher(name="t2", lease=40, lookahead=35)
    assert len(d.claim()) == 1
    expire(job.id, 1)  # however its lease ran out
    assert dispatcher.reap() == 1
    row = Job.objects.get(id=job.id)
    assert row.status == "pending" and row.fire_at == job.fire_at
    assert dispatcher.claim() == []  # not due: nothing fires early


def test_a_lost_recurring_run_fires_again_no_earlier_than_its_occurrence(dispatcher):
    job = cron_at_scale.schedule(noop, cron="* * * * *")
    d = Dispatcher(name="t2", lease=70, lookahead=60)
    runs = d.claim()
    assert len(runs) == 1 and runs[0].fire_at > job.created_at
    (locked_until,), = sql("SELECT locked_until FROM cron_at_scale_jobattempt")
    assert locked_until >= runs[0].fire_at + timedelta(seconds=70)


# -- a start retried after its reply was lost ----------------------------------------------


def test_a_start_retried_after_its_commit_runs_its_attempt_and_a_duplicate_is_still_skipped(dispatcher):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    token = "00000000-0000-4000-8000-000000000001"
    assert start(job.id, 1, token)[0] == "running"
    # the first try committed but its reply was lost: the retry, with the same token, runs it
    again = start(job.id, 1, token)
    assert again is not None and again[0] == "running" and again[-1] == 1
    assert start(job.id, 1, "00000000-0000-4000-8000-000000000002") is None  # another delivery: skipped
    assert start(job.id, 1) is None


def test_a_start_whose_reply_is_lost_is_retried_by_the_writer_and_runs(dispatcher, monkeypatch):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    real_fetch, cut = db._fetch, []

    def reply_lost(cur, fetch, *name):
        if not cut:
            cut.append(1)
            raise db.OperationalError("server closed the connection unexpectedly")  # after the commit
        return real_fetch(cur, fetch, *name)

    monkeypatch.setattr(db, "_fetch", reply_lost)
    monkeypatch.setattr(db, "reset_connection", lambda: None)
    row = worker.AttemptWriter().start(str(job.id), 1, "w")
    assert cut and row is not None and row[0] == "running"


# -- the dispatcher's bookkeeping -------------------------------------------------------------


def test_requeue_resets_the_dispatch_lease_back_off(dispatcher):
    job = cron_at_scale.schedule(noop)
    for attempt in (1, 2, 3, 4):  # four messages lost before any worker started them
        dispatcher.claim()
        expire(job.id, attempt)
        dispatcher.reap()
    sql("UPDATE cron_at_scale_job SET status = 'failed' WHERE id = %s", [job.id])
    assert cron_at_scale.requeue(job.id) == 1
    dispatcher.claim()
    (lease,), = sql("SELECT extract(epoch FROM a.locked_until - a.dispatched_at) FROM cron_at_scale_jobattempt a "
                    "WHERE job_id = %s AND attempt = 5", [job.id])
    assert 29 <= float(lease) <= 31  # one DISPATCH_LEASE, not 16


def test_a_paused_recurring_jobs_lost_run_fires_again(dispatcher):
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '1 second', "
        "occurrence_at = occurrence_at - interval '1 second' WHERE id = %s", [job.id])
    assert len(dispatcher.claim()) == 1
    cron_at_scale.pause(job.id)
    expire(job.id, 1)
    dispatcher.published.clear()
    assert dispatcher.reap() == 1
    assert [(r.job_id, r.attempt) for r in dispatcher.published] == [(job.id, 2)]
    assert outcomes(job.id) == ["lost", "dispatched"]


@pytest.mark.django_db(transaction=True)
def test_the_overlap_check_sees_a_run_committed_after_the_claims_snapshot(monkeypatch):
    # A peer dispatcher (a shard handover) commits a run of the job between the claim statement's
    # snapshot and its row lock. Emulated: the run is committed from another connection right after
    # the claim statement, while the claim's transaction still holds the row.
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '1 second', "
        "occurrence_at = occurrence_at - interval '1 second' WHERE id = %s", [job.id])
    params = connection.get_connection_params()
    peer = psycopg2.connect(**{k: v for k, v in params.items() if k in ("host", "port", "user", "password", "dbname",
                                                                      "database")})
    peer.autocommit = True
    real_run = db.run

    def run(name, *a, **kw):
        out = real_run(name, *a, **kw)
        if name == "claim":
            with peer.cursor() as cur:
                cur.execute("INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, "
                            "locked_until, outcome, worker, error, traceback) VALUES (%s, 99, now(), now(), "
                            "now() + interval '1 minute', 'running', 'peer', '', '')", [str(job.id)])
        return out

    monkeypatch.setattr(db, "run", run)
    try:
        runs = Dispatcher(name="t", lookahead=0, publisher=RecordingPublisher()).claim()
    finally:
        peer.close()
    assert runs == []
    assert Job.objects.get(id=job.id).skipped_occurrences == 1


def test_a_start_keeps_trying_through_a_database_outage(dispatcher, monkeypatch):
    job = cron_at_scale.schedule(noop)
    dispatcher.claim()
    real_fetch, cuts = db._fetch, []

    def outage(cur, fetch, *name):
        if len(cuts) < 4:  # more failures than one statement's own reconnect covers
            cuts.append(1)
            raise db.OperationalError("the database system is starting up")
        return real_fetch(cur, fetch, *name)

    monkeypatch.setattr(db, "_fetch", outage)
    monkeypatch.setattr(db, "reset_connection", lambda: None)
    monkeypatch.setattr(attempts.time, "sleep", lambda s: None)
    row = worker.AttemptWriter().start(str(job.id), 1, "w")
    assert len(cuts) == 4 and row is not None and row[0] == "running"


# -- the state machine, walked at random ----------------------------------------------------------
#
# Each step is one transition of docs/state_machine.md, made by the statement the code runs for it,
# on a random job: the claim, a start (of any attempt: a redelivered or stale message too), a
# success (also of a run reaped meanwhile), a retry, a failure, a cancel, a requeue, a lease that
# ran out and the reaper, a pending job made due. After every step the two tables are checked
# against each other. The walk is seeded: a failure names its seed and step, and repeats.

WALK_JOBS, WALK_STEPS = 12, 200


def _walk_violations(job_ids) -> list[str]:
    """Every way the job rows and their attempt rows disagree with the state machine's rules."""
    rows = sql("""
        SELECT j.id::text, j.status, j.attempts,
               coalesce(max(a.attempt), 0),
               count(*) FILTER (WHERE a.outcome IN ('dispatched', 'running')),
               count(*) FILTER (WHERE a.outcome = 'succeeded'),
               max(a.attempt) FILTER (WHERE a.outcome IN ('dispatched', 'running')),
               count(a.attempt) - count(DISTINCT a.attempt)
          FROM cron_at_scale_job j LEFT JOIN cron_at_scale_jobattempt a ON a.job_id = j.id
         WHERE j.id = ANY(%s::uuid[])
         GROUP BY j.id""", [[str(j) for j in job_ids]])
    out = []
    for job_id, status, attempts_col, top, open_, succeeded, open_number, repeated in rows:
        where = f"job {job_id[:8]} ({status})"
        if status not in ("pending", "in_progress", "completed", "failed", "cancelled"):
            out.append(f"{where}: a one-off job in status {status}")
        if attempts_col != top:
            out.append(f"{where}: attempts = {attempts_col}, but its highest attempt row is {top}")
        if repeated:
            out.append(f"{where}: an attempt number used twice")
        if open_ > 1:
            out.append(f"{where}: {open_} attempts open at once")
        if status in ("pending", "failed") and open_:
            out.append(f"{where}: an attempt still open")
        if status == "in_progress" and (open_ != 1 or open_number != attempts_col):
            out.append(f"{where}: {open_} open attempts (newest {open_number}), not its attempt {attempts_col}")
        if (status == "completed") != (succeeded > 0):
            out.append(f"{where}: {succeeded} succeeded attempts")
    return out


# The transitions of docs/state_machine.md's tables for a one-off job and its attempts: a status or an
# outcome changes only along one of them (a status not named here never changes).
_JOB_EDGES = {
    "pending": {"in_progress", "cancelled", "completed"},
    "in_progress": {"completed", "pending", "failed", "cancelled"},
    "failed": {"pending", "completed"},
}
_ATTEMPT_EDGES = {
    "dispatched": {"running", "lost", "cancelled", "skipped"},
    "running": {"succeeded", "failed", "cancelled", "retried", "lost"},
    "lost": {"succeeded", "cancelled"},  # a run reaped while it stalled returns (its job cancelled meanwhile: cancelled)
}


def _walk_snapshot(job_ids) -> dict:
    ids = [str(j) for j in job_ids]
    jobs = {("job", j): s for j, s in sql("SELECT id::text, status FROM cron_at_scale_job WHERE id = ANY(%s::uuid[])",
                                          [ids])}
    return {**jobs, **{("attempt", j, n): o for j, n, o in sql(
        "SELECT job_id::text, attempt, outcome FROM cron_at_scale_jobattempt WHERE job_id = ANY(%s::uuid[])", [ids])}}


def _walk_moves(before: dict, after: dict) -> list[str]:
    """The changes of status or outcome from ``before`` to ``after`` that are no transition of the tables."""
    out = []
    for key, was in before.items():
        now = after.get(key)
        edges = _JOB_EDGES if key[0] == "job" else _ATTEMPT_EDGES
        if now != was and now not in edges.get(was, set()):
            out.append(f"{key[0]} {key[1][:8]}{'/' + str(key[2]) if len(key) > 2 else ''}: {was} -> {now}")
    out += [f"attempt {k[1][:8]}/{k[2]} new as {o}" for k, o in after.items()
            if k not in before and k[0] == "attempt" and o != "dispatched"]
    return out


def _open_attempts():
    return sql("SELECT job_id::text, attempt, outcome FROM cron_at_scale_jobattempt "
               "WHERE outcome IN ('dispatched', 'running') ORDER BY job_id, attempt")


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_random_walk_of_transitions_keeps_jobs_and_attempts_in_step(dispatcher, settings, seed):
    settings.CRON_AT_SCALE = {"MAX_LOST_ATTEMPTS": 2}
    dispatcher.max_lost = 2
    rng = random.Random(seed)
    done: list[str] = []
    jobs = [str(cron_at_scale.schedule(noop).id) for _ in range(WALK_JOBS)]
    writer = worker.AttemptWriter()
    began: dict[tuple[str, int], str] = {}  # runs going on: (job, attempt) -> the token its start returned running for
    ever: dict[tuple[str, int], str] = {}  # the same, for every run begun
    tokens: list[tuple[str, int, str]] = []  # every start made: a later one may repeat its message

    def start():
        attempts_rows = sql("SELECT job_id::text, attempt FROM cron_at_scale_jobattempt ORDER BY job_id, attempt")
        if not attempts_rows:
            return "start: none"
        if tokens and rng.random() < 0.25:  # the same message again (a redelivery, a retried start)
            job_id, attempt, token = rng.choice(tokens)
        else:
            (job_id, attempt), token = rng.choice(attempts_rows), str(uuid.uuid4())
        row = writer.start(job_id, attempt, "w", token)
        tokens.append((job_id, attempt, token))
        if row is not None and row.outcome == "running":
            # the attempt it began: a message whose attempt was reaped unstarted takes over the next
            attempt = row.attempt
            first = ever.setdefault((job_id, attempt), token)
            began[(job_id, attempt)] = token
            assert first == token, f"seed {seed}: attempt {attempt} of {job_id} began under two tokens"
        return f"start {job_id[:8]}/{attempt}: {None if row is None else row.outcome}"

    def end(kind):
        # a run that began ends: also one reaped meanwhile (its late success or failure)
        if not began:
            return f"{kind}: none"
        job_id, attempt = rng.choice(sorted(began))
        del began[(job_id, attempt)]  # a run ends once
        params = {"job_id": job_id, "attempt": attempt, "error": "boom", "traceback": ""}
        if kind == "succeed":
            writer.write_now(job_id, attempt)
            ((status,),) = sql("SELECT status FROM cron_at_scale_job WHERE id = %s", [job_id])
            assert status in ("completed", "cancelled"), \
                f"seed {seed}: the success of {job_id}/{attempt} was discarded: the job is {status}"
        elif kind == "retry":
            attempts.write_retry(params, rng.choice([0.0, 3600.0]))
        else:
            attempts.write_failure(params)
        return f"{kind} {job_id[:8]}/{attempt}"

    def reap():
        open_rows = _open_attempts()
        if not open_rows:
            return "reap: none"
        job_id, attempt, _ = rng.choice(open_rows)
        expire(job_id, attempt)
        return f"reap {job_id[:8]}/{attempt}: {dispatcher.reap()}"

    def make_due():
        job_id = rng.choice(jobs)
        sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() WHERE id = %s AND status = 'pending'",
            [job_id])
        return f"due {job_id[:8]}"

    steps = {
        "claim": lambda: f"claim: {len(dispatcher.claim())}",
        "start": start,
        "succeed": lambda: end("succeed"),
        "retry": lambda: end("retry"),
        "fail": lambda: end("fail"),
        # a job with a run going on, four times as likely as another: its run then ends after the cancel
        "cancel": lambda: f"cancel: {cron_at_scale.cancel(rng.choice(jobs + [j for j, _ in sorted(began)] * 4))}",
        "requeue": lambda: f"requeue: {cron_at_scale.requeue(rng.choice(jobs))}",
        "reap": reap,
        "due": make_due,
    }
    weights = {"claim": 4, "start": 5, "succeed": 2, "retry": 2, "fail": 1, "cancel": 2, "requeue": 1,
               "reap": 2, "due": 2}
    names = list(steps)
    seen: set[str] = set()  # every status a job was in after some step
    before = _walk_snapshot(jobs)
    for step in range(WALK_STEPS):
        name = rng.choices(names, [weights[n] for n in names])[0]
        done.append(steps[name]())
        after = _walk_snapshot(jobs)
        problems = _walk_violations(jobs) + _walk_moves(before, after)
        before = after
        seen.update(v for k, v in after.items() if k[0] == "job")
        assert not problems, f"seed {seed}, step {step}: {problems}\nsteps: {done[-12:]}"
    assert seen >= {"pending", "in_progress", "completed"} and seen & {"failed", "cancelled"}, \
        f"seed {seed}: the walk reached only {seen}"
