"""The worker's concerns are middleware. A middleware added to MIDDLEWARE after import runs: the
hook lists are read when a worker starts, and again whenever the list changes, not frozen when
cron_at_scale.worker.task is imported. Celery's signals reach the middleware's per-process hooks
through cron_at_scale.worker.signals, the one module that connects them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from celery import signals as celery_signals

import cron_at_scale
from cron_at_scale.broker.publish import HEADER, header
from cron_at_scale.celery_app import get_app
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.worker import signals
from cron_at_scale.worker import task as worker_task
from cron_at_scale.worker.batch_start import BatchStarts
from cron_at_scale.worker.health import WorkerHealth
from cron_at_scale.worker.lost import LostProcess
from cron_at_scale.worker.middleware import Middleware
from cron_at_scale.worker.middleware.base import HOOK_NAMES, Hooks
from cron_at_scale.worker.middleware.completion import Completion
from cron_at_scale.worker.middleware.refuse_pickle import RefusePickle


class Recorder(Middleware):
    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def before_run(self, run):
        self.seen.append(("before_run", run.job_id))

    def after_success(self, run, result):
        self.seen.append(("after_success", run.job_id))

    def after_failure(self, run, exc):
        self.seen.append(("after_failure", run.job_id))

    def after_run(self, run):
        self.seen.append(("after_run", run.job_id))


def run_due() -> None:
    app = get_app()
    for run in Dispatcher(name="t", lookahead=0).claim():
        app.tasks[run.task].apply(args=run.payload["args"], kwargs=run.payload["kwargs"],
                                  task_id=f"{run.job_id}:{run.attempt}", headers={HEADER: header(run)})


@pytest.fixture
def recorder(monkeypatch):
    # One scheduled message first, so the hook lists were computed before the append.
    cron_at_scale.schedule("demo.tasks.noop")
    run_due()
    rec = Recorder()
    monkeypatch.setattr(worker_task, "MIDDLEWARE", list(worker_task.MIDDLEWARE))  # restored after the test
    worker_task.MIDDLEWARE.append(rec)
    return rec


@pytest.mark.django_db
def test_a_middleware_appended_after_import_runs_its_hooks(recorder):
    ok = cron_at_scale.schedule("demo.tasks.noop")
    bad = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 5}, max_retries=0)
    run_due()
    seen = set(recorder.seen)
    assert {("before_run", str(ok.id)), ("after_success", str(ok.id)), ("after_run", str(ok.id))} <= seen
    assert {("before_run", str(bad.id)), ("after_failure", str(bad.id)), ("after_run", str(bad.id))} <= seen
    ok.refresh_from_db()
    assert ok.status == "completed"  # the others still ran: the completion was written


@pytest.mark.django_db
def test_a_middleware_removed_runs_no_more(recorder):
    worker_task.MIDDLEWARE.remove(recorder)
    cron_at_scale.schedule("demo.tasks.noop")
    run_due()
    assert recorder.seen == []


@pytest.mark.django_db
def test_a_replaced_list_is_the_one_that_runs(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(worker_task, "MIDDLEWARE", [*worker_task.MIDDLEWARE, rec])
    job = cron_at_scale.schedule("demo.tasks.noop")
    run_due()
    assert ("after_success", str(job.id)) in rec.seen


class Boots(Middleware):
    def __init__(self):
        self.boots = 0

    def after_process_boot(self):
        self.boots += 1


class Broken(Middleware):
    def after_process_boot(self):
        raise RuntimeError("a bug of one concern")


def test_hook_lists_follow_the_list_they_read():
    middleware: list[Middleware] = [Middleware()]
    hooks = Hooks(lambda: middleware)
    assert hooks["after_process_boot"] == ()
    b = Boots()
    middleware.append(b)
    assert hooks["after_process_boot"] == (b,)
    middleware.remove(b)
    assert hooks["after_process_boot"] == ()


def test_the_base_class_documents_every_hook():
    doc = Middleware.__doc__ or ""
    for name in HOOK_NAMES:
        assert name in doc, name


def test_the_worker_concerns_are_middleware_in_the_list():
    kinds = {type(m) for m in worker_task.MIDDLEWARE}
    assert {WorkerHealth, LostProcess, RefusePickle, Completion} <= kinds
    assert worker_task.hooks["before_worker_boot"][0].__class__ is RefusePickle
    assert {type(m) for m in worker_task.hooks["after_worker_shutdown"]} == {WorkerHealth, Completion, BatchStarts}


def test_each_celery_signal_is_connected_once_by_the_signals_module():
    for sig in (celery_signals.worker_init, celery_signals.worker_ready, celery_signals.worker_process_init,
                celery_signals.worker_process_shutdown, celery_signals.worker_shutting_down,
                celery_signals.worker_shutdown, celery_signals.task_received, celery_signals.task_prerun,
                celery_signals.task_postrun, celery_signals.task_failure):
        ours = [r for r in sig.receivers if str(r[0][0]).startswith("cron_at_scale.worker")]
        assert len(ours) == 1, (sig.name, ours)
        assert str(ours[0][0][0]).startswith("cron_at_scale.worker.signals."), sig.name


def test_a_signal_calls_the_hook_of_a_middleware_appended_after_import(monkeypatch):
    b, broken = Boots(), Boots()
    monkeypatch.setattr(worker_task, "MIDDLEWARE", [*worker_task.MIDDLEWARE, Broken(), b])
    celery_signals.worker_process_init.send(sender=None)
    assert b.boots == 1  # and the broken one before it did not stop it
    worker_task.MIDDLEWARE.append(broken)
    signals.call("after_process_boot")
    assert (b.boots, broken.boots) == (2, 1)


class SeesConnections(Middleware):
    def __init__(self):
        self.open_at_boot: list[str] | None = None

    def after_process_boot(self):
        from django.db import connections

        self.open_at_boot = [c.alias for c in connections.all(initialized_only=True) if c.connection is not None]


@pytest.mark.django_db(transaction=True)
def test_a_pool_process_boots_its_middleware_with_no_connection_left_for_celery_to_close_twice(monkeypatch):
    """Celery's Django fixup, at ``worker_process_init``, closes each open connection's descriptor
    and then the connection (the same number again). A thread a hook starts (the writer's, which
    connects at once) could be handed that number in between and lose its socket: in the solo pool
    the worker's main process itself, whose file reads then failed with EBADF and the worker died
    at start. No connection of the booting thread may be open when the hooks run."""
    from django.db import connection

    connection.ensure_connection()
    seer = SeesConnections()
    monkeypatch.setattr(worker_task, "MIDDLEWARE", [seer])
    celery_signals.worker_process_init.send(sender=None)
    assert seer.open_at_boot == []
    with connection.cursor() as cur:  # and the next use reconnects
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_a_forked_pool_process_lets_go_of_its_inherited_connection_without_closing_the_main_processes(monkeypatch):
    """A prefork pool process inherits the main process's connection, socket included: closing it
    the ordinary way would tell PostgreSQL to end the main process's session."""
    import os

    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    monkeypatch.setattr(signals, "_main_pid", os.getpid())
    pid = os.fork()
    if pid == 0:  # the pool process
        code = 3
        try:
            signals.release_connections()
            code = 0 if connection.connection is None else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with connection.cursor() as cur:  # the main process's session lives on
        cur.execute("SELECT pg_backend_pid()")
        assert cur.fetchone()[0] == backend


def test_no_other_worker_module_connects_a_celery_signal():
    root = Path(worker_task.__file__).parent
    for path in root.rglob("*.py"):
        if path.name == "signals.py" and path.parent == root:
            continue
        text = path.read_text()
        assert "celery.signals" not in text and not re.search(r"\.connect\b", text), path
