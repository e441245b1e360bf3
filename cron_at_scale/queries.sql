-- The SQL of the hot path, in one place. Loaded by cron_at_scale/sql.py:
-- each query starts with a "-- name: <name>" line; parameters are %(name)s.
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: claim
-- Claim up to %(limit)s due jobs in ONE statement: lock them (skipping rows
-- another dispatcher holds), bump the attempt number, set the dispatch lease,
-- and write the attempt log rows. A one-off job moves to in_progress; a cron
-- job stays pending (the dispatcher moves its fire_at on before committing).
WITH due AS (
    SELECT id FROM cron_at_scale_job
    WHERE status = 'pending' AND fire_at <= statement_timestamp()
    ORDER BY fire_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE cron_at_scale_job AS j
    SET status = CASE WHEN j.schedule_type = 'once' THEN 'in_progress' ELSE j.status END,
        attempts = j.attempts + 1,
        locked_by = %(dispatcher)s,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        updated_at = statement_timestamp()
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.attempts, j.fire_at, j.schedule_type, j.cron_expr, j.timezone,
              j.task, j.payload, j.queue, j.options
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
    SELECT id, attempts, fire_at, statement_timestamp(), statement_timestamp() + make_interval(secs => %(lease)s), 'dispatched'
    FROM claimed
)
SELECT id, attempts, fire_at, schedule_type, cron_expr, timezone, task, payload, queue, options, statement_timestamp()
FROM claimed;

-- name: advance_cron
-- Move claimed cron jobs on to their next fire_at (computed from the
-- scheduled fire_at, so the schedule never drifts), in the claim's transaction.
UPDATE cron_at_scale_job AS j
SET fire_at = v.fire_at, locked_by = '', locked_until = NULL
FROM unnest(%(ids)s::uuid[], %(fire_ats)s::timestamptz[]) AS v(id, fire_at)
WHERE j.id = v.id;

-- name: start_attempt
-- A worker starts an attempt: one statement. Only a 'dispatched' attempt
-- starts, so a redelivered message (already started) or a superseded one
-- (reaped) returns no row and is skipped. A job cancelled since its claim is
-- recorded as a cancelled attempt and not run.
UPDATE cron_at_scale_jobattempt AS a
SET started_at = statement_timestamp(),
    outcome = CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE 'running' END,
    finished_at = CASE WHEN j.status = 'cancelled' THEN statement_timestamp() END,
    worker = %(worker)s,
    locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
FROM cron_at_scale_job AS j
WHERE a.job_id = %(job_id)s AND a.attempt = %(attempt)s AND a.outcome = 'dispatched'
  AND j.id = a.job_id
RETURNING a.outcome, a.scheduled_at, j.schedule_type, j.cancel_requested, j.retries, j.max_retries, j.options;

-- name: finish_attempt
-- Close an attempt and, for a one-off job still on this attempt, set its
-- final status. An attempt whose job was cancelled while it ran ends
-- 'cancelled' whatever the task returned (cooperative cancellation).
WITH a AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET finished_at = statement_timestamp(),
        outcome = CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE %(outcome)s END,
        error = %(error)s, traceback = %(traceback)s
    FROM cron_at_scale_job AS j
    WHERE a.job_id = %(job_id)s AND a.attempt = %(attempt)s AND a.finished_at IS NULL AND j.id = a.job_id
    RETURNING a.job_id
)
UPDATE cron_at_scale_job AS j
SET status = %(status)s, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
FROM a
WHERE j.id = a.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress'
  AND j.attempts = %(attempt)s;

-- name: retry_attempt
-- Close an attempt as retried and put its one-off job back to pending after
-- %(delay)s seconds of backoff (database clock), one retry used.
WITH a AS (
    UPDATE cron_at_scale_jobattempt
    SET finished_at = statement_timestamp(), outcome = 'retried', error = %(error)s, traceback = %(traceback)s
    WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND finished_at IS NULL
    RETURNING job_id
)
UPDATE cron_at_scale_job AS j
SET status = 'pending', fire_at = statement_timestamp() + make_interval(secs => %(delay)s),
    retries = j.retries + 1, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
FROM a
WHERE j.id = a.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress'
  AND j.attempts = %(attempt)s;

-- name: heartbeat
-- Extend the leases of attempts running in this worker process (and of their
-- one-off jobs, so the admin shows a live lease); report which of their jobs
-- were cancelled meanwhile.
WITH hb AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
    FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
    WHERE a.job_id = r.job_id AND a.attempt = r.attempt AND a.finished_at IS NULL
    RETURNING a.job_id, a.attempt, a.locked_until
), jobs AS (
    UPDATE cron_at_scale_job AS j
    SET locked_until = hb.locked_until
    FROM hb
    WHERE j.id = hb.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = hb.attempt
)
SELECT j.id FROM cron_at_scale_job AS j JOIN hb ON hb.job_id = j.id
WHERE j.cancel_requested;

-- name: reap
-- Attempts whose lease expired with nobody finishing them (a dead worker, a
-- lost broker message, a dispatcher killed before publishing) are marked
-- lost. Safe with many dispatchers reaping at once (SKIP LOCKED).
WITH expired AS (
    SELECT id FROM cron_at_scale_jobattempt
    WHERE finished_at IS NULL AND locked_until < statement_timestamp()
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE cron_at_scale_jobattempt AS a
SET outcome = 'lost', finished_at = statement_timestamp(),
    error = 'lease expired: the worker died or the message was lost'
FROM expired
WHERE a.id = expired.id
RETURNING a.job_id, a.attempt, a.scheduled_at;

-- name: reap_once
-- One-off jobs of lost attempts go back to pending, to fire again at once
-- with the next attempt number, or fail once they lost %(max_lost)s attempts
-- (a poison job that kills its worker must end, in the dead-letter queue).
UPDATE cron_at_scale_job AS j
SET status = CASE WHEN j.lost_attempts + 1 >= %(max_lost)s THEN 'failed' ELSE 'pending' END,
    fire_at = CASE WHEN j.lost_attempts + 1 >= %(max_lost)s THEN j.fire_at ELSE statement_timestamp() END,
    lost_attempts = j.lost_attempts + 1,
    locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS l(job_id, attempt)
WHERE j.id = l.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = l.attempt
RETURNING j.id, j.status, j.attempts, j.task;

-- name: refire_cron
-- A lost run of a live cron job fires again under a new attempt number, for
-- the same scheduled occurrence, until that occurrence lost %(max_lost)s runs.
WITH j AS (
    UPDATE cron_at_scale_job AS j
    SET attempts = j.attempts + 1, lost_attempts = j.lost_attempts + 1, updated_at = statement_timestamp()
    WHERE j.id = %(job_id)s AND j.schedule_type = 'cron' AND j.status = 'pending'
      AND (SELECT count(*) FROM cron_at_scale_jobattempt AS a
           WHERE a.job_id = %(job_id)s AND a.scheduled_at = %(scheduled_at)s AND a.outcome = 'lost') < %(max_lost)s
    RETURNING j.id, j.attempts, j.schedule_type, j.cron_expr, j.timezone, j.task, j.payload, j.queue, j.options
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
    SELECT id, attempts, %(scheduled_at)s, statement_timestamp(),
           statement_timestamp() + make_interval(secs => %(lease)s), 'dispatched'
    FROM j
)
SELECT id, attempts, %(scheduled_at)s::timestamptz, schedule_type, cron_expr, timezone, task, payload, queue, options
FROM j;

-- name: requeue
-- Failed jobs back to pending, due now, with their retries and lost attempts reset.
UPDATE cron_at_scale_job
SET status = 'pending', fire_at = statement_timestamp(), retries = 0, lost_attempts = 0,
    cancel_requested = false, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
WHERE id = ANY(%(job_ids)s::uuid[]) AND status = 'failed'
  AND (key IS NULL OR NOT EXISTS (
      SELECT 1 FROM cron_at_scale_job AS live
      WHERE live.key = cron_at_scale_job.key AND live.status IN ('pending', 'in_progress')))
RETURNING id;

-- name: cancel
-- Cancel a job unless it already finished; a running attempt sees the flag at
-- its next heartbeat (cooperative cancellation).
UPDATE cron_at_scale_job
SET status = 'cancelled', cancel_requested = true, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
WHERE id = %(job_id)s AND status IN ('pending', 'in_progress')
RETURNING id;

-- name: db_now
SELECT statement_timestamp();
