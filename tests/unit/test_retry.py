"""The retry policy's formula and bounds (cron_at_scale.retry)."""

from __future__ import annotations

import pytest

from cron_at_scale.exceptions import RetryableError
from cron_at_scale.retry import DEFAULT_BACKOFF, backoff, decide


class Plain:
    pass


class Auto:
    autoretry_for = (KeyError,)
    retry_backoff = 2
    retry_backoff_max = 10
    retry_jitter = False


def test_default_backoff_shape_without_jitter():
    assert [backoff(n, jitter=False) for n in range(5)] == [30, 120, 480, 600, 600]


@pytest.mark.parametrize("n", range(6))
def test_jitter_stays_within_half_to_full_delay(n):
    full = backoff(n, jitter=False)
    draws = [backoff(n) for _ in range(300)]
    assert all(full / 2 <= d <= full for d in draws)
    assert max(draws) - min(draws) > full / 10  # it really spreads


def test_max_retries_is_celerys_meaning():
    assert decide(Plain(), RetryableError(), retries=2, max_retries=3).retry
    assert not decide(Plain(), RetryableError(), retries=3, max_retries=3).retry
    assert not decide(Plain(), RetryableError(), retries=0, max_retries=0).retry


def test_only_retryable_errors_retry_unless_configured():
    assert not decide(Plain(), ValueError(), 0, 3).retry
    assert decide(Plain(), ValueError(), 0, 3, retry_all=True).retry
    assert decide(Plain(), ValueError(), 0, 3, job_options={"retry_all_exceptions": True}).retry
    assert decide(Auto(), KeyError(), 0, 3).retry


def test_task_attributes_then_job_options_win():
    assert decide(Auto(), KeyError(), 0, 5).delay == 2
    assert decide(Auto(), KeyError(), 3, 5).delay == 10  # capped by retry_backoff_max
    d = decide(Auto(), KeyError(), 1, 5, job_options={"retry_backoff": 1, "retry_backoff_max": 100})
    assert d.delay == 4
    assert decide(Plain(), RetryableError(), 0, 3, countdown=7).delay == 7
    assert DEFAULT_BACKOFF / 2 <= decide(Plain(), RetryableError(), 0, 3).delay <= DEFAULT_BACKOFF


def test_celery_retry_backoff_true_means_the_default_base():
    class T:
        retry_backoff = True
        retry_jitter = False

    assert decide(T(), RetryableError(), 0, 3).delay == DEFAULT_BACKOFF
