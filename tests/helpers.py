"""Small helpers for the tests (imported as ``helpers``)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import pytest

from cron_at_scale.broker.publish import Publisher


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def sql(query: str, params=()):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else cur.rowcount


YEARLY = "0 0 1 1 *"  # one occurrence in sight: the test decides when it was due


def clear_of_a_minute_mark(margin: float = 10.0):
    """Wait until the next whole minute is at least ``margin`` seconds away on the database's clock.

    A test that counts a minutely job's due occurrences must schedule and claim within one minute:
    a minute mark passing between them adds an occurrence the test did not shift in.
    """
    ((now,),) = sql("SELECT statement_timestamp()")
    left = 60 - (now.second + now.microsecond / 1e6)
    if left < margin:
        time.sleep(left + 0.05)


def due(job, seconds_ago: float) -> None:
    """Make the job's pending occurrence due ``seconds_ago`` (nobody fired it)."""
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - make_interval(secs => %s), "
        "occurrence_at = statement_timestamp() - make_interval(secs => %s) WHERE id = %s",
        [seconds_ago, seconds_ago, job.id])


def drain_dlq(app, timeout: float = 0.5) -> list:
    """The dead-letter messages waiting now (JSON bodies), consumed."""
    from cron_at_scale import conf

    bodies = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(conf.get("DLQ_QUEUE"), serializer="json")
        try:
            while True:
                msg = queue.get(timeout=timeout)
                bodies.append(msg.payload)
                msg.ack()
        except queue.Empty:
            pass
        finally:
            queue.close()
    return bodies


RABBIT_URL = os.environ.get("CELERY_RABBITMQ_URL") or "amqp://guest:guest@127.0.0.1:5672//"


@functools.cache
def rabbit_unreachable() -> str | None:
    """Why no RabbitMQ answers at RABBIT_URL (asked once per test run), or None."""
    from kombu import Connection

    try:
        with Connection(RABBIT_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as e:
        return f"no RabbitMQ answers at {RABBIT_URL} ({e}); set CELERY_RABBITMQ_URL"
    return None



class RecordingPublisher(Publisher):
    """The real Publisher (``Dispatcher(publisher=...)``), recording every run handed to it in ``published``.

    By default nothing reaches a broker and every run counts as sent; ``send``: each batch is
    published for real as well. ``stamp``: record ``(time.monotonic(), run)`` rather than the
    run. ``fail(batch)``: called before each batch is sent; what it raises is a failed publish.
    """

    def __init__(self, app=None, *, send: bool = False, stamp: bool = False, fail: Callable | None = None):
        from cron_at_scale.celery_app import get_app

        super().__init__(app or get_app())
        self.send, self.stamp, self.fail = send, stamp, fail
        self.published: list = []

    def publish(self, batch):
        if self.fail is not None:
            self.fail(batch)
        n = super().publish(batch) if self.send else len(batch)
        now = time.monotonic()
        self.published.extend((now, run) if self.stamp else run for run in batch)
        return n


def is_claim(query: str) -> bool:
    """Whether ``query``, as a Django execute wrapper sees it, runs the dispatcher's claim: its prepared
    statement's ``EXECUTE`` (settings first, when the runner sends them), or its text when
    ``PREPARED_STATEMENTS`` is off; not the ``PREPARE`` that only makes the statement."""
    if "EXECUTE cas_claim(" in query:
        return True
    return "SKIP LOCKED" in query and "INSERT INTO cron_at_scale_jobattempt" in query and "PREPARE " not in query


def claim_plan(params: dict) -> list[str]:
    """The plan of the claim as the dispatcher runs it (its transaction's ``claim_settings``, then
    ``db.run("claim", params)``: the prepared statement's generic plan), EXPLAINed in a rolled-back
    transaction, as ``EXPLAIN``'s text lines."""
    from django.db import connection, transaction

    from cron_at_scale import sql as db

    plans: list[list[str]] = []

    def explain(execute, query, params_, many, context):
        if is_claim(query):
            execute("SAVEPOINT explained", None, False, context)
            execute("EXPLAIN " + query, params_, many, context)
            plans.append([r[0] for r in context["cursor"].fetchall()])
            execute("ROLLBACK TO SAVEPOINT explained", None, False, context)
        return execute(query, params_, many, context)

    with transaction.atomic():
        db.run("claim_settings", {"idle_ms": 5000}, fetch="count", retries=0)
        with connection.execute_wrapper(explain):
            db.run("claim", params, retries=0)
        transaction.set_rollback(True)
    assert len(plans) == 1, plans
    return plans[0]
