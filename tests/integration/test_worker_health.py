"""A Celery worker that consumes nothing while its queue holds messages is reported stuck, then
recovers or exits for its supervisor; no job fails meanwhile (cron_at_scale.worker.health).

The stuck consumer is made the way a broker restart leaves one: the process alive, its pool
idle, its task consumer gone. Celery's public control API does exactly that
(``cancel_consumer``).
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import time

import pytest
from demo.runner import wait_for_workers
from django.core.management import call_command
from django.test import override_settings
from helpers import sql, wait_until

from cron_at_scale.ops import metrics
from cron_at_scale.worker.health import EXIT_STATUS

# S = 3 s, I = 0.5 s. Attempts lose their 1 s dispatch lease in the queue while nobody consumes;
# with MAX_LOST_ATTEMPTS 2, counting them would fail every job.
SETTINGS = {"WORKER_HEARTBEAT_INTERVAL": 0.5, "WORKER_STUCK_AFTER": 3.0, "DISPATCH_LEASE": 1.0, "LOOKAHEAD": 0.5,
            "MAX_LOST_ATTEMPTS": 2, "REAPER_INTERVAL": 0.2, "POLL_INTERVAL": 0.05}
STUCK, BEAT = SETTINGS["WORKER_STUCK_AFTER"], SETTINGS["WORKER_HEARTBEAT_INTERVAL"]
SLACK = 20.0  # seconds: two shared cores, several test suites at once


def status() -> dict:
    out = io.StringIO()
    call_command("cron_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def worker_row(name: str) -> dict | None:
    return next((w for w in status()["workers"] if w["name"] == name), None)


def schedule(n: int) -> None:
    import cron_at_scale

    cron_at_scale.schedule_many([{"task": "demo.tasks.record"} for _ in range(n)])


def job_counts() -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM cron_at_scale_job GROUP BY 1"))


def wait_completed(n: int, timeout: float) -> None:
    """Wait for ``n`` completed jobs; on a timeout, fail with what the jobs and attempts were doing."""
    try:
        wait_until(lambda: job_counts().get("completed", 0) == n, timeout=timeout, what=f"the {n} jobs to complete")
    except pytest.fail.Exception as e:
        attempts = sql("SELECT coalesce(outcome, '-'), started_at IS NOT NULL, count(*) FROM cron_at_scale_jobattempt "
                       "GROUP BY 1, 2 ORDER BY 1, 2")
        pytest.fail(f"{e}; jobs {job_counts()}; attempts (outcome, started, count) {attempts}")


@pytest.mark.timeout(360)
@override_settings(CRON_AT_SCALE=SETTINGS)
def test_a_worker_that_stops_consuming_is_reported_recovers_then_exits_and_no_job_fails(system):
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps(SETTINGS)
    name = f"wh@{socket.gethostname()}"
    worker = system.worker("wh", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["wh"])
    wait_until(lambda: (worker_row(name) or {}).get("state") == "ok", timeout=30, what="the worker's health row")
    row = worker_row(name)
    assert row["alive"] and not row["stuck"] and row["queues"] == ["celery"] and row["concurrency"] == 2

    # 1. The consumer stops: the process lives, its pool is idle, messages pile up.
    replies = system.app.control.cancel_consumer("celery", destination=[name], reply=True, timeout=5)
    assert replies, "the worker did not answer cancel_consumer"
    stopped = time.monotonic()
    schedule(30)
    seen: dict = {}

    def stuck() -> bool:  # the row that said so: read again, it may have recovered already (a loaded box)
        row = worker_row(name) or {}
        if row.get("stuck"):
            seen.update(row)
        return bool(seen)

    wait_until(stuck, timeout=STUCK + 2 * BEAT + SLACK, interval=0.2, what="cron_status to report the worker stuck")
    seen_after = time.monotonic() - stopped
    row = seen
    assert row["alive"] and row["state"] in ("stuck", "recovering"), row
    scrape = metrics.render().decode()
    if worker_row(name)["stuck"]:  # still stuck after the scrape (under load it may recover at once)
        assert "cron_workers_stuck 1.0" in scrape, scrape
        assert f'cron_worker_stuck{{queue="celery",worker="{name}"}} 1.0' in scrape

    # It re-adds its consumer (recovery), and every job runs; none failed for its lost,
    # never-started attempts.
    wait_completed(30, timeout=60 + SLACK)
    assert worker.poll() is None, "the worker exited although re-adding its consumer was enough"
    wait_until(lambda: not worker_row(name)["stuck"], timeout=10, what="the worker to be reported consuming again")
    assert worker_row(name)["note"] == "consuming again (re-added consumers of celery)"
    assert job_counts() == {"completed": 30}
    never_started_losses = sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE outcome = 'lost' "
                               "AND started_at IS NULL")[0][0]
    print(f"[worker health] stuck seen after {seen_after:.1f} s (bound {STUCK + 2 * BEAT:.1f} s + load); "
          f"recovered; {never_started_losses} never-started attempts lost meanwhile, no job failed")
    assert never_started_losses > 0, "no attempt lost its dispatch lease: the no-fail rule was not exercised"

    # 2. Stuck again: it already recovered once, so it exits for its supervisor.
    system.app.control.cancel_consumer("celery", destination=[name], reply=True, timeout=5)
    stopped = time.monotonic()
    schedule(30)
    try:
        code = worker.wait(timeout=2 * (STUCK + BEAT) + STUCK + SLACK)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the stuck worker did not exit within {2 * (STUCK + BEAT) + STUCK:.0f} s (+{SLACK:.0f} s slack)")
    exited_after = time.monotonic() - stopped
    assert code == EXIT_STATUS, f"exit status {code}"
    print(f"[worker health] stuck again: exited with status {code} after {exited_after:.1f} s")
    assert sql("SELECT state FROM cron_at_scale_workerhealth WHERE name = %s", [name])[0][0] == "exiting"

    # The supervisor's part: a new worker of the same name runs what waited.
    system.worker("wh", concurrency=2)
    wait_completed(60, timeout=60 + 3 * SLACK)
    assert job_counts() == {"completed": 60}
    wait_until(lambda: (worker_row(name) or {}).get("state") == "ok" and worker_row(name)["alive"], timeout=30,
               what="the restarted worker's row")
