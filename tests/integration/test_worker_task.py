"""A scheduled task run inside the caller's transaction (task.apply() from a view with ATOMIC_REQUESTS,
a test case) leaves that transaction's settings alone: the worker statements' SET LOCALs (asynchronous
commit, generic plans, no sequential scans) are for their own implicit transaction only."""

from __future__ import annotations

import pytest
from celery.signals import task_failure, task_postrun, task_prerun, task_success
from django.db import connection, transaction

import cron_at_scale
from cron_at_scale.broker.publish import HEADER, header
from cron_at_scale.celery_app import get_app
from cron_at_scale.dispatcher import Dispatcher

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = ("synchronous_commit", "enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin",
            "plan_cache_mode")


def _show() -> dict[str, str]:
    with connection.cursor() as cur:
        out = {}
        for name in SETTINGS:
            cur.execute(f"SHOW {name}")
            out[name] = cur.fetchone()[0]
        return out


def test_an_eager_run_inside_a_transaction_leaves_the_callers_planner_settings_alone():
    cron_at_scale.schedule("demo.tasks.noop")
    run, = Dispatcher(name="t", shards="all", lookahead=0).claim()
    app = get_app()
    with transaction.atomic():
        before = _show()
        app.tasks[run.task].apply(args=run.payload["args"], kwargs=run.payload["kwargs"],
                                  task_id=f"{run.job_id}:{run.attempt}", headers={HEADER: header(run)})
        after = _show()  # the caller's own transaction goes on after the task
    assert after == before


# Scheduled runs are ordinary Celery tasks, so Celery's monitoring keeps working: signals fire, task ids name the attempt.


@pytest.mark.django_db
def test_celery_signals_fire_for_scheduled_runs():
    seen = []

    def on(name):
        def receiver(sender=None, task_id=None, **kw):
            seen.append((name, task_id or kw.get("task_id") or getattr(kw.get("request"), "id", None)))
        return receiver

    receivers = {sig: on(name) for sig, name in ((task_prerun, "prerun"), (task_postrun, "postrun"),
                                                 (task_success, "success"), (task_failure, "failure"))}
    for sig, receiver in receivers.items():
        sig.connect(receiver, weak=False)
    try:
        ok = cron_at_scale.schedule("demo.tasks.noop")
        bad = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 5}, max_retries=0)
        app = get_app()
        for run in Dispatcher(name="t", lookahead=0).claim():
            app.tasks[run.task].apply(args=run.payload["args"], kwargs=run.payload["kwargs"],
                                      task_id=f"{run.job_id}:{run.attempt}", headers={HEADER: header(run)})
    finally:
        for sig, receiver in receivers.items():
            sig.disconnect(receiver)
    names = {(name, tid) for name, tid in seen}
    assert ("prerun", f"{ok.id}:1") in names
    assert [n for n, _ in seen].count("success") == 1  # the noop; the failing task sends task_failure
    assert ("postrun", f"{ok.id}:1") in names and ("postrun", f"{bad.id}:1") in names
    assert any(name == "failure" for name, _ in seen)
