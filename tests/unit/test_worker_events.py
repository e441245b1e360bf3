"""The event that ends an attempt Celery sees as ignored, and the SkipJob that carries it from the pool
process to the worker's main process (pickled, as the prefork pool returns it)."""

from __future__ import annotations

import pickle

from billiard.einfo import ExceptionInfo

from cron_at_scale.worker.events import event_for
from cron_at_scale.worker.middleware import SkipJob


def test_each_outcome_has_celerys_event_and_fields():
    assert event_for(SkipJob("retried", "RetryableError('x')", "Traceback ...")) == (
        "task-retried", {"exception": "RetryableError('x')", "traceback": "Traceback ..."})
    assert event_for(SkipJob("expired")) == ("task-revoked", {"terminated": False, "signum": None, "expired": True})
    for outcome in ("cancelled", "skipped"):
        assert event_for(SkipJob(outcome)) == ("task-revoked",
                                               {"terminated": False, "signum": None, "expired": False})
    assert SkipJob().outcome == "skipped"


def test_a_skipjob_crosses_the_pool_with_its_fields():
    try:
        raise SkipJob("retried", "ValueError('boom')", "Traceback (most recent call last): ...")
    except SkipJob:
        info = ExceptionInfo(internal=True)  # what Celery's tracer returns for an ignored task
    back = pickle.loads(pickle.dumps(info)).exception  # billiard rebuilds the exception itself
    assert isinstance(back, SkipJob)
    assert (back.outcome, back.error, back.trace) == ("retried", "ValueError('boom')",
                                                      "Traceback (most recent call last): ...")
    assert str(back) == "retried"  # what Celery's log line of an ignored task shows
