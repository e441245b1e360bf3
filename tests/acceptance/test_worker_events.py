"""What Flower and ``celery events`` see: a real ``celery worker -E`` and dispatcher, its events read
from the broker by Celery's own ``Receiver`` into ``celery.events.state.State`` (what both monitors
are built on). Every attempt, a Celery task ``<job id>:<attempt>``, ends in its real final state;
none stays STARTED."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import pytest
from celery import states
from celery.events.state import State
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import JobAttempt, task_id_for

pytestmark = pytest.mark.acceptance


@contextmanager
def monitor(app):
    """A monitor's view: Celery's ``Receiver`` on the broker's event exchange feeding a ``State``,
    as Flower and ``celery events`` do; yields ``(state, seen)``, ``seen`` the task events by
    task id, in the order received."""
    state = State()
    seen: dict[str, list[str]] = {}

    def on_event(event):
        state.event(event)
        if event["type"].startswith("task-"):
            seen.setdefault(event["uuid"], []).append(event["type"])

    conn = app.connection_for_read()
    receiver = app.events.Receiver(conn, handlers={"*": on_event})
    thread = threading.Thread(target=receiver.capture, kwargs={"wakeup": False}, daemon=True)
    thread.start()
    time.sleep(1.0)  # bound to the event exchange before any worker starts (a worker takes longer)
    try:
        yield state, seen
    finally:
        receiver.should_stop = True
        thread.join(5)
        conn.release()


def final(state: State, task_id: str) -> str | None:
    task = state.tasks.get(task_id)
    return task.state if task is not None else None


def attempts(job) -> dict[int, str]:
    return dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "outcome"))


def test_each_attempt_ends_in_its_real_state_in_a_monitor(system):
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps({"HEARTBEAT_INTERVAL": 0.2, "MAX_QUEUE_WAIT": 0})
    with monitor(system.app) as (state, seen):
        system.worker("w1", concurrency=1, extra=["-E"])
        system.dispatcher("d1")
        wait_for_workers(system.app, ["w1"])

        # A running job, then two queued behind it on the one pool process: one cancelled before it
        # starts, one whose expires (1 s) passes while it waits.
        running = cron_at_scale.schedule("demo.tasks.sleep", kwargs={"seconds": 30})
        wait_until(lambda: attempts(running) == {1: "running"}, what="the sleeper to start")
        doomed = cron_at_scale.schedule("demo.tasks.record")
        stale = cron_at_scale.schedule("demo.tasks.record", expires=1)
        # queued: still as claimed, or started in a batch by the worker's main process (BATCH_STARTS)
        queued = ({1: "dispatched"}, {1: "running"})
        wait_until(lambda: attempts(doomed) in queued and attempts(stale) in queued, what="both queued behind it")
        assert cron_at_scale.cancel(doomed.id)
        time.sleep(1.5)
        assert cron_at_scale.cancel(running.id)  # the sleeper returns at its next heartbeat
        flaky = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 1}, retry_backoff=1, retry_jitter=False)
        killed = cron_at_scale.schedule("demo.tasks.kill_self", kwargs={"times": 1})  # its pool process dies once

        wait_until(lambda: attempts(running) == {1: "cancelled"} and attempts(doomed) == {1: "cancelled"}
                   and attempts(flaky) == {1: "retried", 2: "succeeded"} and attempts(stale) == {1: "skipped"}
                   and attempts(killed) == {1: "retried", 2: "succeeded"},
                   timeout=30, what="every attempt to end")
        want = {
            task_id_for(running.id, 1): states.REVOKED,  # cancelled while it ran, and it returned
            task_id_for(doomed.id, 1): states.REVOKED,  # cancelled before it started
            task_id_for(stale.id, 1): states.REVOKED,  # expired
            task_id_for(flaky.id, 1): states.RETRY,  # failed once, retried as a new attempt ...
            task_id_for(flaky.id, 2): states.SUCCESS,  # ... which succeeded
            task_id_for(killed.id, 1): states.RETRY,  # Celery's task-failed (WorkerLostError), then retried
            task_id_for(killed.id, 2): states.SUCCESS,
        }
        wait_until(lambda: {t: final(state, t) for t in want} == want, timeout=10,
                   what=f"the monitor to see every end: {({t: final(state, t) for t in want})} {seen}")

    assert state.tasks[task_id_for(stale.id, 1)].expired is True
    assert state.tasks[task_id_for(doomed.id, 1)].expired is False
    retried = state.tasks[task_id_for(flaky.id, 1)]
    assert "RetryableError('failing attempt 1 of 1')" in retried.exception
    assert "Traceback" in retried.traceback and "failing attempt 1 of 1" in retried.traceback
    # Flower's "Retries" column (task-received's retries): each attempt is a message of its own
    assert state.tasks[task_id_for(flaky.id, 2)].retries == 0
    for task_id in want:  # each attempt started, then ended: nothing left STARTED
        assert seen[task_id][0] == "task-received" and "task-started" in seen[task_id]
        assert seen[task_id][-1] in ("task-retried", "task-revoked", "task-succeeded"), seen[task_id]
    assert seen[task_id_for(killed.id, 1)][-2:] == ["task-failed", "task-retried"]
    assert "WorkerLostError" in state.tasks[task_id_for(killed.id, 1)].exception
    assert not [t for t in state.tasks.values() if t.state == states.STARTED]


def test_no_task_events_from_a_worker_not_sending_them(system):
    """The events are Celery's own, sent as Celery sends them: not without ``-E``."""
    with monitor(system.app) as (_state, seen):
        system.worker("w1", concurrency=1)
        system.dispatcher("d1")
        wait_for_workers(system.app, ["w1"])
        flaky = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 1}, retry_backoff=1, retry_jitter=False)
        skipped = cron_at_scale.schedule("demo.tasks.record", expires=0.001)
        wait_until(lambda: attempts(flaky) == {1: "retried", 2: "succeeded"}, timeout=30, what="the retry")
        wait_until(lambda: bool(attempts(skipped)) and "dispatched" not in attempts(skipped).values(),
                   timeout=30, what="the expiring run to end")
        time.sleep(1.0)
    assert seen == {}


def test_a_recurring_jobs_runs_end_in_a_monitor_and_its_overlap_skips_never_reach_it(system):
    """``overlap="skip"``: an occurrence due while the previous run still runs is recorded skipped by
    the dispatcher and never published, so no monitor sees a task for it (it is on the job's
    attempts and ``skipped_occurrences``); every run that was published ends in its state."""
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps({"HEARTBEAT_INTERVAL": 0.2})
    with monitor(system.app) as (state, seen):
        system.worker("w1", concurrency=1, extra=["-E"])
        system.dispatcher("d1")
        wait_for_workers(system.app, ["w1"])
        job = cron_at_scale.schedule("demo.tasks.sleep", kwargs={"seconds": 1.5}, every=1, overlap="skip")
        wait_until(lambda: list(attempts(job).values()).count("succeeded") >= 2
                   and "skipped" in attempts(job).values(), timeout=30, what="runs and overlap skips")
        wait_until(lambda: "running" in attempts(job).values(), timeout=10, what="a run in progress")
        assert cron_at_scale.cancel(job.id)  # it returns at its next heartbeat: recorded cancelled
        wait_until(lambda: not {"dispatched", "running"} & set(attempts(job).values()), timeout=10,
                   what="the last run to end")
        ended = attempts(job)
        want = {task_id_for(job.id, n): {"succeeded": states.SUCCESS, "cancelled": states.REVOKED}[outcome]
                for n, outcome in ended.items() if outcome != "skipped"}
        wait_until(lambda: {t: final(state, t) for t in want} == want, timeout=10,
                   what=f"the monitor to see every run end: {({t: final(state, t) for t in want})}")
    skipped = [task_id_for(job.id, n) for n, outcome in ended.items() if outcome == "skipped"]
    assert "cancelled" in ended.values()
    assert skipped and not set(skipped) & set(seen), "an overlap skip was never a Celery task"
    assert not [t for t in state.tasks.values() if t.state == states.STARTED]
