"""The retry policy's formulas and bounds (cron_at_scale.policy.retry), beside Celery's own code."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.utils.time import get_exponential_backoff_interval

from cron_at_scale.exceptions import RetryableError
from cron_at_scale.policy.retry import (
    DEFAULT_BACKOFF,
    RetryCall,
    backoff,
    celery_backoff,
    contradictions,
    decide,
    unsupported,
)

app = Celery("unit_retry", set_as_current=False, task_cls="cron_at_scale.worker:JobTask")


def task(**options):
    """A real Celery task of ``app`` declared with ``options`` (as ``@shared_task(**options)`` would)."""
    def run():
        pass

    run.__name__ = f"t{random.getrandbits(64)}"
    app.task(name=run.__name__, **options)(run)
    return app.tasks[run.__name__]  # the task itself, not the lazy proxy app.task returns


class Plain:
    pass


def delays(t, n=4, **kw):
    return [decide(t, ValueError(), i, **kw).delay for i in range(n)]


def test_default_backoff_shape_without_jitter():
    assert [backoff(n, jitter=False) for n in range(5)] == [30, 120, 480, 600, 600]


@pytest.mark.parametrize("n", range(6))
def test_jitter_stays_within_half_to_full_delay(n):
    full = backoff(n, jitter=False)
    draws = [backoff(n) for _ in range(300)]
    assert all(full / 2 <= d <= full for d in draws)
    assert max(draws) - min(draws) > full / 10  # it really spreads


@pytest.mark.parametrize(("factor", "cap"), [(True, 600), (1, 600), (1.9, 600), (0.2, 600), (3, 10), (2, 2.5)])
@pytest.mark.parametrize("jitter", [False, True])
def test_a_tasks_retry_backoff_is_celerys_formula(factor, cap, jitter):
    for n in range(12):
        random.seed(n)
        theirs = get_exponential_backoff_interval(int(max(1.0, factor)), n, int(cap), jitter)
        random.seed(n)
        assert celery_backoff(n, factor, cap, jitter) == theirs


def test_retry_backoff_true_is_a_factor_of_one_second():
    t = task(autoretry_for=(ValueError,), retry_backoff=True, retry_jitter=False, max_retries=10)
    assert delays(t, 5) == [1, 2, 4, 8, 16]
    jittered = task(autoretry_for=(ValueError,), retry_backoff=True, max_retries=10)
    draws = {decide(jittered, ValueError(), 2).delay for _ in range(300)}
    assert draws == {0, 1, 2, 3, 4}  # Celery's full jitter: whole seconds 0..delay


def test_max_retries_is_celerys_meaning():
    assert decide(Plain(), RetryableError(), retries=2, max_retries=3).retry
    assert not decide(Plain(), RetryableError(), retries=3, max_retries=3).retry
    assert not decide(Plain(), RetryableError(), retries=0, max_retries=0).retry
    assert not decide(Plain(), RetryableError(), retries=3).retry  # no job value: Celery's default 3


def test_a_job_without_max_retries_takes_the_tasks():
    five = task(max_retries=5, autoretry_for=(ValueError,))
    assert decide(five, ValueError(), 4).retry and not decide(five, ValueError(), 5).retry
    assert not decide(five, ValueError(), 2, max_retries=2).retry  # the job's wins
    kw = task(autoretry_for=(ValueError,), retry_kwargs={"max_retries": 5})
    assert decide(kw, ValueError(), 4).retry and not decide(kw, ValueError(), 5).retry
    assert decide(kw, RetryableError(), 4).retry  # RetryableError is autoretried like autoretry_for
    assert decide(kw, ValueError(), 2, call=RetryCall()).retry  # self.retry(): the task.max_retries (3)
    assert not decide(kw, ValueError(), 3, call=RetryCall()).retry
    endless = task(max_retries=None, autoretry_for=(ValueError,))
    assert decide(endless, ValueError(), 10_000).retry  # Celery: None retries without end


def test_self_retry_max_retries_wins_for_that_call():
    t = task(max_retries=1)
    assert decide(t, RuntimeError(), 3, call=RetryCall(max_retries=4)).retry
    assert not decide(t, RuntimeError(), 4, call=RetryCall(max_retries=4)).retry
    assert not decide(t, RuntimeError(), 1, max_retries=5, call=RetryCall(max_retries=1)).retry


def test_only_retryable_errors_retry_unless_configured():
    assert not decide(Plain(), ValueError(), 0, 3).retry
    assert decide(Plain(), ValueError(), 0, 3, retry_all=True).retry
    assert decide(Plain(), ValueError(), 0, 3, job_options={"retry_all_exceptions": True}).retry
    t = task(autoretry_for=(LookupError,), dont_autoretry_for=(KeyError,))
    assert decide(t, IndexError(), 0).retry
    assert not decide(t, KeyError(), 0).retry
    assert not decide(t, KeyError(), 0, retry_all=True).retry  # the task's own exclusion wins


def test_delay_precedence():
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    t = task(autoretry_for=(ValueError,), retry_backoff=2, retry_backoff_max=5, retry_jitter=False,
             default_retry_delay=7, max_retries=9)
    assert delays(t) == [2, 4, 5, 5]  # Celery: factor * 2**n, capped
    assert decide(t, ValueError(), 0, call=RetryCall(countdown=3)).delay == 3
    assert decide(t, ValueError(), 0, call=RetryCall(eta=now + timedelta(seconds=4)), now=now).delay == 4
    assert decide(t, ValueError(), 0, call=RetryCall(countdown=3, eta=now), now=now).delay == 3  # as Celery
    assert decide(t, ValueError(), 0, call=RetryCall()).delay == 7  # self.retry(): default_retry_delay
    job = {"retry_backoff": 1, "retry_backoff_max": 100}
    assert delays(t, job_options=job) == [1, 4, 16, 64]  # the job's: ours, 4**n
    assert decide(t, ValueError(), 0, call=RetryCall(countdown=3), job_options=job).delay == 3
    countdown = task(autoretry_for=(ValueError,), retry_kwargs={"countdown": 2}, default_retry_delay=9)
    assert delays(countdown, 2) == [2, 2]
    fixed = task(autoretry_for=(ValueError,), default_retry_delay=1.5)
    assert delays(fixed, 2) == [1.5, 1.5]
    assert delays(task(autoretry_for=(ValueError,), default_retry_delay=None), 1) == [0]
    ours = task(autoretry_for=(ValueError,), retry_jitter=False)
    assert delays(ours, 3) == [DEFAULT_BACKOFF, 4 * DEFAULT_BACKOFF, 16 * DEFAULT_BACKOFF]
    assert DEFAULT_BACKOFF / 2 <= decide(Plain(), RetryableError(), 0, 3).delay <= DEFAULT_BACKOFF


def test_contradicting_and_unsupported_options_are_named():
    assert contradictions(task(retry_backoff=900)) and "retry_backoff_max" in contradictions(task(retry_backoff=900))[0]
    assert contradictions(task(retry_backoff=3, retry_backoff_max=2))
    assert not contradictions(task(retry_backoff=True, retry_backoff_max=600))
    assert contradictions(task(retry_backoff=True, retry_kwargs={"countdown": 5}))
    assert not unsupported(task(retry_kwargs={"max_retries": 5, "countdown": 1}))
    assert "'queue'" in unsupported(task(retry_kwargs={"queue": "slow"}))[0]
