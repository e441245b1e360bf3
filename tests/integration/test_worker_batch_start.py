"""Batched starts: one ``start_attempts`` for the messages a worker's main process received
together keeps every rule of a pool process's own start; handed back, a start is undone."""

from __future__ import annotations

import time
from datetime import datetime
from uuid import uuid4

import pytest
from demo.tasks import noop
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale import sql as db
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.worker import attempts, batch_start
from cron_at_scale.worker.middleware.base import Run, SkipJob
from cron_at_scale.worker.middleware.start import IdempotentStart

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _lease_threads_stopped(monkeypatch):
    """Every ``Waiting`` a test makes has its lease thread (and that thread's connection) ended after it."""
    made: list = []
    real_init = batch_start.Waiting.__init__

    def init(self):
        real_init(self)
        made.append(self)
    monkeypatch.setattr(batch_start.Waiting, "__init__", init)
    yield
    for waiting in made:
        waiting.thread_host.stop()


def claimed(n: int) -> list[tuple[str, int]]:
    """n one-off jobs claimed (their messages not sent): [(job_id, attempt)]."""
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(n)])
    runs = Dispatcher(name="t", shards="all", publisher=RecordingPublisher(), hold_unconsumed=False).claim()
    assert len(runs) == n
    return [(str(r.job_id), r.attempt) for r in runs]


def token() -> str:
    return str(uuid4())


def attempt_of(job_id: str, attempt: int = 1) -> JobAttempt:
    return JobAttempt.objects.get(job_id=job_id, attempt=attempt)


def test_one_statement_starts_a_batch_by_the_rules_of_a_single_start(monkeypatch):
    fresh, twice, cancelled, redelivered, expired, early = claimed(6)
    assert cron_at_scale.cancel(cancelled[0])
    assert attempts.write(redelivered[0], 1, "w", token(), []) is not None  # started by an earlier delivery
    sql("UPDATE cron_at_scale_job SET options = '{\"expires\": 1}' WHERE id = %s", [expired[0]])
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = statement_timestamp() - interval '5 seconds' "
        "WHERE job_id = %s", [expired[0]])
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = statement_timestamp() + interval '30 seconds' "
        "WHERE job_id = %s", [early[0]])
    statements = []
    real_run = db.run
    monkeypatch.setattr(db, "run", lambda name, *a, **k: statements.append(name) or real_run(name, *a, **k))
    batch = [(*fresh, token()), (*twice, token()), (*twice, token()), (*cancelled, token()),
             (*redelivered, token()), (*expired, token()), (*early, token())]
    rows = {str(r.token): r for r in attempts.write_many(batch, "host:1")}
    assert statements == ["start_attempts"]
    by_job = {}
    for job_id, _, tok in batch:
        if tok in rows:
            by_job.setdefault(job_id, []).append(rows[tok])
    assert [r.outcome for r in by_job[fresh[0]]] == ["running"]
    assert [r.outcome for r in by_job[twice[0]]] == ["running"]  # two messages of one attempt: one starts it
    assert [r.outcome for r in by_job[cancelled[0]]] == ["cancelled"]
    assert redelivered[0] not in by_job  # already started: not to run
    assert [r.outcome for r in by_job[expired[0]]] == ["skipped"] and by_job[expired[0]][0].error.startswith("expired")
    (e,) = by_job[early[0]]
    assert e.outcome == "early" and 25 < e.early_by <= 30
    a = attempt_of(fresh[0])
    assert a.outcome == "running" and a.worker == "host:1" and str(a.run_token) == rows[batch[0][2]].token.__str__()
    assert a.locked_until is not None and a.started_at is not None
    assert Job.objects.get(id=expired[0]).status == "cancelled" and Job.objects.get(id=expired[0]).expired_runs == 1
    assert attempt_of(early[0]).outcome == "dispatched"  # not due: nothing changed
    # The row of a start carries what a pool process needs, as start_attempt's does.
    single = attempts.write(fresh[0], 1, "w", str(a.run_token), [])  # the same token: the same attempt, again
    assert single is not None and single.outcome == "running"
    assert set(single._fields) <= set(rows[batch[0][2]]._fields)


def test_a_started_row_stands_while_fresh_and_is_confirmed_after(monkeypatch):
    (job,) = claimed(1)
    tok = token()
    (row,) = attempts.write_many([(*job, tok)], "host:1")
    started = {"row": {k: v for k, v in row._asdict().items() if k != "token"}, "token": tok,
               "until": time.monotonic() + 60}
    statements = []
    real_run = db.run
    monkeypatch.setattr(db, "run", lambda name, *a, **k: statements.append(name) or real_run(name, *a, **k))

    class Task:
        class request:
            pass

    setattr(Task.request, batch_start.STARTED, started)
    start = IdempotentStart(attempts.BatchCompleter())
    run = Run(Task, {"job_id": job[0], "attempt": job[1]}, "host:2")
    start.before_run(run)
    assert statements == [] and run.row.outcome == "running"  # fresh: no statement
    started["until"] = time.monotonic() - 1  # it waited in the pool past FRESH
    run = Run(Task, {"job_id": job[0], "attempt": job[1]}, "host:2")
    start.before_run(run)
    assert statements == ["start_attempt"] and run.row.outcome == "running"  # confirmed under its token
    assert attempt_of(job[0]).worker == "host:2"
    sql("UPDATE cron_at_scale_jobattempt SET outcome = 'lost', finished_at = statement_timestamp() "
        "WHERE job_id = %s", [job[0]])  # reaped meanwhile
    with pytest.raises(SkipJob):
        start.before_run(Run(Task, {"job_id": job[0], "attempt": job[1]}, "host:2"))
    started.update(row=None, until=time.monotonic() + 60)  # the batch found it not to run
    statements.clear()
    with pytest.raises(SkipJob):
        start.before_run(Run(Task, {"job_id": job[0], "attempt": job[1]}, "host:2"))
    assert statements == []


def test_a_run_cancelled_or_expired_while_it_waited_past_its_batch_start_is_not_run():
    """The confirming start (a pool process begins the message after FRESH) checks what the batch's
    start checked: the task has not begun, so a cancel or an ``expires`` since then still holds."""
    cancelled, expired, kept = claimed(3)
    sql("UPDATE cron_at_scale_job SET options = '{\"expires\": 1}' WHERE id = %s", [expired[0]])
    toks = [token() for _ in range(3)]
    rows = attempts.write_many([(*cancelled, toks[0]), (*expired, toks[1]), (*kept, toks[2])], "host:1")
    assert sorted(r.outcome for r in rows) == ["running"] * 3
    assert cron_at_scale.cancel(cancelled[0])
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = statement_timestamp() - interval '5 seconds' "
        "WHERE job_id = %s", [expired[0]])  # it waited in the pool past its expires
    assert attempts.write(*cancelled, "host:2", toks[0], []).outcome == "cancelled"
    e = attempts.write(*expired, "host:2", toks[1], [])
    assert e.outcome == "skipped" and e.error.startswith("expired")
    assert attempts.write(*kept, "host:2", toks[2], []).outcome == "running"
    assert {attempt_of(j[0]).outcome for j in (cancelled, expired)} == {"cancelled", "skipped"}
    assert attempt_of(cancelled[0]).finished_at is not None and attempt_of(expired[0]).finished_at is not None
    assert Job.objects.get(id=expired[0]).expired_runs == 1


def test_started_messages_no_pool_process_began_are_handed_back_and_start_again():
    (a, b) = claimed(2)
    ta, tb = token(), token()
    rows = {str(r.token): r for r in attempts.write_many([(*a, ta), (*b, tb)], "host:1")}
    assert {r.outcome for r in rows.values()} == {"running"}

    class Request:  # Celery's request as the starter sees it: accepted once a pool process took it
        def __init__(self, pid):
            self.worker_pid = pid

    waiting = batch_start.Waiting()
    began, queued = Request(4242), Request(None)
    waiting.add(batch_start._WaitingRun(a[0], a[1], ta, began))
    waiting.add(batch_start._WaitingRun(b[0], b[1], tb, queued))
    waiting.thread_host.stop()
    assert waiting.hand_back() == 1
    assert attempt_of(a[0]).outcome == "running"  # a pool process has it: not touched
    back = attempt_of(b[0])
    assert back.outcome == "dispatched" and back.started_at is None and back.run_token is None
    again = attempts.write(b[0], b[1], "w", token(), [])  # its redelivered message starts it
    assert again is not None and again.outcome == "running"


def test_the_waiting_ones_leases_are_renewed_until_a_pool_process_accepts_them():
    (a, b) = claimed(2)
    ta, tb = token(), token()
    attempts.write_many([(*a, ta), (*b, tb)], "host:1")
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() + interval '1 second'")
    before = {str(x.job_id): x.locked_until for x in JobAttempt.objects.all()}

    class Request:
        def __init__(self, pid):
            self.worker_pid = pid

    waiting = batch_start.Waiting()
    keep = [Request(None), Request(4242)]
    waiting.add(batch_start._WaitingRun(a[0], a[1], ta, keep[0]))
    waiting.add(batch_start._WaitingRun(b[0], b[1], tb, keep[1]))
    waiting.thread_host.stop()
    waiting.beat()
    after = {str(x.job_id): x.locked_until for x in JobAttempt.objects.all()}
    assert (after[a[0]] - before[a[0]]).total_seconds() > 30  # RUN_LEASE from now
    assert after[b[0]] == before[b[0]]  # accepted: its pool process's heartbeat renews it
    assert list(waiting.heartbeat.running) == [(a[0], a[1])]


def test_a_message_goes_at_once_while_a_pool_slot_is_free_and_waits_for_others_while_busy():
    from celery.worker import state as worker_state
    from kombu.asynchronous import Hub, get_event_loop, set_event_loop

    from cron_at_scale.broker.message import HEADER

    (a, b, c, d, e) = claimed(5)

    class Request:  # Celery's request as the strategy hands it over
        def __init__(self, job):
            self.id = token()
            self.request_dict = {HEADER: {"job_id": job[0], "attempt": job[1]}}
            self.worker_pid = None

    handed: list = []
    starter = batch_start.BatchStarter()
    starter.waiting.thread_host.stop()
    ra, rb, rc, rd, rx = (Request(x) for x in (a, b, c, d, e))
    previous, hub = get_event_loop(), Hub()
    set_event_loop(hub)
    try:
        worker_state.reserved_requests.add(ra)
        starter.receive(handed.append, ra, slots=2)  # a free slot, nothing held: handed over now, unstarted
        assert handed == [ra]
        worker_state.reserved_requests.update([rb, rc])  # two pool slots, three reserved: busy
        starter.receive(handed.append, rb, slots=2)
        starter.receive(handed.append, rc, slots=2)
        assert handed == [ra]  # held for others
        time.sleep(batch_start.HOLD * 2)
        hub.fire_timers(propagate=(Exception,))
        assert handed == [ra, rb, rc]
        worker_state.reserved_requests.add(rd)
        starter.receive(handed.append, rd, slots=2)  # busy: held ...
        worker_state.reserved_requests.difference_update([ra, rb, rc])
        worker_state.reserved_requests.add(rx)
        starter.receive(handed.append, rx, slots=2)  # ... until a slot is free: the held one goes with it
        assert handed == [ra, rb, rc, rd, rx]
    finally:
        set_event_loop(previous)
        for r in (ra, rb, rc, rd, rx):
            worker_state.reserved_requests.discard(r)
    started = {str(x.job_id): x.started_at for x in JobAttempt.objects.all()}
    assert started[a[0]] is None and batch_start.started_of(ra) is None  # its pool process starts it
    assert started[b[0]] == started[c[0]] is not None  # b and c in one statement
    assert started[d[0]] == started[e[0]] and started[d[0]] not in (None, started[b[0]])  # d and e in the next
    assert all(batch_start.started_of(r)["row"]["outcome"] == "running" for r in (rb, rc, rd, rx))
    # The row handed to the pool process holds no datetime (its class may be replaced there: a faked
    # clock), and reads back as the row the statement returned.
    handed_row = batch_start.started_of(rb)
    assert not [k for k, v in handed_row["row"].items() if isinstance(v, datetime)]
    assert batch_start.fresh_row({**handed_row, "until": time.monotonic() + 60}).started_at == started[b[0]]


def test_a_held_batch_starts_once_messages_stop_coming_unless_others_wait_for_the_pool_ahead_of_it(monkeypatch):
    """Nothing waiting for a pool slot ahead of it: a batch is started once no message came for GAP,
    long before HOLD (it would otherwise wait while the pool could take it). Requests waiting ahead
    of it: it is held for HOLD, since it waits for them anyway and a larger batch costs less."""
    from celery.worker import state as worker_state
    from kombu.asynchronous import Hub, get_event_loop, set_event_loop

    from cron_at_scale.broker.message import HEADER

    monkeypatch.setattr(batch_start, "GAP", 0.02)
    monkeypatch.setattr(batch_start, "HOLD", 30.0)
    (a, b, c) = claimed(3)

    class Request:
        def __init__(self, job=None):
            self.id = token()
            self.request_dict = {HEADER: {"job_id": job[0], "attempt": job[1]}} if job else {}
            self.worker_pid = None

    handed: list = []
    starter = batch_start.BatchStarter()
    starter.waiting.thread_host.stop()
    running, waiting_ahead = Request(), Request()
    ra, rb, rc = Request(a), Request(b), Request(c)
    previous, hub = get_event_loop(), Hub()
    set_event_loop(hub)
    try:
        # one pool slot, running a task; nothing else waits for it
        worker_state.reserved_requests.update([running, ra])
        starter.receive(handed.append, ra, slots=1)
        assert handed == []
        time.sleep(0.06)  # past GAP, far from HOLD
        hub.fire_timers(propagate=(Exception,))
        assert handed == [ra]  # the messages stopped coming: started and handed over

        # the same, with a request waiting for the slot ahead of the batch
        worker_state.reserved_requests.update([waiting_ahead, rb])
        starter.receive(handed.append, rb, slots=1)
        worker_state.reserved_requests.add(rc)
        starter.receive(handed.append, rc, slots=1)
        time.sleep(0.06)
        hub.fire_timers(propagate=(Exception,))
        assert handed == [ra]  # quiet past GAP, but held: it would wait behind the other anyway
        monkeypatch.setattr(batch_start, "HOLD", 0.05)
        time.sleep(0.06)
        starter._linger(hub, starter.batch)  # the timer it left looks again once HOLD has passed
        assert handed == [ra, rb, rc]
    finally:
        set_event_loop(previous)
        for r in (running, waiting_ahead, ra, rb, rc):
            worker_state.reserved_requests.discard(r)
    started = {str(x.job_id): x.started_at for x in JobAttempt.objects.all()}
    assert started[a[0]] is not None and started[a[0]] != started[b[0]]
    assert started[b[0]] == started[c[0]] is not None  # b and c in one statement


def test_a_run_left_waiting_past_its_start_is_set_aside_so_the_worker_dying_costs_its_job_no_lost_attempt():
    from cron_at_scale.models import Job

    (a, b, c) = claimed(3)
    ta, tb, tc = token(), token(), token()
    by_token = {str(r.token): r for r in attempts.write_many([(*a, ta), (*b, tb), (*c, tc)], "host:1")}
    rows = {a[0]: by_token[ta], b[0]: by_token[tb], c[0]: by_token[tc]}

    class Request:
        def __init__(self, pid):
            self.worker_pid = pid

    from celery.worker import state as worker_state

    waiting = batch_start.Waiting()
    waiting.thread_host.stop()
    keep = [Request(None), Request(None), Request(None)]
    worker_state.reserved_requests.update(keep)  # reserved by Celery, not yet accepted by a pool process
    now = time.monotonic()
    try:
        waiting.add(batch_start._WaitingRun(a[0], a[1], ta, keep[0], rows[a[0]].started_at, now - 2 * batch_start.FRESH))
        waiting.add(batch_start._WaitingRun(b[0], b[1], tb, keep[1], rows[b[0]].started_at, now))  # still stands
        # c waited as long, but its pool process began it meanwhile and started it again (its own mark)
        waiting.add(batch_start._WaitingRun(c[0], c[1], tc, keep[2], rows[c[0]].started_at, now - 2 * batch_start.FRESH))
        time.sleep(0.01)
        again = attempts.write(c[0], c[1], "host:2", tc, [])
        assert again is not None and again.outcome == "running" and again.started_at > rows[c[0]].started_at
        assert waiting.set_aside() == 1
        assert waiting.set_aside() == 0  # each once
    finally:
        worker_state.reserved_requests.difference_update(keep)
    assert attempt_of(a[0]).started_at is None and attempt_of(a[0]).outcome == "running"
    assert attempt_of(b[0]).started_at == rows[b[0]].started_at
    assert attempt_of(c[0]).started_at == again.started_at

    # the whole worker dies: every lease runs out and the reaper takes them
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second'")
    assert Dispatcher(name="t", shards="all", publisher=RecordingPublisher(), hold_unconsumed=False).reap() == 3
    lost = {str(j.id): (j.lost_attempts, j.dispatch_losses, j.status) for j in Job.objects.all()}
    assert lost[a[0]] == (0, 1, "pending")  # set aside: lost before any pool process began it
    assert lost[b[0]][0] == 1 and lost[c[0]][0] == 1  # within FRESH of its start, or begun: counted


def test_a_pool_process_forked_while_the_lease_thread_holds_its_lock_boots():
    # Celery forks a new pool process whenever one exits (killed, max tasks per child), while the
    # main process's threads run on. A lock one of them held at the fork is held for good in the
    # child: its boot must not take the parent's locks, only make its own.
    import os
    import threading

    held, release = threading.Event(), threading.Event()

    def hold(lock):
        with lock:
            held.set()
            release.wait(30)

    threads = [threading.Thread(target=hold, args=(lock,), daemon=True)
               for lock in (batch_start.starter.lock, batch_start.starter.waiting.heartbeat.lock)]
    for t in threads:
        held.clear()
        t.start()
        assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the pool process: boot, and say so by the exit code (alarm: a hang ends it)
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler: a hang kills it
        signal.alarm(5)
        try:
            batch_start.BatchStarts().after_process_boot()
            batch_start.starter.waiting.clear()
            with batch_start.starter.lock:
                pass
        finally:
            os._exit(0 if signal.alarm(0) else 3)
    release.set()
    for t in threads:
        t.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked process hung at boot ({status})"


def test_a_waiting_run_celery_dropped_at_a_lost_broker_connection_is_handed_back_for_its_redelivery():
    """On a lost broker connection Celery drops every reserved request no pool process accepted
    (they will be redelivered), while a reference may keep the request object alive. Its run must
    not stay started, its lease renewed for good, with the redelivered message finding it taken:
    once its batch's start no longer stands it is handed back, and the redelivery starts it.
    A request still reserved keeps waiting, its lease renewed."""
    from celery.worker import state as worker_state

    (a, b) = claimed(2)
    ta, tb = token(), token()
    by_token = {str(r.token): r for r in attempts.write_many([(*a, ta), (*b, tb)], "host:1")}

    class Request:
        worker_pid = None

    dropped, reserved = Request(), Request()  # both alive (referenced here)
    worker_state.reserved_requests.add(reserved)
    waiting = batch_start.Waiting()
    waiting.thread_host.stop()
    past = time.monotonic() - 2 * batch_start.FRESH
    try:
        waiting.add(batch_start._WaitingRun(a[0], a[1], ta, dropped, by_token[ta].started_at, past))
        waiting.add(batch_start._WaitingRun(b[0], b[1], tb, reserved, by_token[tb].started_at, past))
        waiting.beat()
    finally:
        worker_state.reserved_requests.discard(reserved)
    assert (attempt_of(a[0]).outcome, attempt_of(a[0]).started_at, attempt_of(a[0]).run_token) == ("dispatched", None, None)
    assert attempt_of(b[0]).outcome == "running" and str(attempt_of(b[0]).run_token) == tb
    assert list(waiting.heartbeat.running) == [tuple(b)]  # only the reserved one is still renewed
    redelivered = attempts.write(a[0], a[1], "host:2", token(), [])
    assert redelivered is not None and redelivered.outcome == "running"
