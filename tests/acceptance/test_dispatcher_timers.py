"""ETA_LEAD with real workers: a run published ahead of its fire_at, with Celery's eta, starts at
its fire_at by the database clock (not the worker's), a cancel before the eta stops it, and a lost
such message is fired again after its dispatch lease."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from demo.models import Execution
from demo.runner import Processes, child_env, database_url, wait_for_workers
from django.conf import settings
from django.db import connection
from helpers import sql, wait_until

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance

CLOCK_DIR = Path(__file__).resolve().parent.parent / "faults" / "clock"  # its sitecustomize fakes the clock
LEAD = {"ETA_LEAD": 1.0, "LOOKAHEAD": 1.0}


@pytest.fixture
def procs(system, tmp_path):
    """Processes like ``system``'s, with cron_at_scale settings of the test's choosing and a worker
    clock the test can step (``procs.step_clock(seconds)``)."""
    offset = tmp_path / "clock-offset"
    made = []

    def start(settings_: dict) -> Processes:
        env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL,
                        CRON_AT_SCALE_SETTINGS=json.dumps(settings_), FAKE_CLOCK_OFFSET_FILE=str(offset))
        env["PYTHONPATH"] = os.pathsep.join([str(CLOCK_DIR), env["PYTHONPATH"]])
        p = Processes(env, log_dir=tmp_path / "logs")
        made.append(p)
        return p

    start.step_clock = lambda seconds: offset.write_text(str(seconds))  # type: ignore[attr-defined]
    yield start
    for p in made:
        p.stop()


def worker_measured(name: str) -> bool:
    """The worker's first health row is written (its clock measured against the database's)."""
    return bool(sql("SELECT 1 FROM cron_at_scale_workerhealth WHERE name LIKE %s", [f"{name}@%"]))


def warm_up(p: Processes, app, worker: str) -> None:
    """Start ``worker`` and a dispatcher; return once a job due now has run (both are up, the
    worker's clock measured), its rows deleted."""
    p.worker(worker)
    p.dispatcher("d")
    wait_for_workers(app, [worker])
    wait_until(lambda: worker_measured(worker), what="the worker's first heartbeat")
    cron_at_scale.schedule("demo.tasks.record")
    wait_until(lambda: Execution.objects.exists(), timeout=60, what="a first run")
    sql("DELETE FROM demo_execution")
    sql("DELETE FROM cron_at_scale_jobattempt")
    sql("DELETE FROM cron_at_scale_job")


def test_a_worker_whose_clock_steps_ahead_starts_nothing_before_its_fire_at(system, procs):
    # The worker measures its clock at start (in step), then its clock jumps 0.8 s ahead and is not
    # measured again (heartbeat every 300 s): it takes every eta 0.8 s early. The start statement
    # refuses each such start, the task waits what the database says, and starts on time.
    p = procs({**LEAD, "WORKER_HEARTBEAT_INTERVAL": 300})
    warm_up(p, system.app, "ahead")
    procs.step_clock(0.8)
    jobs = [cron_at_scale.schedule("demo.tasks.record", countdown=2 + i * 0.05) for i in range(30)]
    wait_until(lambda: Execution.objects.count() == 30, timeout=90, what="30 runs")
    rows = sql("""SELECT a.attempt, extract(epoch FROM a.started_at - a.scheduled_at),
                         extract(epoch FROM x.executed_at - j.fire_at), a.dispatched_at < a.scheduled_at
                  FROM cron_at_scale_jobattempt a JOIN cron_at_scale_job j ON j.id = a.job_id
                  JOIN demo_execution x ON x.job_id = a.job_id AND x.attempt = a.attempt""")
    assert len(rows) == len(jobs)
    assert {r[0] for r in rows} == {1}  # no run re-fired
    assert min(r[1] for r in rows) >= 0, "an attempt started before its fire_at (database clock)"
    assert min(r[2] for r in rows) >= 0, "a task ran before its fire_at (database clock)"
    # Published with the lead (claimed ahead of their fire_at): on a loaded box a dispatcher can wake
    # late for a few, which then go out due, so the path under test is checked to be the common one.
    ahead = sum(1 for r in rows if r[3])
    assert ahead >= len(rows) // 2, f"only {ahead} of {len(rows)} runs were claimed ahead of their fire_at"
    assert max(r[1] for r in rows) < 5  # and on time: held by the worker, not re-fired after a lease


def test_a_worker_whose_clock_is_an_hour_behind_starts_runs_on_time(system, procs):
    # Celery would hold an eta an hour too long by this worker's clock; the worker holds the
    # dispatcher's messages on the database's clock instead (its measured offset).
    procs.step_clock(-3600)
    p = procs(LEAD)
    warm_up(p, system.app, "behind")
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "countdown": 2 + i * 0.1} for i in range(10)])
    wait_until(lambda: Execution.objects.count() == 10, timeout=25, what="10 runs, none held an hour")
    rows = sql("""SELECT a.attempt, extract(epoch FROM a.started_at - a.scheduled_at), a.dispatched_at < a.scheduled_at
                  FROM cron_at_scale_jobattempt a""")
    assert {r[0] for r in rows} == {1}
    ahead = sum(1 for r in rows if r[2])  # with an eta: the ones a wrong clock would hold
    assert ahead >= len(rows) // 2, f"only {ahead} of {len(rows)} runs were claimed ahead of their fire_at"
    assert 0 <= min(r[1] for r in rows) and max(r[1] for r in rows) < 2


def test_a_job_cancelled_before_its_eta_does_not_start(system, procs):
    p = procs(LEAD)
    warm_up(p, system.app, "w")
    job = cron_at_scale.schedule("demo.tasks.record", countdown=4)
    # claimed and published with its eta a second before its fire_at, then held by the worker
    wait_until(lambda: JobAttempt.objects.filter(job_id=job.id).exists(), timeout=10, what="the claim")
    (left,), = sql("SELECT extract(epoch FROM fire_at - statement_timestamp()) FROM cron_at_scale_job WHERE id = %s",
                   [job.id])
    assert left > 0.3, "the run was claimed too late to cancel it before its eta"
    assert cron_at_scale.cancel(job.id)
    wait_until(lambda: JobAttempt.objects.get(job_id=job.id).outcome == "cancelled", timeout=30,
               what="the held message to reach its eta and be skipped")
    assert Execution.objects.count() == 0
    assert Job.objects.get(id=job.id).status == "cancelled"


def test_a_lost_eta_message_is_fired_again_after_its_dispatch_lease(system):
    job = cron_at_scale.schedule("demo.tasks.record", countdown=2)
    d = Dispatcher(name="t", shards="all", lease=2.0, lookahead=1.0, eta_lead=1.0)
    wait_until(lambda: d.step() or d.published_total, timeout=10, interval=0.02, what="the run published early")
    (first,) = JobAttempt.objects.filter(job_id=job.id)
    assert first.dispatched_at < first.scheduled_at  # published ahead of its fire_at, with its eta
    system.app.control.purge()  # the broker loses the message
    system.worker("w")
    wait_for_workers(system.app, ["w"])
    d.run(max_seconds=12)  # reaps attempt 1 two seconds after its fire_at, fires attempt 2
    wait_until(lambda: Execution.objects.filter(job_id=job.id).exists(), timeout=30, what="the re-fired run")
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]
    wait_until(lambda: dict(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "outcome")) == {
        1: "lost", 2: "succeeded"}, what="attempt 1 lost, attempt 2 succeeded")
