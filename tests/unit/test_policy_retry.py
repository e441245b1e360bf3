"""The retry policy's formulas and bounds (cron_at_scale.policy.retry), beside Celery's own code."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.utils.time import get_exponential_backoff_interval

from cron_at_scale.exceptions import RetryableError
from cron_at_scale.policy.retry import (
    DEFAULT_SCHEDULE,
    RetryCall,
    celery_backoff,
    contradictions,
    decide,
    default_backoff,
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


def test_the_default_schedule_is_30_s_2_min_10_min_then_the_dlq():
    assert DEFAULT_SCHEDULE == (30, 120, 600)
    assert [default_backoff(n, jitter=False) for n in range(5)] == [30, 120, 600, 600, 600]
    nothing_set = task(retry_jitter=False)  # no retry_backoff, no default_retry_delay, Celery's max_retries 3
    assert [decide(nothing_set, RetryableError(), n).delay for n in range(3)] == [30, 120, 600]
    assert not decide(nothing_set, RetryableError(), 3).retry  # the fourth failure: failed, to the DLQ
    assert [decide(nothing_set, RetryableError(), n, job_options={"retry_backoff_max": 60}).delay
            for n in range(3)] == [30, 60, 60]  # retry_backoff_max caps it too
    assert delays(task(retry_jitter=False), 3, call=RetryCall()) == [30, 120, 600]  # self.retry() alike


@pytest.mark.parametrize("n", range(6))
def test_jitter_on_the_default_stays_within_half_to_full_delay(n):
    full = default_backoff(n, jitter=False)
    draws = [default_backoff(n) for _ in range(300)]
    assert all(full / 2 <= d <= full for d in draws)
    assert max(draws) - min(draws) > full / 10  # it really spreads
    assert all(full / 2 <= decide(Plain(), RetryableError(), n, 9).delay <= full for _ in range(50))


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


def celerys(factor, n, cap=600, jitter=False):
    """Celery's own delay for autoretry ``n``: its autoretry's call of the public oracle."""
    return get_exponential_backoff_interval(int(max(1.0, float(factor))), n, int(cap), jitter)


BACKOFFS = [(True, 600), (1, 600), (2, 600), (2, 10), (0.2, 600), (1.9, 600), (3, 10), (2, 2.5), (30, 600)]


@pytest.mark.parametrize(("factor", "cap"), BACKOFFS)
@pytest.mark.parametrize("where", ["task", "job", "job over the task's"])
def test_retry_backoff_means_celerys_on_the_task_and_on_the_job_without_jitter(factor, cap, where):
    if where == "task":
        t, job = task(autoretry_for=(ValueError,), retry_backoff=factor, retry_backoff_max=cap, retry_jitter=False,
                      max_retries=None), {}
    else:
        t = task(autoretry_for=(ValueError,), max_retries=None,
                 **({"retry_backoff": 7, "retry_backoff_max": 5, "retry_jitter": True} if where != "job" else {}))
        job = {"retry_backoff": factor, "retry_backoff_max": cap, "retry_jitter": False}
    got = [decide(t, ValueError(), n, job_options=job).delay for n in range(14)]
    assert got == [celerys(factor, n, cap) for n in range(14)]
    assert [decide(t, RetryableError(), n, job_options=job).delay for n in range(4)] == got[:4]  # autoretried too


@pytest.mark.parametrize(("factor", "cap"), BACKOFFS)
@pytest.mark.parametrize("where", ["task", "job"])
def test_retry_jitter_draws_as_celerys_full_jitter_on_the_task_and_on_the_job(factor, cap, where):
    t = (task(autoretry_for=(ValueError,), retry_backoff=factor, retry_backoff_max=cap, max_retries=None)
         if where == "task" else task(autoretry_for=(ValueError,), retry_jitter=False, max_retries=None))
    job = {} if where == "task" else {"retry_backoff": factor, "retry_backoff_max": cap, "retry_jitter": True}
    for n in range(10):
        top = celerys(factor, n, cap)
        draws = []
        for seed in range(40):  # the same draw from the same random state: the same function
            random.seed(seed)
            theirs = get_exponential_backoff_interval(int(max(1.0, float(factor))), n, int(cap), True)
            random.seed(seed)
            draws.append(decide(t, ValueError(), n, job_options=job).delay)
            assert draws[-1] == theirs, (n, seed)
        assert all(0 <= d <= top and d == int(d) for d in draws)  # whole seconds 0..delay
    random.seed()
    top = celerys(factor, 2, cap)
    spread = {decide(t, ValueError(), 2, job_options=job).delay for _ in range(40 * (top + 1))}
    assert spread == set(range(top + 1))  # every whole second, 0 included (full jitter, not [delay/2, delay])


def test_a_jobs_retry_backoff_of_2_is_celerys_sequence_not_4_to_the_n():
    t = task(autoretry_for=(ValueError,), max_retries=10)
    assert delays(t, 6, job_options={"retry_backoff": 2, "retry_jitter": False}) == [2, 4, 8, 16, 32, 64]
    assert delays(t, 3, job_options={"retry_backoff": 1, "retry_jitter": False}) == [1, 2, 4]
    assert delays(t, 3, job_options={"retry_backoff": True, "retry_jitter": False}) == [1, 2, 4]


def test_a_jobs_retry_backoff_false_turns_the_tasks_off_as_celerys_false_does():
    t = task(autoretry_for=(ValueError,), retry_backoff=5, retry_jitter=False, default_retry_delay=7)
    assert delays(t, 2, job_options={"retry_backoff": False}) == [7, 7]  # Celery: default_retry_delay
    assert delays(t, 2, job_options={"retry_backoff": 0}) == [7, 7]
    bare = task(autoretry_for=(ValueError,), retry_backoff=5, retry_jitter=False)
    assert delays(bare, 3, job_options={"retry_backoff": False}) == [30, 120, 600]  # then the default schedule


def test_retry_backoff_is_for_autoretries_only_as_in_celery():
    t = task(retry_jitter=False, default_retry_delay=9)
    assert decide(t, RuntimeError(), 0, call=RetryCall(), job_options={"retry_backoff": 2}).delay == 9
    assert decide(t, RuntimeError(), 0, call=RetryCall(countdown=3), job_options={"retry_backoff": 2}).delay == 3


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


def test_a_jobs_autoretry_options_replace_the_tasks_as_celerys_do_on_a_task():
    t = task(autoretry_for=(LookupError,), dont_autoretry_for=(KeyError,), max_retries=2)
    job = {"autoretry_for": ["builtins.ConnectionError"], "dont_autoretry_for": ["builtins.ConnectionRefusedError"]}
    assert decide(t, ConnectionResetError(), 0, job_options=job).retry  # a subclass, as isinstance() sees it
    assert not decide(t, ConnectionRefusedError(), 0, job_options=job).retry  # the job's exclusion
    assert not decide(t, IndexError(), 0, job_options=job).retry  # the task's list is replaced, not added to
    assert decide(t, KeyError(), 0, job_options={"dont_autoretry_for": []}).retry  # the task's exclusion lifted
    assert not decide(t, ConnectionError(), 0, job_options={"autoretry_for": ["no_such.Module"]}).retry
    assert decide(t, ValueError(), 0, call=RetryCall(), job_options=job).retry  # self.retry(): whatever the lists
    assert decide(Plain(), RetryableError(), 0, 3, job_options={"autoretry_for": []}).retry  # always retryable


def test_a_jobs_retry_kwargs_replace_the_tasks():
    t = task(autoretry_for=(ValueError,), retry_kwargs={"max_retries": 1, "countdown": 9}, max_retries=7)
    assert delays(t, 1) == [9] and not decide(t, ValueError(), 1).retry
    job = {"retry_kwargs": {"max_retries": 3, "countdown": 2}}
    assert delays(t, 3, job_options=job) == [2, 2, 2] and not decide(t, ValueError(), 3, job_options=job).retry
    assert decide(t, ValueError(), 6, job_options={"retry_kwargs": {}}).retry  # none: the task's max_retries, 7
    # Within the job, Celery's order: retry_kwargs' max_retries (3) over the job's max_retries (1)
    assert decide(t, ValueError(), 2, 1, job_options=job).retry and not decide(t, ValueError(), 3, 1, job_options=job).retry
    assert not decide(t, ValueError(), 1, 1).retry  # the job's max_retries over the task's retry_kwargs (1 of 1)
    assert decide(t, ValueError(), 1, 2).retry and not decide(t, ValueError(), 2, 2).retry
    assert not decide(t, ValueError(), 1, 1, call=RetryCall(), job_options=job).retry  # self.retry(): no retry_kwargs


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
    assert delays(t, job_options=job) == [1, 2, 4, 8]  # the job's: Celery's, factor * 2**n
    assert decide(t, ValueError(), 0, call=RetryCall(countdown=3), job_options=job).delay == 3
    countdown = task(autoretry_for=(ValueError,), retry_kwargs={"countdown": 2}, default_retry_delay=9)
    assert delays(countdown, 2) == [2, 2]
    fixed = task(autoretry_for=(ValueError,), default_retry_delay=1.5)
    assert delays(fixed, 2) == [1.5, 1.5]
    assert delays(task(autoretry_for=(ValueError,), default_retry_delay=None), 1) == [0]
    ours = task(autoretry_for=(ValueError,), retry_jitter=False)
    assert delays(ours, 3) == list(DEFAULT_SCHEDULE)
    assert DEFAULT_SCHEDULE[0] / 2 <= decide(Plain(), RetryableError(), 0, 3).delay <= DEFAULT_SCHEDULE[0]


def test_contradicting_and_unsupported_options_are_named():
    assert contradictions(task(retry_backoff=900)) and "retry_backoff_max" in contradictions(task(retry_backoff=900))[0]
    assert contradictions(task(retry_backoff=3, retry_backoff_max=2))
    assert not contradictions(task(retry_backoff=True, retry_backoff_max=600))
    assert contradictions(task(retry_backoff=True, retry_kwargs={"countdown": 5}))
    assert not unsupported(task(retry_kwargs={"max_retries": 5, "countdown": 1}))
    assert "'queue'" in unsupported(task(retry_kwargs={"queue": "slow"}))[0]
