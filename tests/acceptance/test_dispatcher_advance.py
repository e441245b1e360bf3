"""A burst of recurring jobs with real processes: ~2,000 cron jobs in many zones and expressions,
all due at one instant, through a ``cron_dispatcher`` process and real ``celery worker``
processes. What ran is read from the tasks' own ledger (files, outside the jobs' database): each
job's occurrence ran exactly once, and none started before its fire_at."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from burst import ZONES, burst_specs, db_now, whole_second_after
from demo.runner import wait_for_workers
from helpers import sql, wait_until

import cron_at_scale

pytestmark = pytest.mark.acceptance

N = 2_000
JITTERED = 500  # of them with jitter: fire_at later than the occurrence


def starts(directory: Path) -> list[dict]:
    out = []
    for f in directory.glob("ledger-*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                event = json.loads(line)
                if event["ev"] == "start":
                    out.append(event)
    return out


@pytest.mark.timeout(300)
def test_a_recurring_burst_in_many_zones_runs_each_occurrence_once_and_never_early(system, tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    system.env.update(NEMESIS_LEDGER_DIR=str(ledger))
    system.worker("w1", concurrency=2)
    system.worker("w2", concurrency=2)
    wait_for_workers(system.app, ["w1", "w2"])
    # the dispatcher fires into the default queue once a worker's health row lists it
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_workerhealth WHERE queues ? 'celery'")[0][0] >= 2,
               timeout=60, what="the workers' health rows")
    system.dispatcher("d1")
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_dispatcherheartbeat")[0][0] >= 1, timeout=60,
               what="the dispatcher")

    now = db_now()
    t = whole_second_after(now, 12)  # room for schedule_many on a loaded box
    shapes = ("daily", "dow", "dom", "month", "dom_or_dow")
    specs = (burst_specs([t], N - JITTERED, after=now, task="demo.ledger.record", zones=ZONES, shapes=shapes)
             + burst_specs([t], JITTERED, after=now, task="demo.ledger.record", zones=ZONES, shapes=shapes,
                           jitter=2.0))
    assert len({s["cron"] for s in specs}) >= 30 and len({s["tz"] for s in specs}) == len(ZONES)
    jobs = cron_at_scale.schedule_many(specs)
    assert (t - db_now()).total_seconds() > 1, "the burst was created too late"
    ids = {str(j.id) for j in jobs}
    fire_at = {str(j.id): j.fire_at for j in jobs}
    assert len(ids) == N and all(j.occurrence_at == t <= j.fire_at for j in jobs)

    wait_until(lambda: len(starts(ledger)) >= N, timeout=120, what=f"{N} runs in the ledger")
    # every run recorded by its worker too, then a little longer: a run twice would show by now
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE outcome = 'succeeded'")[0][0] >= N,
               timeout=60, what="the runs' completions")
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE finished_at IS NULL")[0][0] == 0,
               timeout=30, what="no run in flight")
    ran = starts(ledger)

    per_run = Counter((e["job"], e["occurrence"]) for e in ran)
    twice = [k for k, n in per_run.items() if n > 1]
    assert not twice, f"{len(twice)} occurrences started more than once, e.g. {twice[:3]}"
    assert {job for job, _occ in per_run} == ids  # every job ran...
    assert {datetime.fromisoformat(occ) for _job, occ in per_run} == {t}  # ... for the burst's occurrence
    assert len(ran) == N
    # no start before its fire_at: the job's own (as scheduled, jitter included) and its run's
    early = [e for e in ran if e["wall"] < fire_at[e["job"]].timestamp()
             or e["wall"] < datetime.fromisoformat(e["fire_at"]).timestamp()]
    assert not early, f"{len(early)} runs started before their fire_at, e.g. {early[:3]}"
    # the ledger's fire_at is the job's own (jitter included), attempt 1 (nothing fired again)
    assert {e["job"]: datetime.fromisoformat(e["fire_at"]) for e in ran} == fire_at
    assert {e["attempt"] for e in ran} == {1}
    assert sum(1 for e in ran if datetime.fromisoformat(e["fire_at"]) > t) > JITTERED / 2
    assert sql("SELECT count(*), count(DISTINCT job_id) FROM cron_at_scale_jobattempt")[0] == (N, N)
    assert sql("SELECT sum(missed_occurrences), sum(skipped_occurrences) FROM cron_at_scale_job")[0] == (0, 0)
