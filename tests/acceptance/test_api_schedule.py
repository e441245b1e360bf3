"""reschedule() on a live system: a dispatcher process and a celery worker run an every-second job,
changed to every two seconds while a run is in flight. The runs are counted in a ledger file the
task appends to (outside the jobs' database)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


def ledger_runs(path) -> list[tuple[int, float]]:
    """``(attempt, unix time)`` of each run the ledger task wrote."""
    if not path.exists():
        return []
    return [(int(a), float(t)) for _job, a, _pid, t in (line.split() for line in path.read_text().splitlines())]


def test_every_second_to_every_two_seconds_while_a_run_is_in_flight(system, tmp_path):
    ledger = tmp_path / "ledger.txt"
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    # overlap="allow": the dispatcher claims each run up to LOOKAHEAD (1 s) ahead, also while one runs
    job = cron_at_scale.schedule("demo.tasks.ledger", every=1, overlap="allow",
                                 kwargs={"path": str(ledger), "seconds": 0.5})
    wait_until(lambda: len(ledger_runs(ledger)) >= 4, timeout=60, what="four runs of the every-second schedule")
    wait_until(lambda: JobAttempt.objects.filter(job_id=job.id, outcome="running").exists(), timeout=10,
               interval=0.02, what="a run in flight")
    changed = cron_at_scale.reschedule(job.id, every=2)
    changed_at = time.time()
    in_flight = JobAttempt.objects.filter(job_id=job.id, outcome="running").count()
    wait_until(lambda: sum(t > changed_at for _, t in ledger_runs(ledger)) >= 5, timeout=60,
               what="five runs after the change")
    wait_until(lambda: not JobAttempt.objects.filter(job_id=job.id, finished_at__isnull=True,
                                                     scheduled_at__lte=changed.fire_at + timedelta(seconds=8)).exists(),
               timeout=10, what="those runs recorded")
    assert cron_at_scale.cancel(job.id)
    time.sleep(1.5)  # a run claimed ahead of the cancel would show up in the ledger now

    runs = ledger_runs(ledger)
    attempts = [a for a, _ in runs]
    assert len(attempts) == len(set(attempts)), "an attempt ran twice"
    scheduled = dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "scheduled_at"))
    outcomes = dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "outcome"))
    assert all(outcomes[a] in ("succeeded", "cancelled") for a in attempts)  # every run the ledger saw is recorded
    # After the change: at most the run in flight then (or claimed and due before it) is of the old
    # schedule; every other one is an occurrence of the new one, two seconds apart.
    after = [a for a, t in runs if t > changed_at]
    old = [a for a in after if scheduled[a] < changed.occurrence_at]
    new = [scheduled[a] for a in after if scheduled[a] >= changed.occurrence_at]
    assert len(old) <= max(1, in_flight), (old, in_flight)
    assert all(scheduled[a].timestamp() <= changed_at for a in old), "an occurrence after the change ran"
    assert new[0] == changed.occurrence_at  # the first occurrence of the new schedule ran: none lost
    assert [(b - a).total_seconds() for a, b in zip(new, new[1:])] == [2.0] * (len(new) - 1)  # none lost, none extra
    # Nothing missed; the runs held for the old schedule's later occurrences did not run.
    assert Job.objects.get(id=job.id).missed_occurrences == 0
    superseded = [a for a, o in outcomes.items() if o == "skipped"]
    assert not set(superseded) & set(attempts)
    # No gap in the ledger longer than the old one plus the new interval (plus latency): nothing lost.
    times = [t for _, t in runs]
    assert max(b - a for a, b in zip(times, times[1:])) < 3.8


@pytest.mark.parametrize("missed", ["skip", "latest", "all"])
def test_resume_with_a_choice_runs_what_it_says_without_waiting_for_a_dispatcher(system, tmp_path, missed):
    from helpers import clear_of_a_minute_mark, sql

    ledger = tmp_path / "ledger.txt"
    system.worker("w1", concurrency=2)  # no dispatcher: the runs resume() fires, it publishes itself
    wait_for_workers(system.app, ["w1"])
    clear_of_a_minute_mark()  # four fall due, not five
    job = cron_at_scale.schedule("demo.tasks.ledger", cron="* * * * *", overlap="allow", catchup_window=600,
                                 kwargs={"path": str(ledger)})
    assert cron_at_scale.pause(job.id)
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '4 minutes', "
        "occurrence_at = occurrence_at - interval '4 minutes' WHERE id = %s", [job.id])  # four fell due
    assert cron_at_scale.resume(job.id, missed=missed)
    want = {"skip": 0, "latest": 1, "all": 4}[missed]
    wait_until(lambda: len(ledger_runs(ledger)) >= want, timeout=30, what=f"{want} runs")
    time.sleep(1.0)  # and no more
    assert len(ledger_runs(ledger)) == want
    assert Job.objects.get(id=job.id).missed_occurrences == 4 - want
