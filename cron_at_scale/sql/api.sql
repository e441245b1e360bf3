-- The public API's statements: bulk scheduling, cancel, requeue, pause, resume, changes under a
-- row lock (cron_at_scale/api/).
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: requeue  -- run by: cron_at_scale.api.control
-- Failed jobs back to pending, due now, with their retries and lost attempts reset.
UPDATE cron_at_scale_job
SET status = 'pending', fire_at = statement_timestamp(), retries = 0, lost_attempts = 0, dispatch_losses = 0,
    cancel_requested = false, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
WHERE id = ANY(%(job_ids)s::uuid[]) AND status = 'failed'
  AND (key IS NULL OR NOT EXISTS (
      SELECT 1 FROM cron_at_scale_job AS live
      WHERE live.key = cron_at_scale_job.key AND live.status IN ('pending', 'in_progress')))
RETURNING id;

-- name: cancel  -- run by: cron_at_scale.api.control
-- Cancel a job unless it already finished; a running attempt sees the flag at
-- its next heartbeat (cooperative cancellation).
UPDATE cron_at_scale_job
SET status = 'cancelled', cancel_requested = true, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
WHERE id = %(job_id)s AND status IN ('pending', 'in_progress', 'paused')
RETURNING id;

-- name: pause  -- run by: cron_at_scale.api.control
-- Hold a recurring job; its pending occurrence stays where it is.
UPDATE cron_at_scale_job
SET status = 'paused', pause_note = %(note)s, updated_at = statement_timestamp()
WHERE id = %(job_id)s AND schedule_type <> 'once' AND status = 'pending'
RETURNING id;

-- name: resume  -- run by: cron_at_scale.api.control
-- Back to pending: the occurrences that fell due while paused follow the
-- job's catch-up policy at its next claim. resumed_at: none of them makes
-- the job overdue before its grace from now (cron_at_scale.maintenance.overdue).
UPDATE cron_at_scale_job
SET status = 'pending', pause_note = '', resumed_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = %(job_id)s AND status = 'paused'
RETURNING id;

-- name: lock_job  -- run by: cron_at_scale.api.control
-- A job row locked for a change (reschedule, resume with missed=): a claim holding it
-- commits first, a later claim skips it (SKIP LOCKED) until this transaction ends, so
-- no claim sees it half changed. The columns the claim returns (db_now: read after the
-- lock, by db_now), so that the change can move it on as a claim would (advance_recurring).
SELECT id, attempts, fire_at, schedule_type, cron_expr, timezone, task, payload, queue, options, interval,
       occurrence_at, catchup, catchup_window, overlap, jitter, buffered_at, locked_until, status,
       NULL::timestamptz AS db_now
FROM cron_at_scale_job
WHERE id = %(job_id)s
FOR UPDATE;

-- name: supersede_held_runs  -- run by: cron_at_scale.api.control
-- A rescheduled job's runs claimed ahead of their time (within the look-ahead) and not
-- started: occurrences of the old schedule after the change. They end 'skipped'; their
-- messages, sent at their time, find no 'dispatched' attempt and are not run
-- (start_attempt). A run already started goes on under its own number.
UPDATE cron_at_scale_jobattempt
SET outcome = 'skipped', finished_at = statement_timestamp(), error = 'not run: the job was rescheduled'
WHERE job_id = %(job_id)s AND finished_at IS NULL AND outcome = 'dispatched' AND scheduled_at > %(now)s
RETURNING attempt;

-- name: copy_jobs  -- run by: cron_at_scale.api.bulk
-- schedule_many's fast path (cron_at_scale/api/bulk.py): rows streamed in COPY's text format, in
-- this column order; the other columns take their database defaults.
COPY cron_at_scale_job (id, fire_at, payload, task, queue, options, timezone, max_retries,
                        schedule_type, cron_expr, interval, occurrence_at, catchup, catchup_window, overlap, jitter,
                        status, trace_context)
FROM STDIN;
