"""The planted bugs: each one a promise of docs/guarantees.md rules out, and the tests of that promise's
proof that must fail on it.

A mutant is one or more exact edits of files under ``cron_at_scale/`` (Python or ``sql/*.sql``). Each
``old`` text must occur exactly once in today's source: a refactor that moves it makes the mutant stale,
and ``test_mutants.py`` fails saying so instead of running a bug that is not planted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    file: str  # relative to the repository root: cron_at_scale/...
    old: str  # occurs exactly once in the file
    new: str


@dataclass(frozen=True)
class Mutant:
    id: str
    promise: int  # its number in docs/guarantees.md
    what: str  # the bug, in one line
    edits: tuple[Edit, ...]
    killers: tuple[str, ...]  # pytest node ids (a parametrized test: every case runs, one must fail)
    # processes the killers start that must import the mutant too: argv words ("celery", "cron_dispatcher")
    spawns: tuple[str, ...] = ()


WORKER_SQL = "cron_at_scale/sql/worker.sql"
MAINTENANCE_SQL = "cron_at_scale/sql/maintenance.sql"
DISPATCHER_SQL = "cron_at_scale/sql/dispatcher.sql"

FAULTS = "tests/faults/test_faults.py::"
SQL_TESTS = "tests/integration/test_sql.py::"
BOTH = ("celery", "cron_dispatcher")

# Both start statements (one message: start_attempt; a batch: start_attempts) refuse a start before
# its scheduled_at, and say how early (the 'early' row)
_NO_START_CHECK = (
    Edit(WORKER_SQL, "      AND a.scheduled_at <= statement_timestamp()\n    RETURNING a.outcome,",
         "    RETURNING a.outcome,"),
    Edit(WORKER_SQL, "AND a.outcome = 'dispatched' AND a.scheduled_at > statement_timestamp();",
         "AND false;"),
    Edit(WORKER_SQL, "      AND a.scheduled_at <= statement_timestamp()\n    RETURNING t.token, a.outcome,",
         "    RETURNING t.token, a.outcome,"),
    Edit(WORKER_SQL, "WHERE a.outcome = 'dispatched' AND a.scheduled_at > statement_timestamp();",
         "WHERE false;"),
)
BATCH_TESTS = "tests/integration/test_worker_batch_start.py::"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("A", 1, "start_attempt commits asynchronously (synchronous_commit off for the start)",
           (Edit(WORKER_SQL, "-- name: start_attempt :prepared  -- run by:",
                 "-- name: start_attempt :prepared :async  -- run by:"),),
           (FAULTS + "test_an_attempt_started_before_a_postgres_crash_never_runs_again_under_its_number",),
           BOTH),
    Mutant("B", 1, "no fencing in start_attempt: a second delivery of a started attempt starts it again",
           (Edit(WORKER_SQL, "SELECT CASE WHEN r.outcome = 'dispatched' OR r.run_token = %(token)s THEN r.id ELSE (",
                 "SELECT CASE WHEN true THEN r.id ELSE ("),
            Edit(WORKER_SQL, "      AND (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)\n"
                             "           OR (r.outcome = 'running' AND r.run_token = %(token)s))\n",
                 "      AND true\n"),
            Edit(WORKER_SQL, "      AND (a.outcome = 'dispatched' OR (a.outcome = 'running' AND a.run_token = %(token)s))"
                             " AND j.id = a.job_id",
                 "      AND j.id = a.job_id")),
           (SQL_TESTS + "test_a_start_retried_after_its_commit_runs_its_attempt_and_a_duplicate_is_still_skipped",)),
    Mutant("C", 1, "the reaper reaps a running attempt 2 s after it started, whatever its lease",
           (Edit(MAINTENANCE_SQL, "    WHERE finished_at IS NULL AND locked_until < statement_timestamp()\n",
                 "    WHERE finished_at IS NULL AND (locked_until < statement_timestamp()\n"
                 "           OR started_at < statement_timestamp() - interval '2 seconds')\n"),),
           (FAULTS + "test_long_tasks_on_healthy_workers_run_once_under_their_first_attempt",),
           BOTH),
    Mutant("D", 2, "the success of an attempt reaped as lost while it ran is dropped",
           (Edit(WORKER_SQL, "      AND (a.outcome IN ('dispatched', 'running') OR (a.outcome = 'lost' AND a.started_at IS NOT NULL))",
                 "      AND a.outcome IN ('dispatched', 'running')"),),
           (SQL_TESTS + "test_the_success_of_a_run_reaped_while_it_stalled_completes_its_job",
            FAULTS + "test_the_success_of_a_worker_stalled_past_its_run_lease_is_recorded",
            SQL_TESTS + "test_a_random_walk_of_transitions_keeps_jobs_and_attempts_in_step"),
           BOTH),
    Mutant("E", 4, "runs claimed ahead go out at once, without an eta, and the start does not check scheduled_at",
           (Edit("cron_at_scale/dispatcher/loop.py", "                if at <= mono:\n                    due.append(run)\n",
                 "                if True:\n                    due.append(run)\n"),
            *_NO_START_CHECK),
           ("tests/acceptance/test_dispatcher_timers.py::"
            "test_a_worker_whose_clock_steps_ahead_starts_nothing_before_its_fire_at",),
           BOTH),
    Mutant("F", 4, "a start (one message's or a batch's) that does not check scheduled_at: a worker whose clock is "
                   "ahead starts early",
           _NO_START_CHECK,
           (SQL_TESTS + "test_a_start_before_its_fire_at_by_the_database_clock_is_refused_and_says_how_early",
            BATCH_TESTS + "test_one_statement_starts_a_batch_by_the_rules_of_a_single_start")),
    Mutant("G", 7, "a cancel committed before the start (one message's or a batch's) is not seen by it: the task runs",
           (Edit(WORKER_SQL, "        outcome = CASE WHEN j.status = 'cancelled' THEN 'cancelled'\n"
                             "                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'\n"
                             "                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)",
                 "        outcome = CASE WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'\n"
                 "                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)"),
            Edit(WORKER_SQL, "                       WHEN j.status = 'cancelled' THEN 'cancelled'\n"
                             "                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'\n"
                             "                       WHEN statement_timestamp() > a.scheduled_at + t.expiry THEN 'skipped'",
                 "                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'\n"
                 "                       WHEN statement_timestamp() > a.scheduled_at + t.expiry THEN 'skipped'")),
           ("tests/acceptance/test_dispatcher_loop.py::test_a_job_cancelled_after_its_claim_is_skipped_and_recorded",
            BATCH_TESTS + "test_one_statement_starts_a_batch_by_the_rules_of_a_single_start"),
           ("celery",)),
    Mutant("H", 6, "the overlap check (skip, buffer_one) reads the claim's snapshot, taken before its row locks",
           (Edit(DISPATCHER_SQL, "       clock_timestamp() AS db_clock\nFROM rows AS c;",
                 "       clock_timestamp() AS db_clock,\n"
                 "       EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS x WHERE x.job_id = c.id\n"
                 "               AND x.finished_at IS NULL) AS busy\nFROM rows AS c;"),
            Edit("cron_at_scale/dispatcher/advance.py",
                 '    busy = {r.job_id for r in db.run("running_jobs", {"ids": db.array(watched)}, retries=0)}'
                 " if watched else set()",
                 "    busy = {row.id for row in rows if row.busy}")),
           (SQL_TESTS + "test_the_overlap_check_sees_a_run_committed_after_the_claims_snapshot",)),
    Mutant("I", 5, "the catch-up window counted from the nominal occurrence, not from the due time with jitter",
           (Edit("cron_at_scale/policy/recurrence.py", "        if due_at < window_start:",
                 "        if t < window_start:"),),
           ("tests/unit/test_policy_recurrence.py::test_jitter_never_turns_an_on_time_run_into_a_missed_one",)),
    Mutant("J", 3, "an attempt lost before any worker started it counts toward MAX_LOST_ATTEMPTS",
           (Edit(MAINTENANCE_SQL, "SET status = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s",
                 "SET status = CASE WHEN j.lost_attempts + 1 >= %(max_lost)s"),
            Edit(MAINTENANCE_SQL, "    fire_at = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s",
                 "    fire_at = CASE WHEN j.lost_attempts + 1 >= %(max_lost)s"),
            Edit(MAINTENANCE_SQL, "    lost_attempts = j.lost_attempts + CASE WHEN l.started THEN 1 ELSE 0 END,\n"
                                  "    dispatch_losses",
                 "    lost_attempts = j.lost_attempts + 1,\n    dispatch_losses")),
           ("tests/integration/test_maintenance_reaper.py::"
            "test_attempts_lost_before_any_worker_started_them_never_fail_the_job",)),
    Mutant("K", 8, "the watchdog never finds a worker stuck (so it neither reports, recovers nor exits)",
           (Edit("cron_at_scale/worker/health.py", '        if self.state == "ok":\n'
                                                   '            self.state, self.stuck_at = "stuck", now\n',
                 '        if False:\n            self.state, self.stuck_at = "stuck", now\n'),),
           ("tests/integration/test_worker_health.py::"
            "test_a_worker_that_stops_consuming_is_reported_recovers_then_exits_and_no_job_fails",),
           BOTH),
    Mutant("L", 5, "a lost run of a recurring job paused after it fired is not fired again (its occurrence missed)",
           (Edit(MAINTENANCE_SQL, "AND j.schedule_type <> 'once' AND j.status IN ('pending', 'paused')",
                 "AND j.schedule_type <> 'once' AND j.status = 'pending'"),),
           (SQL_TESTS + "test_a_paused_recurring_jobs_lost_run_fires_again",)),
    Mutant("M", 2, "a run fired again after an earlier attempt's success runs instead of being skipped",
           (Edit(WORKER_SQL, "                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'\n"
                             "                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)",
                 "                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)"),),
           (SQL_TESTS + "test_the_success_of_a_run_reaped_while_it_stalled_completes_its_job",)),
    Mutant("N", 4, "a run reaped before its fire_at is due again at once (fires early)",
           (Edit(MAINTENANCE_SQL, "                   ELSE GREATEST(j.fire_at, statement_timestamp()) END,",
                 "                   ELSE statement_timestamp() END,"),),
           (SQL_TESTS + "test_a_run_reaped_before_its_fire_at_is_not_due_again_before_it",)),
    Mutant("O", 7, "a running attempt never learns of its job's cancel (the heartbeat drops it)",
           (Edit(WORKER_SQL, "WHERE j.cancel_requested\nUNION ALL", "WHERE false\nUNION ALL"),),
           ("tests/acceptance/test_worker_retry_policy.py::test_cancelling_a_running_job_reaches_it_through_the_heartbeat",),
           BOTH),
    Mutant("P", 1, "a redelivered message of a run that started and was reaped takes over the attempt fired again",
           (Edit(WORKER_SQL, "      AND (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)\n",
                 "      AND (r.outcome = 'dispatched' OR r.outcome = 'lost'\n"),),
           ("tests/integration/test_maintenance_reaper.py::test_only_a_message_lost_before_any_start_takes_over",)),
    Mutant("Q", 3, "a run that kills its pool process is left to its lease: counted lost, not failed by its policy",
           (Edit("cron_at_scale/worker/lost.py",
                 "    request = _requests.pop(task_id, None)  # popped: Celery 5.7 reports a hard time limit twice\n",
                 "    return\n    request = _requests.pop(task_id, None)\n"),),
           ("tests/acceptance/test_worker_lost.py::"
            "test_a_run_that_sigkills_its_process_fails_with_that_cause_by_its_retry_policy",),
           ("celery",)),
    Mutant("R", 1, "start_attempts (a batch started by the worker's main process) commits asynchronously",
           (Edit(WORKER_SQL, "-- name: start_attempts :prepared  -- run by:",
                 "-- name: start_attempts :prepared :async  -- run by:"),),
           (FAULTS + "test_an_attempt_started_in_a_batch_before_a_postgres_crash_never_runs_again_under_its_number",),
           BOTH),
    Mutant("S", 1, "no fencing in start_attempts: a message of a batch whose attempt another delivery started starts it "
                   "again",
           (Edit(WORKER_SQL, "           CASE WHEN r.outcome = 'dispatched' OR r.run_token = m.token THEN r.id ELSE (",
                 "           CASE WHEN true THEN r.id ELSE ("),
            Edit(WORKER_SQL, "    WHERE (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)\n"
                             "           OR (r.outcome = 'running' AND r.run_token = m.token))\n",
                 "    WHERE true\n"),
            Edit(WORKER_SQL, "      AND (a.outcome = 'dispatched' OR (a.outcome = 'running' AND a.run_token = t.token))"
                             " AND j.id = a.job_id",
                 "      AND j.id = a.job_id")),
           (BATCH_TESTS + "test_one_statement_starts_a_batch_by_the_rules_of_a_single_start",)),
    Mutant("T", 5, "a start (one message's or a batch's) ignores the occurrence its message names: a stale message "
                   "of a claim lost in a crash runs another occurrence's re-fire under the reused number",
           (Edit(WORKER_SQL, "           OR r.scheduled_at = %(fire_at)s::timestamptz)", "           OR true)"),
            Edit(WORKER_SQL, "OR m.fire_at IS NULL OR r.scheduled_at = m.fire_at)", "OR true)")),
           ("tests/integration/test_worker_attempts.py::"
            "test_a_stale_message_of_a_lost_claim_never_runs_another_occurrence_under_its_number",)),
    Mutant("U", 2, "a success waits 3 s for a next start before its completion is written (promise 2's window is 50 ms)",
           (Edit("cron_at_scale/worker/attempts.py", "COMPLETION_DELAY = 0.05", "COMPLETION_DELAY = 3.0"),),
           (FAULTS + "test_a_success_is_kept_when_its_idle_worker_is_killed_after_the_window",),
           ("celery",)),
    Mutant("V", 7, "a run's retry puts its job back to pending whatever its status: a cancelled job fires again",
           (Edit(WORKER_SQL, "WHERE j.id = a.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress'\n  AND j.attempts = %(attempt)s;",
                 "WHERE j.id = a.job_id AND j.schedule_type = 'once'\n  AND j.attempts = %(attempt)s;"),),
           (SQL_TESTS + "test_a_random_walk_of_transitions_keeps_jobs_and_attempts_in_step",)),
)

BY_ID = {m.id: m for m in MUTANTS}
