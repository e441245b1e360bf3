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
-- enable_sort off: each shard's due rows come in fire_at order straight from the
-- partial (shard, fire_at) index and its scan stops at its share; a table without
-- statistics yet (a fresh burst) would otherwise be planned as "read every due row
-- of the shard, sort, keep a few", at every batch of the burst.
-- jit off: the one sort left (of the shards' heads, at most a batch and a few rows)
-- costs the disabled-sort penalty, which would otherwise buy a JIT compile (~300 ms).
SET LOCAL synchronous_commit = off; SET LOCAL enable_sort = off; SET LOCAL jit = off;

-- name: claim
-- Claim up to %(limit)s jobs due within %(lookahead)s seconds, of the shards
-- this dispatcher holds (%(shards)s), in ONE statement: lock them (skipping rows another
-- dispatcher holds). A one-off job moves to in_progress with the next
-- attempt number, its dispatch lease and its attempt log row, all here.
-- A recurring job stays pending and locked: the dispatcher decides which of
-- its occurrences fire (catch-up, overlap) and writes them with
-- advance_recurring, in this same transaction (after running_jobs, whose
-- snapshot is no older than the row locks taken here).
-- Each shard's head: its first %(per_shard)s due rows from the (shard, fire_at) index, then
-- the earliest %(limit)s of those heads. What the statement reads grows with the batch and
-- the shards held, never with the due rows of shards it does not hold (a stalled or dead
-- peer's backlog); %(per_shard)s is sized by cron_at_scale.shards.ShardHeads. Each head
-- starts at its shard's floor (%(floors)s, NULL for none; cron_at_scale.shards.ShardFloors),
-- past the versions of jobs claimed before it that vacuum has not removed yet.
-- Held queues (cron_at_scale.queues: full, or nobody consumes them) keep their jobs here:
-- a job whose queue column names one, or with an empty queue column whose task routes
-- to one (%(blank_tasks)s: the tasks whose route differs from the default queue's,
-- held or not as %(held_blank)s says). A filter on the same index walk.
WITH due AS (
    -- the locked rows' own columns, as FOR UPDATE returns them (the latest committed version):
    -- a recurring job is locked here and written once, by advance_recurring
    SELECT h.* FROM unnest(%(shards)s::smallint[], %(floors)s::timestamptz[]) AS s(shard, floor)
    CROSS JOIN LATERAL (
        SELECT id, attempts, fire_at, schedule_type, cron_expr, timezone, task, payload, queue, options,
               interval, occurrence_at, catchup, catchup_window, overlap, jitter, buffered_at, locked_until, shard
        FROM cron_at_scale_job
        WHERE status = 'pending' AND shard = s.shard
          AND fire_at >= COALESCE(s.floor, '-infinity')
          AND fire_at <= statement_timestamp() + make_interval(secs => %(lookahead)s)
          -- a recurring job parked until its fire_at (advance_recurring): its overlap is decided then
          AND (locked_until IS DISTINCT FROM fire_at OR fire_at <= statement_timestamp())
          AND NOT (queue = ANY(%(held_queues)s::text[])
                   OR (queue = '' AND %(held_blank)s <> (task = ANY(%(blank_tasks)s::text[]))))
        ORDER BY fire_at
        LIMIT %(per_shard)s
        FOR UPDATE SKIP LOCKED
    ) AS h
    ORDER BY h.fire_at
    LIMIT %(limit)s
), claimed AS (
    -- one-off jobs only: a recurring job stays pending and locked, moved on by advance_recurring
    UPDATE cron_at_scale_job AS j
    SET status = 'in_progress', attempts = j.attempts + 1, locked_by = %(dispatcher)s,
        -- The lease runs from the run's fire_at (a run claimed within the look-ahead waits
        -- in the dispatcher until then), so a held run is never reaped and re-fired early.
        -- A job whose earlier attempts were lost before any worker started them (a
        -- backlog, a broker outage) gets a longer dispatch lease each time (x2, up to x16),
        -- so re-fires do not outrun the workers.
        locked_until = GREATEST(statement_timestamp(), j.fire_at) + make_interval(secs => %(lease)s
                       * power(2, LEAST(4, j.dispatch_losses))),
        updated_at = statement_timestamp()
    -- = ANY(ARRAY(...)): a primary-key lookup per claimed id, whatever the row estimates
    WHERE j.id = ANY(ARRAY(SELECT id FROM due WHERE schedule_type = 'once'))
    RETURNING j.id, j.attempts, j.fire_at, j.schedule_type, j.cron_expr, j.timezone,
              j.task, j.payload, j.queue, j.options,
              j.interval, j.occurrence_at, j.catchup, j.catchup_window, j.overlap, j.jitter,
              j.buffered_at, j.locked_until, j.shard
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
    SELECT id, attempts, fire_at, statement_timestamp(), locked_until, 'dispatched'
    FROM claimed
), rows AS (
    SELECT * FROM claimed
    UNION ALL
    SELECT * FROM due WHERE schedule_type <> 'once'
)
SELECT c.id, c.attempts, c.fire_at, c.schedule_type, c.cron_expr, c.timezone, c.task, c.payload, c.queue,
       c.options, c.interval, c.occurrence_at, c.catchup, c.catchup_window, c.overlap, c.jitter, c.buffered_at,
       c.locked_until, c.shard, statement_timestamp() AS db_now,
       -- the database clock as the rows leave (the last row's: the statement's end), which the
       -- dispatcher pairs with its own clock when the rows arrive, to send held runs on time
       clock_timestamp() AS db_clock
FROM rows AS c;

-- name: floor_probe
-- Due rows below the claim's floors (%(shards)s, %(floors)s; cron_at_scale.floors): the first
-- of each shard, by the same (shard, fire_at) index and the claim's held-queue filter, no lock
-- taken. Run by the dispatcher's floor-probe thread, which lowers the floors to what it finds.
SELECT s.shard, h.fire_at FROM unnest(%(shards)s::smallint[], %(floors)s::timestamptz[]) AS s(shard, floor)
CROSS JOIN LATERAL (
    SELECT fire_at FROM cron_at_scale_job
    WHERE status = 'pending' AND shard = s.shard AND fire_at < s.floor
      AND NOT (queue = ANY(%(held_queues)s::text[])
               OR (queue = '' AND %(held_blank)s <> (task = ANY(%(blank_tasks)s::text[]))))
    ORDER BY fire_at
    LIMIT 1
) AS h;

-- name: due_ahead
-- How many pending jobs of these shards (%(shards)s) fall due in each second ahead, from now to
-- %(horizon)s seconds (second 0: within the next second), for the dispatcher's pre-loading
-- (cron_at_scale.preload): per shard, an index range read of the partial (shard, fire_at)
-- index, at most %(per_shard)s rows, no lock taken. The held-queue filter is the claim's.
SELECT floor(extract(epoch FROM h.fire_at - statement_timestamp()))::int AS second, count(*) AS n
FROM unnest(%(shards)s::smallint[]) AS s(shard)
CROSS JOIN LATERAL (
    SELECT fire_at FROM cron_at_scale_job
    WHERE status = 'pending' AND shard = s.shard
      AND fire_at > statement_timestamp()
      AND fire_at <= statement_timestamp() + make_interval(secs => %(horizon)s)
      AND NOT (queue = ANY(%(held_queues)s::text[])
               OR (queue = '' AND %(held_blank)s <> (task = ANY(%(blank_tasks)s::text[]))))
    ORDER BY fire_at
    LIMIT %(per_shard)s
) AS h
GROUP BY 1 ORDER BY 1;

-- name: queue_names
-- The distinct named queues (at most %(limit)s; the default queue '' is not one), for
-- cron_status: a skip scan of the partial (queue, fire_at, id) index of named queues, one
-- index probe per value, whatever the table size.
WITH RECURSIVE q AS (
    (SELECT queue FROM cron_at_scale_job WHERE queue <> '' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM cron_at_scale_job AS j WHERE j.queue > q.queue AND j.queue <> ''
            ORDER BY j.queue LIMIT 1)
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
-- now and the occurrences skipped (overlap) get their attempt rows. due_since
-- (cron_at_scale.overdue), when a run fires and none is waited on: the
-- earlier of that run and the occurrence the job was due for (a run fired
-- late, after an outage, does not hide how long the job has waited).
-- Sent as each job's (id, plan number) and each distinct plan once (jobs alike share one,
-- cron_at_scale.advance): its new columns, and its attempts as offsets from the job's counter
-- before this claim (the skipped first, then the fired), which the job's own row gives.
-- %(parked)s: jobs not due yet whose overlap is decided when they are: locked_until = fire_at,
-- which the claim passes by until that time (a plain write: no indexed column changes).
WITH parked AS (
    UPDATE cron_at_scale_job SET locked_until = fire_at
    WHERE id = ANY(%(parked)s::uuid[]) AND schedule_type <> 'once'
), v AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(plans)s::int[]) AS v(id, plan)
), p AS (
    SELECT * FROM unnest(%(p_fire_ats)s::timestamptz[], %(p_occurrences)s::timestamptz[], %(p_n_attempts)s::int[],
                         %(p_missed)s::int[], %(p_skipped)s::int[], %(p_buffers)s::timestamptz[],
                         %(p_first_fired)s::timestamptz[]) WITH ORDINALITY
         AS p(fire_at, occurrence_at, n_attempts, missed, skipped, buffer, first_fired, plan)
), moved AS (
    UPDATE cron_at_scale_job AS j
    SET fire_at = p.fire_at, occurrence_at = p.occurrence_at,
        attempts = j.attempts + p.n_attempts,
        missed_occurrences = j.missed_occurrences + p.missed,
        skipped_occurrences = j.skipped_occurrences + p.skipped,
        buffered_at = p.buffer,
        due_since = CASE WHEN p.first_fired IS NULL THEN j.due_since
                         ELSE COALESCE(j.due_since, LEAST(p.first_fired, GREATEST(j.fire_at, j.occurrence_at))) END,
        locked_until = NULL,
        updated_at = statement_timestamp()
    FROM v JOIN p ON p.plan = v.plan + 1
    -- = ANY(...) too: a primary-key lookup per id, never a hash join over the whole table
    WHERE j.id = v.id AND j.id = ANY(%(ids)s::uuid[])
    RETURNING j.id, j.attempts - p.n_attempts AS before, v.plan
)
INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome, finished_at)
SELECT m.id, m.before + r.offset_, r.scheduled_at, statement_timestamp(),
       CASE WHEN r.outcome = 'dispatched'
            THEN GREATEST(statement_timestamp(), r.scheduled_at) + make_interval(secs => %(lease)s) END,
       r.outcome,
       CASE WHEN r.outcome = 'skipped' THEN statement_timestamp() END
FROM moved AS m
JOIN unnest(%(r_plans)s::int[], %(r_offsets)s::int[], %(r_scheduled)s::timestamptz[], %(r_outcomes)s::text[])
     AS r(plan, offset_, scheduled_at, outcome) ON r.plan = m.plan;

-- name: expire_runs
-- Runs a dispatcher just claimed (one-off jobs) or logged (recurring ones) that
-- are already past their job's options.expires (cron_at_scale.expiry): not
-- published; recorded as skipped, counted in expired_runs; a one-off job ends
-- cancelled. In the claim's transaction, only when there are such runs.
WITH a AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET outcome = 'skipped', finished_at = statement_timestamp(), locked_until = NULL,
        error = 'expired: not started within ' || trim_scale((j.options->>'expires')::numeric)
                || ' s of its occurrence'
    FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt), cron_at_scale_job AS j
    WHERE a.job_id = r.job_id AND a.attempt = r.attempt AND a.outcome = 'dispatched' AND j.id = r.job_id
    RETURNING a.job_id, a.attempt
), n AS (
    SELECT job_id, count(*) AS runs, max(attempt) AS last FROM a GROUP BY job_id
)
UPDATE cron_at_scale_job AS j
SET expired_runs = j.expired_runs + n.runs,
    status = CASE WHEN j.schedule_type = 'once' AND j.attempts = n.last THEN 'cancelled' ELSE j.status END,
    locked_by = CASE WHEN j.schedule_type = 'once' THEN '' ELSE j.locked_by END,
    locked_until = CASE WHEN j.schedule_type = 'once' THEN NULL ELSE j.locked_until END,
    updated_at = statement_timestamp()
FROM n
WHERE j.id = n.job_id;

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
        -- a recurring job's latest success (cron_at_scale.overdue); due_since clears when the
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
), started AS (
    UPDATE cron_at_scale_jobattempt AS a
    SET started_at = COALESCE(a.started_at, statement_timestamp()),
        outcome = CASE WHEN a.outcome = 'running' THEN 'running'
                       WHEN j.status = 'cancelled' THEN 'cancelled'
                       WHEN j.schedule_type = 'once' AND j.status = 'completed' THEN 'skipped'
                       WHEN statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target) THEN 'skipped'
                       ELSE 'running' END,
        finished_at = CASE WHEN a.outcome = 'dispatched'
                            AND (j.status = 'cancelled' OR (j.schedule_type = 'once' AND j.status = 'completed')
                                 OR statement_timestamp() > a.scheduled_at + (SELECT expiry FROM target))
                           THEN statement_timestamp() END,
        error = CASE WHEN a.outcome <> 'dispatched' OR j.status = 'cancelled' THEN a.error
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
              a.started_at, j.created_at, a.attempt, a.job_id, a.error,
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
       created_at, error, 0.0::float8 AS early_by, attempt
FROM started
UNION ALL
-- Not due yet on the database clock (a message published ETA_LEAD ahead, run by a worker whose
-- clock is ahead): nothing changes, and the worker learns how many seconds early it is.
SELECT 'early', a.scheduled_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
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
RETURNING a.job_id, a.attempt, a.scheduled_at, a.started_at IS NOT NULL AS started, a.occurrence_losses,
          a.dispatch_losses;

-- name: reap_once
-- One-off jobs of lost attempts go back to pending, to fire again at once with
-- the next attempt number. Attempts lost while running count toward
-- %(max_lost)s: a poison job that kills its worker must end, in the
-- dead-letter queue. Attempts lost before any worker started them (a lost
-- message, a long backlog) do not count: the job itself is not at fault.
UPDATE cron_at_scale_job AS j
SET status = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s THEN 'failed' ELSE 'pending' END,
    -- due again now, but never before its own fire_at; a job with an expiry keeps its
    -- fire_at, the scheduled time its expiry counts from (the claim skips it once past)
    fire_at = CASE WHEN l.started AND j.lost_attempts + 1 >= %(max_lost)s THEN j.fire_at
                   WHEN j.options ? 'expires' THEN j.fire_at
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
-- %(losses)s: runs of the occurrence lost while running, this one included,
-- carried on the attempt rows (occurrence_losses) rather than counted: a count
-- would read every attempt of the job, and the history trim deletes old ones.
-- %(dispatch_losses)s: runs of the occurrence lost before any worker started them, since
-- the last one that started, this one included (carried the same way): the re-fire's
-- dispatch lease doubles per such loss, up to x16, as a one-off job's claim does, so
-- re-fires of a backlog do not outrun the workers.
WITH j AS (
    UPDATE cron_at_scale_job AS j
    SET attempts = j.attempts + 1,
        lost_attempts = j.lost_attempts + CASE WHEN %(started)s THEN 1 ELSE 0 END,
        updated_at = statement_timestamp()
    WHERE j.id = %(job_id)s AND j.schedule_type <> 'once' AND j.status IN ('pending', 'paused')
      AND %(losses)s < %(max_lost)s
    RETURNING j.id, j.attempts, j.schedule_type, j.cron_expr, j.timezone, j.task, j.payload, j.queue, j.options
), logged AS (
    INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome,
                                          occurrence_losses, dispatch_losses)
    SELECT id, attempts, %(scheduled_at)s, statement_timestamp(),
           GREATEST(statement_timestamp(), %(scheduled_at)s) + make_interval(secs => %(lease)s
           * power(2, LEAST(4, %(dispatch_losses)s))), 'dispatched',
           %(losses)s, %(dispatch_losses)s
    FROM j
)
SELECT id, attempts, %(scheduled_at)s::timestamptz AS fire_at, schedule_type, cron_expr, timezone, task, payload,
       queue, options, statement_timestamp() AS db_now
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
-- job's catch-up policy at its next claim. resumed_at: none of them makes
-- the job overdue before its grace from now (cron_at_scale.overdue).
UPDATE cron_at_scale_job
SET status = 'pending', pause_note = '', resumed_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = %(job_id)s AND status = 'paused'
RETURNING id;

-- name: overdue_jobs
-- Recurring jobs overdue now, most overdue first, at most %(limit)s; total: how many in all.
-- The rule (cron_at_scale.overdue): a pending recurring job is overdue when the
-- occurrence it waits on is older than its grace (its own, else %(grace)s
-- seconds): the first run fired since its last success (due_since), else its
-- next occurrence once due (the later of fire_at and occurrence_at: with its
-- jitter, and not an extra "run now"); never earlier than its last resume.
-- overdue_open and overdue_close repeat this expression. A walk of the partial
-- index cron_job_recurring_fire_at: recurring jobs only, however many one-off jobs.
SELECT id, key, task, expected_at, grace, last_success_at, overdue_since,
       extract(epoch FROM statement_timestamp() - expected_at)::float8 AS late_seconds,
       count(*) OVER () AS total
FROM (SELECT j.id, j.key, j.task, j.last_success_at, j.overdue_since,
             GREATEST(LEAST(j.due_since, GREATEST(j.fire_at, j.occurrence_at)), j.resumed_at) AS expected_at,
             COALESCE(j.grace, %(grace)s::float8) AS grace
      FROM cron_at_scale_job AS j
      WHERE NOT j.schedule_type = 'once' AND j.status = 'pending') AS r
WHERE expected_at <= statement_timestamp() - make_interval(secs => grace)
ORDER BY expected_at, id
LIMIT %(limit)s;

-- name: recurring_health
-- Live recurring jobs with a key (at most %(limit)s, by key): overdue or not (the
-- rule of overdue_jobs), the latest success. The metrics' per-key gauges.
SELECT key, last_success_at,
       status = 'pending' AND GREATEST(LEAST(due_since, GREATEST(fire_at, occurrence_at)), resumed_at)
           <= statement_timestamp() - make_interval(secs => COALESCE(grace, %(grace)s::float8)) AS overdue
FROM cron_at_scale_job
WHERE NOT schedule_type = 'once' AND key IS NOT NULL AND status IN ('pending', 'paused')
ORDER BY key
LIMIT %(limit)s;

-- name: overdue_open
-- Open the overdue episode of jobs newly overdue (the rule of overdue_jobs), at most %(limit)s:
-- the dispatcher whose statement sets overdue_since sends job_overdue; one running the same
-- statement at once skips the rows locked here, or finds overdue_since set once they commit.
WITH found AS (
    SELECT j.id, GREATEST(LEAST(j.due_since, GREATEST(j.fire_at, j.occurrence_at)), j.resumed_at) AS expected_at,
           COALESCE(j.grace, %(grace)s::float8) AS grace
    FROM cron_at_scale_job AS j
    WHERE NOT j.schedule_type = 'once' AND j.status = 'pending' AND j.overdue_since IS NULL
      AND GREATEST(LEAST(j.due_since, GREATEST(j.fire_at, j.occurrence_at)), j.resumed_at)
          <= statement_timestamp() - make_interval(secs => COALESCE(j.grace, %(grace)s::float8))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE cron_at_scale_job AS j
SET overdue_since = statement_timestamp()
FROM found
WHERE j.id = found.id AND j.overdue_since IS NULL
RETURNING j.id, found.expected_at, found.grace,
          extract(epoch FROM statement_timestamp() - found.expected_at)::float8 AS late_seconds;

-- name: overdue_close
-- Close the episodes of jobs no longer overdue (a success, a pause, an end, or their due
-- occurrences skipped by policy), at most %(limit)s: whoever clears overdue_since sends job_recovered.
WITH found AS (
    SELECT j.id, j.overdue_since
    FROM cron_at_scale_job AS j
    WHERE NOT j.schedule_type = 'once' AND j.overdue_since IS NOT NULL
      AND NOT (j.status = 'pending' AND GREATEST(LEAST(j.due_since, GREATEST(j.fire_at, j.occurrence_at)), j.resumed_at)
               <= statement_timestamp() - make_interval(secs => COALESCE(j.grace, %(grace)s::float8)))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE cron_at_scale_job AS j
SET overdue_since = NULL
FROM found
WHERE j.id = found.id AND j.overdue_since IS NOT NULL
RETURNING j.id, found.overdue_since, j.status, j.last_success_at;

-- name: history_due
-- Recurring jobs with attempts to trim (cron_at_scale.history): their oldest attempt row is
-- not their latest, and is beyond their latest %(keep)s or older than %(age)s seconds (NULL:
-- no such limit). One index probe per recurring job.
SELECT j.id, j.attempts
FROM cron_at_scale_job AS j
CROSS JOIN LATERAL (SELECT a.attempt, a.dispatched_at FROM cron_at_scale_jobattempt AS a
                    WHERE a.job_id = j.id ORDER BY a.attempt LIMIT 1) AS oldest
WHERE NOT j.schedule_type = 'once' AND oldest.attempt < j.attempts
  AND (oldest.attempt <= j.attempts - %(keep)s::int
       OR oldest.dispatched_at < statement_timestamp() - make_interval(secs => %(age)s::float8));

-- name: history_trim :async
-- At most %(n)s finished attempts of these jobs (%(job_ids)s, each with its latest attempt
-- number in %(latests)s) beyond their latest %(keep)s or dispatched more than %(age)s seconds
-- ago (NULL: no such limit), oldest first. Per job, a bound on the attempt number, then a
-- range of the (job_id, attempt) index up to it: attempt numbers grow with dispatch time, so
-- the old attempts lead the range, and only the first %(n)s are read to find the age bound.
-- Never a job's latest attempt nor an unfinished one; rows another session holds are skipped
-- (another dispatcher trimming, the reaper, a worker).
-- Asynchronous commit: a delete lost in a crash of PostgreSQL is done again at the next pass
-- (a synchronous one cost a WAL flush per statement: most of a pass's time).
DELETE FROM cron_at_scale_jobattempt WHERE id IN (
    SELECT d.id
    FROM unnest(%(job_ids)s::uuid[], %(latests)s::int[]) AS t(job_id, latest)
    CROSS JOIN LATERAL (
        SELECT GREATEST(t.latest - %(keep)s::int,
                        CASE WHEN %(age)s::float8 IS NOT NULL THEN (
                            SELECT max(f.attempt) FROM (SELECT a.attempt, a.dispatched_at
                                                        FROM cron_at_scale_jobattempt AS a
                                                        WHERE a.job_id = t.job_id AND a.attempt < t.latest
                                                        ORDER BY a.attempt LIMIT %(n)s) AS f
                            WHERE f.dispatched_at < statement_timestamp() - make_interval(secs => %(age)s::float8))
                        END) AS upto) AS b
    CROSS JOIN LATERAL (SELECT a.id FROM cron_at_scale_jobattempt AS a
                        WHERE a.job_id = t.job_id AND a.attempt < t.latest AND a.attempt <= b.upto
                          AND a.finished_at IS NOT NULL
                        ORDER BY a.attempt
                        LIMIT %(n)s
                        FOR UPDATE SKIP LOCKED) AS d
    LIMIT %(n)s
);

-- name: lock_job
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

-- name: supersede_held_runs
-- A rescheduled job's runs claimed ahead of their time (within the look-ahead) and not
-- started: occurrences of the old schedule after the change. They end 'skipped'; their
-- messages, sent at their time, find no 'dispatched' attempt and are not run
-- (start_attempt). A run already started goes on under its own number.
UPDATE cron_at_scale_jobattempt
SET outcome = 'skipped', finished_at = statement_timestamp(), error = 'not run: the job was rescheduled'
WHERE job_id = %(job_id)s AND finished_at IS NULL AND outcome = 'dispatched' AND scheduled_at > %(now)s
RETURNING attempt;

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
