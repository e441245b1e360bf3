-- The SQL of the hot path, in one place. Loaded by cron_at_scale/sql.py:
-- each query starts with a "-- name: <name> [:option ...]" line; parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/db.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: claim_settings
-- Run first in each claim transaction (SET LOCAL: that transaction only).
-- synchronous_commit off: a claim lost in a crash of PostgreSQL itself only
-- puts its jobs back to pending; their messages already sent find no
-- 'dispatched' attempt (or lose the race to the re-fired one) and are
-- skipped, so nothing runs twice and nothing is missed. Saves a WAL flush
-- per batch.
-- enable_sort off: due rows come in fire_at order straight from the partial
-- index and the scan stops after the batch; a table without statistics yet
-- (a fresh burst) would otherwise be planned as "read every due row, sort,
-- keep 1000", at every batch of the burst.
SET LOCAL synchronous_commit = off; SET LOCAL enable_sort = off;

-- name: claim
-- Claim up to %(limit)s jobs due within %(lookahead)s seconds, of the shards
-- this dispatcher holds, in ONE statement: lock them (skipping rows another
-- dispatcher holds). A one-off job moves to in_progress with the next
-- attempt number, its dispatch lease and its attempt log row, all here.
-- A recurring job stays pending and locked: the dispatcher decides which of
-- its occurrences fire (catch-up, overlap) and writes them with
-- advance_recurring, in this same transaction (after running_jobs, whose
-- snapshot is no older than the row locks taken here).
-- Held queues (cron_at_scale.queues: full, or nobody consumes them) keep their jobs here:
-- a job whose queue column names one, or with an empty queue column whose task routes
-- to one (%(blank_tasks)s: the tasks whose route differs from the default queue's,
-- held or not as %(held_blank)s says). A filter on the same partial fire_at index walk.
WITH due AS (
    SELECT id FROM cron_at_scale_job
    WHERE status = 'pending' AND fire_at <= statement_timestamp() + make_interval(secs => %(lookahead)s)
      AND (%(all_shards)s OR shard = ANY(%(shards)s::smallint[]))
      AND NOT (queue = ANY(%(held_queues)s::text[])
               OR (queue = '' AND %(held_blank)s <> (task = ANY(%(blank_tasks)s::text[]))))
    ORDER BY fire_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE cron_at_scale_job AS j
    SET status = CASE WHEN j.schedule_type = 'once' THEN 'in_progress' ELSE j.status END,
        attempts = CASE WHEN j.schedule_type = 'once' THEN j.attempts + 1 ELSE j.attempts END,
        locked_by = CASE WHEN j.schedule_type = 'once' THEN %(dispatcher)s ELSE j.locked_by END,
        -- The lease runs from the run's fire_at (a run claimed within the look-ahead waits
        -- in the dispatcher until then), so a held run is never reaped and re-fired early.
        -- A job whose earlier attempts were lost before any worker started them (a
        -- backlog, a broker outage) gets a longer dispatch lease each time (x2, up to x16),
        -- so re-fires do not outrun the workers.
        locked_until = CASE WHEN j.schedule_type = 'once'
                            THEN GREATEST(statement_timestamp(), j.fire_at) + make_interval(secs => %(lease)s
                                 * power(2, LEAST(4, j.dispatch_losses)))
                            ELSE j.locked_until END,
        updated_at = statement_timestamp()
    -- = ANY(ARRAY(...)): a primary-key lookup per claimed id, whatever the row estimates
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id, j.attempts, j.fire_at, j.schedule_type, j.cron_expr, j.timezone,
              j.task, j.payload, j.queue, j.options,
              j.interval, j.occurrence_at, j.catchup, j.catchup_window, j.overlap, j.jitter,
              j.buffered_at, j.locked_until
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
    SELECT id, attempts, fire_at, statement_timestamp(), locked_until, 'dispatched'
    FROM claimed
    WHERE schedule_type = 'once'
)
SELECT c.id, c.attempts, c.fire_at, c.schedule_type, c.cron_expr, c.timezone, c.task, c.payload, c.queue,
       c.options, c.interval, c.occurrence_at, c.catchup, c.catchup_window, c.overlap, c.jitter, c.buffered_at,
       statement_timestamp() AS db_now
FROM claimed AS c;

-- name: queue_names
-- The distinct values of the queue column (at most %(limit)s), for cron_status: a skip
-- scan of the (queue, fire_at, id) index, one index probe per value, whatever the table size.
WITH RECURSIVE q AS (
    (SELECT queue FROM cron_at_scale_job ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM cron_at_scale_job AS j WHERE j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL LIMIT %(limit)s;

-- name: running_jobs
-- Which of these (claimed, row-locked) recurring jobs have an unfinished run. Its own
-- statement, not part of the claim: the claim's snapshot is taken before it locks a
-- row, and a run another dispatcher committed in between (a shard handover) would be
-- invisible to it, breaking overlap 'skip' / 'buffer_one'.
SELECT DISTINCT job_id FROM cron_at_scale_jobattempt
WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NULL;

-- name: advance_recurring
-- Claimed recurring jobs move on to their next occurrence; the runs fired
-- now and the occurrences skipped (overlap) get their attempt rows.
WITH moved AS (
    UPDATE cron_at_scale_job AS j
    SET fire_at = v.fire_at, occurrence_at = v.occurrence_at,
        attempts = j.attempts + v.n_attempts,
        missed_occurrences = j.missed_occurrences + v.missed,
        skipped_occurrences = j.skipped_occurrences + v.skipped,
        buffered_at = v.buffer,
        updated_at = statement_timestamp()
    FROM unnest(%(ids)s::uuid[], %(fire_ats)s::timestamptz[], %(occurrences)s::timestamptz[],
                %(n_attempts)s::int[], %(missed)s::int[], %(skipped)s::int[], %(buffers)s::timestamptz[])
         AS v(id, fire_at, occurrence_at, n_attempts, missed, skipped, buffer)
    WHERE j.id = v.id
)
INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome, finished_at)
SELECT r.job_id, r.attempt, r.scheduled_at, statement_timestamp(),
       CASE WHEN r.outcome = 'dispatched'
            THEN GREATEST(statement_timestamp(), r.scheduled_at) + make_interval(secs => %(lease)s) END,
       r.outcome,
       CASE WHEN r.outcome = 'skipped' THEN statement_timestamp() END
FROM unnest(%(a_job_ids)s::uuid[], %(a_attempts)s::int[], %(a_scheduled)s::timestamptz[], %(a_outcomes)s::text[])
     AS r(job_id, attempt, scheduled_at, outcome);

-- name: start_attempt :prepared
-- A worker starts an attempt, and writes the succeeded attempts its process
-- handed over since its last write: one statement, one round trip per task.
-- Only a 'dispatched' attempt starts, so a redelivered message (already
-- started) or a superseded one returns no row and is skipped. A job
-- cancelled since its claim is recorded as a cancelled attempt and not run.
-- A one-off job already completed (an earlier attempt, reaped while it stalled,
-- succeeded after all) is recorded as a skipped attempt and not run.
-- The process's writer thread runs this with job_id NULL (starts nothing)
-- when no task follows within a few ms.
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
    RETURNING a.job_id, a.attempt
), completed AS (
    UPDATE cron_at_scale_job AS j
    SET status = CASE WHEN j.schedule_type = 'once' THEN 'completed' ELSE j.status END,
        -- a recurring job with a buffered occurrence (overlap buffer_one) is due now
        fire_at = CASE WHEN j.schedule_type = 'once' THEN j.fire_at ELSE statement_timestamp() END,
        locked_by = CASE WHEN j.schedule_type = 'once' THEN '' ELSE j.locked_by END,
        locked_until = CASE WHEN j.schedule_type = 'once' THEN NULL ELSE j.locked_until END,
        updated_at = statement_timestamp()
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM done)) AND (
        -- whichever attempt succeeded: a re-fired, retrying or lost-count-failed job is done
        (j.schedule_type = 'once' AND j.status IN ('in_progress', 'pending', 'failed'))
        OR (j.schedule_type <> 'once' AND j.status = 'pending' AND j.buffered_at IS NOT NULL))
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
               ORDER BY t.attempt LIMIT 1) END AS id
    FROM cron_at_scale_jobattempt AS r, cron_at_scale_job AS rj
    WHERE r.job_id = %(job_id)s AND r.attempt = %(attempt)s AND rj.id = %(job_id)s
      AND (r.outcome = 'dispatched' OR (r.outcome = 'lost' AND r.started_at IS NULL)
           OR (r.outcome = 'running' AND r.run_token = %(token)s))
), started AS (
UPDATE cron_at_scale_jobattempt AS a
SET started_at = COALESCE(a.started_at, statement_timestamp()),
    outcome = CASE WHEN a.outcome = 'running' THEN 'running'
                   WHEN j.status = 'cancelled' THEN 'cancelled'
                   WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'
                   ELSE 'running' END,
    finished_at = CASE WHEN a.outcome = 'dispatched'
                        AND (j.status = 'cancelled' OR (j.schedule_type = 'once' AND j.status = 'completed'))
                       THEN statement_timestamp() END,
    error = CASE WHEN a.outcome = 'dispatched' AND j.schedule_type = 'once' AND j.status = 'completed'
                 THEN 'not run: an earlier attempt of this job succeeded' ELSE a.error END,
    worker = %(worker)s,
    run_token = %(token)s,
    locked_until = statement_timestamp() + make_interval(secs => %(lease)s)
FROM cron_at_scale_job AS j
WHERE a.id = (SELECT id FROM target)
  AND (a.outcome = 'dispatched' OR (a.outcome = 'running' AND a.run_token = %(token)s)) AND j.id = a.job_id
  AND a.scheduled_at <= statement_timestamp()
RETURNING a.outcome, a.scheduled_at, j.schedule_type, j.cancel_requested, j.retries, j.max_retries, j.options,
          a.started_at, j.created_at, 0.0::float8 AS early_by, a.attempt
)
SELECT * FROM started
UNION ALL
-- Not due yet on the database clock (a message published ETA_LEAD ahead, run by a worker whose
-- clock is ahead): nothing changes, and the worker learns how many seconds early it is.
SELECT 'early', a.scheduled_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM a.scheduled_at - statement_timestamp())::float8, a.attempt
FROM cron_at_scale_jobattempt AS a
WHERE a.id = (SELECT id FROM target) AND a.outcome = 'dispatched' AND a.scheduled_at > statement_timestamp();

-- name: finish_attempt :prepared
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

-- name: retry_attempt :prepared
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

-- name: heartbeat :prepared :async
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
    error = CASE WHEN a.started_at IS NULL THEN 'lease expired before a worker started it (message lost or queued too long)'
                 ELSE 'lease expired while running: the worker died' END
FROM expired
WHERE a.id = expired.id
RETURNING a.job_id, a.attempt, a.scheduled_at, a.started_at IS NOT NULL AS started;

-- name: reap_once
-- One-off jobs of lost attempts go back to pending, to fire again at once with
-- the next attempt number. Attempts lost while running count toward
-- %(max_lost)s: a poison job that kills its worker must end, in the
-- dead-letter queue. Attempts lost before any worker started them (a lost
-- message, a long backlog) do not count: the job itself is not at fault.
UPDATE cron_at_scale_job AS j
SET status = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s THEN 'failed' ELSE 'pending' END,
    -- due again now, but never before its own fire_at
    fire_at = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s THEN j.fire_at
                   ELSE GREATEST(j.fire_at, statement_timestamp()) END,
    lost_attempts = j.lost_attempts + CASE WHEN l.started THEN 1 ELSE 0 END,
    dispatch_losses = j.dispatch_losses + CASE WHEN l.started THEN 0 ELSE 1 END,
    locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[], %(started)s::bool[]) AS l(job_id, attempt, started)
WHERE j.id = l.job_id AND j.schedule_type = 'once' AND j.status = 'in_progress' AND j.attempts = l.attempt
RETURNING j.id, j.status, j.attempts, j.task;

-- name: refire_cron
-- A lost run of a live cron job fires again under a new attempt number, for
-- the same scheduled occurrence, until that occurrence lost %(max_lost)s runs.
-- Also when the job was paused after that run was fired: the occurrence came
-- due before the pause, and pausing stops later occurrences only.
WITH j AS (
    UPDATE cron_at_scale_job AS j
    SET attempts = j.attempts + 1,
        lost_attempts = j.lost_attempts + CASE WHEN %(started)s THEN 1 ELSE 0 END,
        updated_at = statement_timestamp()
    WHERE j.id = %(job_id)s AND j.schedule_type <> 'once' AND j.status IN ('pending', 'paused')
      AND (SELECT count(*) FROM cron_at_scale_jobattempt AS a
           WHERE a.job_id = %(job_id)s AND a.scheduled_at = %(scheduled_at)s AND a.outcome = 'lost'
             AND a.started_at IS NOT NULL) < %(max_lost)s
    RETURNING j.id, j.attempts, j.schedule_type, j.cron_expr, j.timezone, j.task, j.payload, j.queue, j.options
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
    SELECT id, attempts, %(scheduled_at)s, statement_timestamp(),
           GREATEST(statement_timestamp(), %(scheduled_at)s) + make_interval(secs => %(lease)s), 'dispatched'
    FROM j
)
SELECT id, attempts, %(scheduled_at)s::timestamptz AS fire_at, schedule_type, cron_expr, timezone, task, payload,
       queue, options
FROM j;

-- name: requeue
-- Failed jobs back to pending, due now, with their retries and lost attempts reset.
UPDATE cron_at_scale_job
SET status = 'pending', fire_at = statement_timestamp(), retries = 0, lost_attempts = 0, dispatch_losses = 0,
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
WHERE id = %(job_id)s AND status IN ('pending', 'in_progress', 'paused')
RETURNING id;

-- name: db_now
SELECT statement_timestamp();

-- name: pause
-- Hold a recurring job; its pending occurrence stays where it is.
UPDATE cron_at_scale_job
SET status = 'paused', pause_note = %(note)s, updated_at = statement_timestamp()
WHERE id = %(job_id)s AND schedule_type <> 'once' AND status = 'pending'
RETURNING id;

-- name: resume
-- Back to pending: the occurrences that fell due while paused follow the
-- job's catch-up policy at its next claim.
UPDATE cron_at_scale_job
SET status = 'pending', pause_note = '', updated_at = statement_timestamp()
WHERE id = %(job_id)s AND status = 'paused'
RETURNING id;

-- name: heartbeat_dispatcher
-- A dispatcher says it is alive (and which shards it holds); returns how many are alive.
WITH me AS (
    INSERT INTO cron_at_scale_dispatcherheartbeat (name, last_seen, shards)
    VALUES (%(name)s, statement_timestamp(), %(shards)s::jsonb)
    ON CONFLICT (name) DO UPDATE SET last_seen = EXCLUDED.last_seen, shards = EXCLUDED.shards
    RETURNING name
)
SELECT 1 + count(*) AS alive FROM cron_at_scale_dispatcherheartbeat
WHERE name <> %(name)s AND last_seen > statement_timestamp() - make_interval(secs => %(ttl)s);

-- name: renew_shards
UPDATE cron_at_scale_shardlease
SET expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
WHERE owner = %(name)s
RETURNING shard;

-- name: acquire_shards
-- Free or expired shards (a dispatcher stopped or died), up to %(n)s of them.
UPDATE cron_at_scale_shardlease
SET owner = %(name)s, expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
WHERE shard IN (
    SELECT shard FROM cron_at_scale_shardlease
    WHERE owner = '' OR expires_at < statement_timestamp()
    ORDER BY shard
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
RETURNING shard;

-- name: release_shards
UPDATE cron_at_scale_shardlease
SET owner = '', expires_at = statement_timestamp()
WHERE owner = %(name)s AND shard = ANY(%(shards)s::smallint[]);

-- name: forget_dispatcher
DELETE FROM cron_at_scale_dispatcherheartbeat WHERE name = %(name)s;

-- name: ensure_shards
-- The 64 lease rows (created by migration 0004; again here if a table flush removed them).
INSERT INTO cron_at_scale_shardlease (shard, owner, expires_at)
SELECT s, '', statement_timestamp() FROM generate_series(0, %(n)s - 1) AS s
ON CONFLICT (shard) DO NOTHING;

-- name: keep_result :prepared :async
-- A task's JSON return value, kept on its attempt (Django Tasks results).
-- Asynchronous commit: the attempt's completion, written after it, commits
-- synchronously and so makes it durable too.
UPDATE cron_at_scale_jobattempt SET result = %(result)s::jsonb
WHERE job_id = %(job_id)s AND attempt = %(attempt)s;

-- name: running_attempt_of_worker
-- The worker's parent saw pool process %(worker)s die (hard time limit, a
-- signal) while it ran the message of attempt %(attempt)s of job %(job_id)s:
-- the attempt that process is still 'running' (its message's own, or a later
-- one it took over, see start_attempt), with what the job's retry policy
-- needs. No row: that process started nothing, or the attempt already ended
-- (its success was written, the reaper marked it lost); then nothing is
-- written. The caller ends it with retry_attempt or finish_attempt, which
-- touch it only while it is unfinished, i.e. still running.
SELECT a.attempt, j.schedule_type, j.retries, j.max_retries, j.options
FROM cron_at_scale_jobattempt AS a, cron_at_scale_job AS j
WHERE a.job_id = %(job_id)s AND a.attempt >= %(attempt)s AND a.outcome = 'running' AND a.worker = %(worker)s
  AND j.id = a.job_id
ORDER BY a.attempt
LIMIT 1;

-- name: retention_cutoff
-- Retention (cron_at_scale/retention.py): finished jobs last updated before this are purged.
SELECT statement_timestamp() - make_interval(secs => %(age)s);

-- name: retention_chunk
-- The next chunk of finished jobs, oldest first: a keyset walk of cron_job_finished_updated.
SELECT id, updated_at FROM cron_at_scale_job
WHERE status IN ('completed', 'cancelled') AND updated_at < %(cutoff)s
  AND (updated_at, id) > (%(after_at)s, %(after_id)s)
ORDER BY updated_at, id
LIMIT %(n)s;

-- name: retention_count_attempts
SELECT count(*) FROM cron_at_scale_jobattempt WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL;

-- name: retention_delete_attempts
-- At most %(n)s finished attempts of these jobs, skipping rows another session holds.
DELETE FROM cron_at_scale_jobattempt WHERE id IN (
    SELECT id FROM cron_at_scale_jobattempt
    WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
);

-- name: retention_delete_jobs
-- The jobs, re-checked under their row lock: still finished, still old, no attempt left.
DELETE FROM cron_at_scale_job WHERE id IN (
    SELECT j.id FROM cron_at_scale_job AS j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status IN ('completed', 'cancelled') AND j.updated_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS a WHERE a.job_id = j.id)
    FOR UPDATE SKIP LOCKED
);

-- name: copy_jobs
-- schedule_many's fast path (cron_at_scale/bulk.py): rows streamed in COPY's text format, in
-- this column order; the other columns take their database defaults.
COPY cron_at_scale_job (id, fire_at, payload, task, queue, options, timezone, max_retries,
                        schedule_type, cron_expr, interval, occurrence_at, catchup, catchup_window, overlap, jitter,
                        status)
FROM STDIN;

-- name: database_clock
-- The database's clock (seconds since the epoch), for a worker's measure of its own clock's offset.
SELECT extract(epoch FROM statement_timestamp())::float8 AS db_now;
