-- The SQL of the hot path, the workers' half: an attempt started, finished, retried, its lease
-- renewed, its result kept; a dead pool process's run; the worker's health row (cron_at_scale/worker/).
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: start_attempt :prepared  -- run by: cron_at_scale.worker.attempts
-- A worker starts an attempt, and writes the succeeded attempts its process
-- handed over since its last write: one statement, one round trip per task.
-- Only a 'dispatched' attempt starts, so a redelivered message (already
-- started) or a superseded one returns no row and is skipped, as is a recurring
-- run's message whose %(fire_at)s is not its attempt's scheduled_at (a number handed
-- out again after a lost claim, see start_attempts). A job
-- cancelled since its claim is recorded as a cancelled attempt and not run.
-- A one-off job already completed (an earlier attempt, reaped while it stalled,
-- succeeded after all) is recorded as a skipped attempt and not run.
-- The process's writer thread runs this with job_id NULL (starts nothing)
-- when no task follows within a few ms.
-- A run not started within its job's options.expires seconds of its scheduled
-- time is recorded as a skipped attempt ('expired: ...') and not run; the job
-- counts it in expired_runs and, if one-off, ends cancelled (Celery revokes an
-- expired task: it never ran). Only the winning start counts it (the job update
-- reads the attempt update's own RETURNING), and never for a job completed by
-- this same statement (one row is not updated twice in one statement).
-- The succeeded attempts: closed, and their one-off job completed, also when
-- the attempt's lease had run out and the job fired again (a success is never
-- discarded); an attempt whose job was cancelled meanwhile ends 'cancelled'.
-- %(token)s is this start's own id: a retry of the statement whose first try
-- committed but whose reply was lost finds its attempt 'running' under the same
-- token and runs it, instead of skipping it as a duplicate.
-- Synchronous commit, on purpose: the attempt number is a fencing token, and a
-- start lost in a crash of PostgreSQL would let the same (job, attempt) be
-- claimed and run again. Its flush also makes durable the claim before it
-- (asynchronous) and the completions it carries.
-- Nothing starts before its scheduled_at on this clock: a message published ahead of its
-- fire_at (ETA_LEAD) that a worker runs early (its clock ahead) gets an 'early' row instead.
-- Every table is reached by primary key or (job_id, attempt) from the pairs given,
-- never through a join the planner could turn around: the statement's one generic
-- plan (made at the first EXECUTE of a connection, maybe while the tables looked
-- empty) must not walk an index or a table at every task.
WITH done AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET finished_at = statement_timestamp(),
        outcome = CASE WHEN (SELECT j.status FROM cron_at_scale_job AS j WHERE j.id = a.job_id) = 'cancelled'
                       THEN 'cancelled' ELSE 'succeeded' END
    WHERE a.id = ANY(ARRAY(
        SELECT o.id FROM unnest(%(done_job_ids)s::uuid[], %(done_attempts)s::int[]) AS r(job_id, attempt)
        CROSS JOIN LATERAL (SELECT id FROM cron_at_scale_jobattempt  -- LIMIT 1: kept a lookup per pair
                            WHERE job_id = r.job_id AND attempt = r.attempt LIMIT 1) AS o))
      -- unfinished (the same rows as finished_at IS NULL), said so that the partial
      -- index on unfinished attempts does not look like a shortcut to the planner;
      -- or reaped as lost while it ran (a stalled worker): its success still counts
      AND (a.outcome IN ('dispatched', 'running') OR (a.outcome = 'lost' AND a.started_at IS NOT NULL))
    RETURNING a.job_id, a.attempt, a.scheduled_at, a.outcome
), succeeded AS (
    -- per job: the latest scheduled time one of its runs here succeeded for (NULL: none did)
    SELECT job_id, max(scheduled_at) FILTER (WHERE outcome = 'succeeded') AS occurrence FROM done GROUP BY job_id
), completed AS (
    UPDATE cron_at_scale_job AS j
    SET status = CASE WHEN j.schedule_type = 'once' THEN 'completed' ELSE j.status END,
        -- a recurring job with a buffered occurrence (overlap buffer_one) is due now
        fire_at = CASE WHEN j.schedule_type = 'once' OR j.status <> 'pending' OR j.buffered_at IS NULL THEN j.fire_at
                       ELSE statement_timestamp() END,
        locked_by = CASE WHEN j.schedule_type = 'once' THEN '' ELSE j.locked_by END,
        locked_until = CASE WHEN j.schedule_type = 'once' THEN NULL ELSE j.locked_until END,
        -- a recurring job's latest success (cron_at_scale.maintenance.overdue); due_since clears when the
        -- success is for the occurrence it waits on or a later one
        (last_success_at, last_success_occurrence, due_since) = (
            SELECT CASE WHEN j.schedule_type = 'once' OR s.occurrence IS NULL THEN j.last_success_at
                        ELSE statement_timestamp() END,
                   CASE WHEN j.schedule_type = 'once' THEN j.last_success_occurrence
                        ELSE GREATEST(j.last_success_occurrence, s.occurrence) END,
                   CASE WHEN j.due_since <= s.occurrence THEN NULL ELSE j.due_since END
            FROM succeeded AS s WHERE s.job_id = j.id),
        -- not on a plain recurring success: updated_at is indexed, and leaving every indexed
        -- column as it was keeps that write a HOT update
        updated_at = CASE WHEN j.schedule_type <> 'once' AND (j.status <> 'pending' OR j.buffered_at IS NULL)
                          THEN j.updated_at ELSE statement_timestamp() END
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM done)) AND (
        -- whichever attempt succeeded: a re-fired, retrying or lost-count-failed job is done
        (j.schedule_type = 'once' AND j.status IN ('in_progress', 'pending', 'failed'))
        OR j.schedule_type <> 'once')
    RETURNING j.id
), target AS (
    -- The attempt to start: the message's own if still 'dispatched'. If it was marked
    -- lost before any worker started it (its dispatch lease ran out while it waited in
    -- a long queue) and the job fired again, this message takes over the next attempt
    -- still 'dispatched' (of the same occurrence, for a recurring job; none started in
    -- between): the job runs now, not a whole queue later, and that attempt's own
    -- message finds it started and is skipped.
    SELECT CASE WHEN r.outcome = 'dispatched' OR r.run_token = %(token)s THEN r.id ELSE (
               SELECT t.id FROM cron_at_scale_jobattempt AS t
               WHERE t.job_id = r.job_id AND t.attempt > r.attempt AND t.outcome = 'dispatched'
                 AND (rj.schedule_type = 'once' OR t.scheduled_at = r.scheduled_at)
                 AND NOT EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS x
                                 WHERE x.job_id = r.job_id AND x.attempt > r.attempt AND x.attempt < t.attempt
                                   AND x.started_at IS NOT NULL
                                   AND (rj.schedule_type = 'once' OR x.scheduled_at = r.scheduled_at))
               ORDER BY t.attempt LIMIT 1) END AS id,
           -- the job's expiry (options.expires, a JSON number), none for a job this statement completes
           CASE WHEN jsonb_typeof(rj.options->'expires') = 'number' AND rj.id <> ALL(ARRAY(SELECT id FROM completed))
                THEN make_interval(secs => (rj.options->>'expires')::float8) END AS expiry
    FROM cron_at_scale_jobattempt AS r, cron_at_scale_job AS rj
    WHERE r.job_id = %(job_id)s AND r.attempt = %(attempt)s AND rj.id = %(job_id)s
      AND (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)
           OR (r.outcome = 'running' AND r.run_token = %(token)s))
      -- a recurring run's number must still be this message's occurrence (see start_attempts)
      AND (rj.schedule_type = 'once' OR %(fire_at)s::timestamptz IS NULL
           OR r.scheduled_at = %(fire_at)s::timestamptz)
), started AS (
    UPDATE cron_at_scale_jobattempt AS a
    -- Confirming its own start (a batch's, or a try whose reply was lost) the task has not begun
    -- either: the same checks, so a run cancelled or expired since the batch started is not run.
    SET started_at = statement_timestamp(),  -- also when confirming its own start: a begun run's mark
        outcome = CASE WHEN j.status = 'cancelled' THEN 'cancelled'
                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'
                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target) THEN 'skipped'
                       ELSE 'running' END,
        finished_at = CASE WHEN j.status = 'cancelled' OR (j.schedule_type = 'once' AND j.status = 'completed')
                                OR statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)
                           THEN statement_timestamp() END,
        error = CASE WHEN j.status = 'cancelled' THEN a.error
                     WHEN j.schedule_type = 'once' AND j.status = 'completed'
                     THEN 'not run: an earlier attempt of this job succeeded'
                     WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target)
                     THEN 'expired: not started within ' || trim_scale((j.options->>'expires')::numeric)
                          || ' s of its occurrence'
                     ELSE a.error END,
        worker = %(worker)s,
        run_token = %(token)s,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
    FROM cron_at_scale_job AS j
    WHERE a.id = (SELECT id FROM target)
      AND (a.outcome = 'dispatched' OR (a.outcome = 'running' AND a.run_token = %(token)s)) AND j.id = a.job_id
      AND a.scheduled_at <= statement_timestamp()
    RETURNING a.outcome, a.scheduled_at, j.schedule_type, j.cancel_requested, j.retries, j.max_retries, j.options,
              a.started_at, j.created_at, a.attempt, a.job_id, a.error, j.queue, j.trace_context,
              a.outcome = 'skipped' AND a.error LIKE 'expired:%%' AS expired,
              -- a one-off job still on this attempt ends with it
              j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = a.attempt AS ends
), expired AS (
    UPDATE cron_at_scale_job AS j
    SET expired_runs = j.expired_runs + 1,
        status = CASE WHEN (SELECT ends FROM started) THEN 'cancelled' ELSE j.status END,
        locked_by = CASE WHEN (SELECT ends FROM started) THEN '' ELSE j.locked_by END,
        locked_until = CASE WHEN (SELECT ends FROM started) THEN NULL ELSE j.locked_until END,
        updated_at = statement_timestamp()
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM started WHERE expired))
)
SELECT outcome, scheduled_at, schedule_type, cancel_requested, retries, max_retries, options, started_at,
       created_at, error, queue, trace_context, 0.0::float8 AS early_by, attempt
FROM started
UNION ALL
-- Not due yet on the database clock (a message published ETA_LEAD ahead, run by a worker whose
-- clock is ahead): nothing changes, and the worker learns how many seconds early it is.
SELECT 'early', a.scheduled_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM a.scheduled_at - statement_timestamp())::float8, a.attempt
FROM cron_at_scale_jobattempt AS a
WHERE a.id = (SELECT id FROM target) AND a.outcome = 'dispatched' AND a.scheduled_at > statement_timestamp();

-- name: start_attempts :prepared  -- run by: cron_at_scale.worker.attempts
-- start_attempt for a batch: the messages a worker's main process received
-- together (BATCH_STARTS), started in one statement, one transaction and one
-- flush before any of them is handed to a pool process. Per message (job_id,
-- attempt, token) the same rules as start_attempt: a row only for an attempt
-- this message starts ('running'), records as not to run ('cancelled',
-- 'skipped': a completed one-off job, an expired run), or finds not due yet
-- ('early': nothing changes); none for a redelivered or superseded message.
-- Two messages of one batch that would start the same attempt: one row, under
-- the token of the one that won. It carries no completions (the main process
-- has none), so a job's update here is only its expiry's.
-- Synchronous commit, as start_attempt's: the attempt number is a fencing token.
WITH msg AS MATERIALIZED (
    SELECT m.job_id, m.attempt, m.token, m.fire_at
    FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[], %(tokens)s::uuid[], %(fire_ats)s::timestamptz[])
         AS m(job_id, attempt, token, fire_at)
), target AS MATERIALIZED (
    SELECT m.token,
           CASE WHEN r.outcome = 'dispatched' OR r.run_token = m.token THEN r.id ELSE (
               SELECT t.id FROM cron_at_scale_jobattempt AS t
               WHERE t.job_id = r.job_id AND t.attempt > r.attempt AND t.outcome = 'dispatched'
                 AND (rj.schedule_type = 'once' OR t.scheduled_at = r.scheduled_at)
                 AND NOT EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS x
                                 WHERE x.job_id = r.job_id AND x.attempt > r.attempt AND x.attempt < t.attempt
                                   AND x.started_at IS NOT NULL
                                   AND (rj.schedule_type = 'once' OR x.scheduled_at = r.scheduled_at))
               ORDER BY t.attempt LIMIT 1) END AS id,
           CASE WHEN jsonb_typeof(rj.options->'expires') = 'number'
                THEN make_interval(secs => (rj.options->>'expires')::float8) END AS expiry
    FROM msg AS m
    CROSS JOIN LATERAL (SELECT id, job_id, attempt, outcome, run_token, scheduled_at, started_at
                        FROM cron_at_scale_jobattempt
                        WHERE job_id = m.job_id AND attempt = m.attempt LIMIT 1) AS r
    CROSS JOIN LATERAL (SELECT id, schedule_type, options FROM cron_at_scale_job WHERE id = m.job_id LIMIT 1) AS rj
    WHERE (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)
           OR (r.outcome = 'running' AND r.run_token = m.token))
      -- A recurring run's number must still be this message's occurrence (its fire_at, NULL: not
      -- checked). A claim commits asynchronously: lost in a crash of PostgreSQL with its messages
      -- sent, its numbers are handed out again, maybe first to a re-fire of another occurrence,
      -- whose run this stale message would otherwise take (that occurrence never running as
      -- itself). A one-off job's stale message runs the job's attempt of that number, as it must.
      AND (rj.schedule_type = 'once' OR m.fire_at IS NULL OR r.scheduled_at = m.fire_at)
), started AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET started_at = statement_timestamp(),  -- also when confirming its own start: a begun run's mark
        outcome = CASE WHEN a.outcome = 'running' THEN 'running'
                       WHEN j.status = 'cancelled' THEN 'cancelled'
                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'
                       WHEN statement_timestamp() > a.scheduled_at + t.expiry THEN 'skipped'
                       ELSE 'running' END,
        finished_at = CASE WHEN a.outcome = 'dispatched'
                            AND (j.status = 'cancelled' OR (j.schedule_type = 'once' AND j.status = 'completed')
                                 OR statement_timestamp() > a.scheduled_at + t.expiry)
                           THEN statement_timestamp() END,
        error = CASE WHEN a.outcome <> 'dispatched' OR j.status = 'cancelled' THEN a.error
                     WHEN j.schedule_type = 'once' AND j.status = 'completed'
                     THEN 'not run: an earlier attempt of this job succeeded'
                     WHEN statement_timestamp() > a.scheduled_at + t.expiry
                     THEN 'expired: not started within ' || trim_scale((j.options->>'expires')::numeric)
                          || ' s of its occurrence'
                     ELSE a.error END,
        worker = %(worker)s,
        run_token = t.token,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
    FROM target AS t, cron_at_scale_job AS j
    WHERE a.id = ANY(ARRAY(SELECT id FROM target)) AND a.id = t.id
      AND (a.outcome = 'dispatched' OR (a.outcome = 'running' AND a.run_token = t.token)) AND j.id = a.job_id
      AND a.scheduled_at <= statement_timestamp()
    RETURNING t.token, a.outcome, a.scheduled_at, j.schedule_type, j.cancel_requested, j.retries, j.max_retries,
              j.options, a.started_at, j.created_at, a.attempt, a.job_id, a.error, j.queue, j.trace_context,
              a.outcome = 'skipped' AND a.error LIKE 'expired:%%' AS expired,
              j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = a.attempt AS ends
), expired AS (
    UPDATE cron_at_scale_job AS j
    SET expired_runs = j.expired_runs + e.runs,
        status = CASE WHEN e.ends THEN 'cancelled' ELSE j.status END,
        locked_by = CASE WHEN e.ends THEN '' ELSE j.locked_by END,
        locked_until = CASE WHEN e.ends THEN NULL ELSE j.locked_until END,
        updated_at = statement_timestamp()
    FROM (SELECT job_id, count(*) AS runs, bool_or(ends) AS ends FROM started WHERE expired GROUP BY job_id) AS e
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM started WHERE expired)) AND j.id = e.job_id
)
SELECT token, outcome, scheduled_at, schedule_type, cancel_requested, retries, max_retries, options, started_at,
       created_at, error, queue, trace_context, 0.0::float8 AS early_by, attempt
FROM started
UNION ALL
SELECT t.token, 'early', a.scheduled_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM a.scheduled_at - statement_timestamp())::float8, a.attempt
FROM target AS t
CROSS JOIN LATERAL (SELECT scheduled_at, attempt, outcome FROM cron_at_scale_jobattempt
                    WHERE id = t.id LIMIT 1) AS a
WHERE a.outcome = 'dispatched' AND a.scheduled_at > statement_timestamp();

-- name: hand_back_attempts :prepared  -- run by: cron_at_scale.worker.batch_start
-- A worker's main process stops with messages it started in a batch
-- (start_attempts) that no pool process accepted: each such attempt goes back
-- to 'dispatched', as its claim left it, under a dispatch lease. Its message
-- goes back to the broker unacknowledged, and its redelivery starts it as any
-- message; else the reaper fires it again after the lease. Never run, so never
-- counted as lost. Only an attempt still running under this batch's token.
UPDATE cron_at_scale_jobattempt AS a
SET outcome = 'dispatched', started_at = NULL, worker = '', run_token = NULL,
    locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
WHERE a.id = ANY(ARRAY(
        SELECT o.id FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
        CROSS JOIN LATERAL (SELECT id FROM cron_at_scale_jobattempt
                            WHERE job_id = r.job_id AND attempt = r.attempt LIMIT 1) AS o))
  AND a.outcome = 'running' AND a.finished_at IS NULL AND a.run_token = ANY(%(tokens)s::uuid[]);

-- name: set_aside_waiting_attempts :prepared :async  -- run by: cron_at_scale.worker.batch_start
-- Started in a batch (start_attempts) and still waiting in the worker's main process for a pool
-- process after the batch's start stopped standing for it (FRESH): no longer marked started
-- (started_at NULL), so that if the whole worker dies now, the reaper counts the attempt as lost
-- before any worker began it, not toward MAX_LOST_ATTEMPTS. The pool process that begins it
-- later starts it again under its token, which marks it started anew. Only a row still as the
-- batch left it (its token, its started_at): one a pool process started again meanwhile keeps
-- its mark. Asynchronous commit: lost in a crash of PostgreSQL, the attempt stays marked, as
-- it was (counted if the worker dies).
UPDATE cron_at_scale_jobattempt AS a
SET started_at = NULL
FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[], %(tokens)s::uuid[], %(started)s::timestamptz[])
     AS r(job_id, attempt, token, started_at)
WHERE a.id = ANY(ARRAY(
        SELECT o.id FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS k(job_id, attempt)
        CROSS JOIN LATERAL (SELECT id FROM cron_at_scale_jobattempt
                            WHERE job_id = k.job_id AND attempt = k.attempt LIMIT 1) AS o))
  AND a.job_id = r.job_id AND a.attempt = r.attempt
  AND a.outcome = 'running' AND a.finished_at IS NULL AND a.run_token = r.token AND a.started_at = r.started_at;

-- name: finish_attempt :prepared  -- run by: cron_at_scale.worker.attempts
-- Close an attempt and, for a one-off job still on this attempt, set its
-- final status. An attempt whose job was cancelled while it ran ends
-- 'cancelled' whatever the task returned (cooperative cancellation).
-- Synchronous commit: an outcome a worker wrote survives a crash of PostgreSQL.
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
SET status = CASE WHEN j.schedule_type = 'once' THEN %(status)s ELSE j.status END,
    -- a recurring job with a buffered occurrence (overlap buffer_one) is due now
    fire_at = CASE WHEN j.schedule_type = 'once' THEN j.fire_at ELSE statement_timestamp() END,
    locked_by = CASE WHEN j.schedule_type = 'once' THEN '' ELSE j.locked_by END,
    locked_until = CASE WHEN j.schedule_type = 'once' THEN NULL ELSE j.locked_until END,
    updated_at = statement_timestamp()
FROM a
WHERE j.id = a.job_id AND (
    (j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = %(attempt)s)
    OR (j.schedule_type <> 'once' AND j.status = 'pending' AND j.buffered_at IS NOT NULL));

-- name: retry_attempt :prepared  -- run by: cron_at_scale.worker.attempts
-- Close an attempt as retried and put its one-off job back to pending after
-- %(delay)s seconds of backoff (database clock), one retry used. An attempt
-- whose job was cancelled meanwhile ends 'cancelled' and the job stays so.
-- Synchronous commit: an outcome a worker wrote survives a crash of PostgreSQL.
WITH a AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET finished_at = statement_timestamp(),
        outcome = CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE 'retried' END,
        error = %(error)s, traceback = %(traceback)s
    FROM cron_at_scale_job AS j
    WHERE a.job_id = %(job_id)s AND a.attempt = %(attempt)s AND a.finished_at IS NULL AND j.id = a.job_id
    RETURNING a.job_id
)
UPDATE cron_at_scale_job AS j
SET status = 'pending', fire_at = statement_timestamp() + make_interval(secs => %(delay)s),
    retries = j.retries + 1, locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
FROM a
WHERE j.id = a.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress'
  AND j.attempts = %(attempt)s;

-- name: heartbeat :prepared :async  -- run by: cron_at_scale.worker.middleware.lease
-- Extend the leases of attempts running in this worker process (and of their
-- one-off jobs, so the admin shows a live lease); report, as (job_id, attempt,
-- reason), the runs whose job was cancelled meanwhile ('cancelled') and those
-- whose lease had already run out and were reaped ('lost': the job fired again).
-- Asynchronous commit: if PostgreSQL itself crashes in the next few ms this
-- renewal is lost; the next one renews it.
WITH hb AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
    WHERE a.id = ANY(ARRAY(  -- reached from the pairs given, as in start_attempt
        SELECT o.id FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
        CROSS JOIN LATERAL (SELECT id FROM cron_at_scale_jobattempt
                            WHERE job_id = r.job_id AND attempt = r.attempt LIMIT 1) AS o))
      AND a.outcome IN ('dispatched', 'running')
    RETURNING a.job_id, a.attempt
), jobs AS (
    UPDATE cron_at_scale_job AS j
    SET locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM hb)) AND j.schedule_type = 'once' AND j.status = 'in_progress'
      AND j.attempts IN (SELECT h.attempt FROM hb AS h WHERE h.job_id = j.id)
)
SELECT j.id AS job_id, h.attempt, 'cancelled' AS reason FROM hb AS h JOIN cron_at_scale_job AS j ON j.id = h.job_id
WHERE j.cancel_requested
UNION ALL
SELECT o.job_id, o.attempt, 'lost'
FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
CROSS JOIN LATERAL (SELECT job_id, attempt FROM cron_at_scale_jobattempt
                    WHERE job_id = r.job_id AND attempt = r.attempt AND outcome = 'lost' LIMIT 1) AS o;

-- name: keep_result :prepared :async  -- run by: cron_at_scale.django_tasks
-- A task's JSON return value, kept on its attempt (Django Tasks results).
-- Asynchronous commit: the attempt's completion, written after it, commits
-- synchronously and so makes it durable too.
UPDATE cron_at_scale_jobattempt SET result = %(result)s::jsonb
WHERE job_id = %(job_id)s AND attempt = %(attempt)s;

-- name: running_attempt_of_worker  -- run by: cron_at_scale.worker.lost
-- The worker's parent saw pool process %(worker)s die (hard time limit, a
-- signal) while it ran the message of attempt %(attempt)s of job %(job_id)s:
-- the attempt that process is still 'running' (its message's own, or a later
-- one it took over, see start_attempt), with what the job's retry policy
-- needs. No row: that process started nothing, or the attempt already ended
-- (its success was written, the reaper marked it lost); then nothing is
-- written. The caller ends it with retry_attempt or finish_attempt, which
-- touch it only while it is unfinished, i.e. still running. %(token)s: the
-- run token of a start the worker's main process made in a batch (the attempt
-- then names that process), else NULL.
SELECT a.attempt, j.schedule_type, j.retries, j.max_retries, j.options
FROM cron_at_scale_jobattempt AS a, cron_at_scale_job AS j
WHERE a.job_id = %(job_id)s AND a.attempt >= %(attempt)s AND a.outcome = 'running'
  AND (a.worker = %(worker)s OR a.run_token = %(token)s::uuid)
  AND j.id = a.job_id
ORDER BY a.attempt
LIMIT 1;

-- name: worker_health  -- run by: cron_at_scale.worker.health
-- A worker's main process writes its health row (cron_at_scale.worker.health: its heartbeat,
-- what it consumes, whether it is stuck), and rows of workers not seen for %(keep)s seconds go.
-- Ages are sent in seconds and turned into times here, on the database's clock.
INSERT INTO cron_at_scale_workerhealth
    (name, pid, queues, concurrency, running, received, started_at, last_seen, last_received, waiting,
     state, stuck_since, stuck_count, note)
VALUES (%(name)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(running)s, %(received)s,
        statement_timestamp() - make_interval(secs => %(age)s), statement_timestamp(),
        statement_timestamp() - make_interval(secs => %(received_ago)s), %(waiting)s, %(state)s,
        statement_timestamp() - make_interval(secs => %(stuck_for)s), %(stuck_count)s, %(note)s)
ON CONFLICT (name) DO UPDATE SET
    pid = EXCLUDED.pid, queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency,
    running = EXCLUDED.running, received = EXCLUDED.received,
    -- a restarted worker keeps its name: started_at is the new process's
    started_at = CASE WHEN cron_at_scale_workerhealth.pid = EXCLUDED.pid
                      THEN cron_at_scale_workerhealth.started_at ELSE EXCLUDED.started_at END,
    last_seen = EXCLUDED.last_seen, last_received = EXCLUDED.last_received, waiting = EXCLUDED.waiting,
    state = EXCLUDED.state,
    -- the first report of an episode sets it; later ones keep it (the database's time, not ours)
    stuck_since = CASE WHEN EXCLUDED.stuck_since IS NULL THEN NULL
                       ELSE coalesce(cron_at_scale_workerhealth.stuck_since, EXCLUDED.stuck_since) END,
    stuck_count = EXCLUDED.stuck_count, note = EXCLUDED.note;
DELETE FROM cron_at_scale_workerhealth WHERE last_seen < statement_timestamp() - make_interval(secs => %(keep)s);
