-- The SQL of the hot path, the dispatcher's half: the claim, recurring jobs moved on, shard
-- leases, the claim's floors, back-pressure and pre-loading (cron_at_scale/dispatcher/, cron_at_scale/policy/expiry.py).
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per batch by every dispatcher:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: claim_settings  -- run by: cron_at_scale.dispatcher.loop
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
-- idle_in_transaction_session_timeout %(idle_ms)s (the shard lease): a dispatcher stalled
-- inside this transaction (SIGSTOP, a VM pause) would hold the claimed rows' locks for the
-- whole stall, and the peer that takes its shards would skip them. The server ends the
-- session instead; the claim rolls back (its jobs stay pending, nothing was published:
-- publishing starts after the commit) and the rows are free by the time the shards move.
-- %(idle_ms)s NULL (a claim nested in its caller's transaction, as in tests): the caller's own
-- setting stays, since the bound would also end the caller's transaction after the claim.
-- plan_cache_mode force_generic_plan: the claim is a prepared statement (:prepared) whose one
-- generic plan serves every claim, instead of a plan made per claim (0.4-0.6 ms of PostgreSQL
-- CPU, a third of a claim of a few jobs). enable_seqscan and enable_bitmapscan off, as for the workers'
-- prepared statements (cron_at_scale/sql/__init__.py): a generic plan made while the table was
-- small must still reach rows by index once it is large. The statements after the claim in its
-- transaction (recurring jobs moved on) plan with the defaults again: claim_plan_done.
SET LOCAL synchronous_commit = off; SET LOCAL enable_sort = off; SET LOCAL jit = off;
SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;
SELECT set_config('idle_in_transaction_session_timeout',
                  COALESCE(%(idle_ms)s::text, current_setting('idle_in_transaction_session_timeout')), true);

-- name: claim_plan_done  -- run by: cron_at_scale.dispatcher.loop
-- After the claim, before the other statements of its transaction (advance_recurring and the
-- statements before it): claim_settings' plan settings back to their defaults, for the plans made
-- per statement (planned without them, a pre-loaded burst of 20,000 recurring jobs was claimed too
-- late: tests/integration/test_dispatcher_advance.py).
SET LOCAL plan_cache_mode TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_bitmapscan TO DEFAULT;

-- name: claim :prepared  -- run by: cron_at_scale.dispatcher.loop
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
-- peer's backlog); %(per_shard)s is sized by cron_at_scale.dispatcher.shards.ShardHeads. Each head
-- starts at its shard's floor (%(floors)s, NULL for none; cron_at_scale.dispatcher.floors.ShardFloors),
-- past the versions of jobs claimed before it that vacuum has not removed yet.
-- Held queues (cron_at_scale.dispatcher.backpressure: full, or nobody consumes them) keep their jobs here:
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

-- name: floor_probe  -- run by: cron_at_scale.dispatcher.floors
-- Due rows below the claim's floors (%(shards)s, %(floors)s; cron_at_scale.dispatcher.floors): the first
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

-- name: due_ahead  -- run by: cron_at_scale.dispatcher.loop
-- How many pending jobs of these shards (%(shards)s) fall due in each second ahead, from now to
-- %(horizon)s seconds (second 0: within the next second), for the dispatcher's pre-loading
-- (cron_at_scale.dispatcher.preload): per shard, an index range read of the partial (shard, fire_at)
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

-- name: queue_names  -- run by: cron_at_scale.dispatcher.backpressure
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

-- name: running_jobs  -- run by: cron_at_scale.dispatcher.advance
-- Which of these (claimed, row-locked) recurring jobs have an unfinished run. Its own
-- statement, not part of the claim: the claim's snapshot is taken before it locks a
-- row, and a run another dispatcher committed in between (a shard handover) would be
-- invisible to it, breaking overlap 'skip' / 'buffer_one'.
SELECT DISTINCT job_id FROM cron_at_scale_jobattempt
WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NULL;

-- name: advance_recurring  -- run by: cron_at_scale.dispatcher.advance
-- Claimed recurring jobs move on to their next occurrence; the runs fired
-- now and the occurrences skipped (overlap) get their attempt rows. due_since
-- (cron_at_scale.maintenance.overdue), when a run fires and none is waited on: the
-- earlier of that run and the occurrence the job was due for (a run fired
-- late, after an outage, does not hide how long the job has waited).
-- Sent as each job's (id, plan number) and each distinct plan once (jobs alike share one,
-- cron_at_scale.dispatcher.advance): its new columns, and its attempts as offsets from the job's counter
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

-- name: expire_runs  -- run by: cron_at_scale.dispatcher.claimed
-- Runs a dispatcher just claimed (one-off jobs) or logged (recurring ones) that
-- are already past their job's options.expires (cron_at_scale.policy.expiry): not
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

-- name: heartbeat_dispatcher  -- run by: cron_at_scale.dispatcher.shards
-- A dispatcher says it is alive (and which shards it holds); returns how many are alive.
WITH me AS (
    INSERT INTO cron_at_scale_dispatcherheartbeat (name, last_seen, shards)
    VALUES (%(name)s, statement_timestamp(), %(shards)s::jsonb)
    ON CONFLICT (name) DO UPDATE SET last_seen = EXCLUDED.last_seen, shards = EXCLUDED.shards
    RETURNING name
)
SELECT 1 + count(*) AS alive FROM cron_at_scale_dispatcherheartbeat
WHERE name <> %(name)s AND last_seen > statement_timestamp() - make_interval(secs => %(ttl)s);

-- name: renew_shards  -- run by: cron_at_scale.dispatcher.shards
UPDATE cron_at_scale_shardlease
SET expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
WHERE owner = %(name)s
RETURNING shard;

-- name: acquire_shards  -- run by: cron_at_scale.dispatcher.shards
-- Free or expired shards (a dispatcher stopped or died) of this database's %(shards)s, up to %(n)s of them.
UPDATE cron_at_scale_shardlease
SET owner = %(name)s, expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
WHERE shard IN (
    SELECT shard FROM cron_at_scale_shardlease
    WHERE (owner = '' OR expires_at < statement_timestamp()) AND shard = ANY(%(shards)s::int[])
    ORDER BY shard
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
RETURNING shard;

-- name: release_shards  -- run by: cron_at_scale.dispatcher.shards
UPDATE cron_at_scale_shardlease
SET owner = '', expires_at = statement_timestamp()
WHERE owner = %(name)s AND shard = ANY(%(shards)s::smallint[]);

-- name: forget_dispatcher  -- run by: cron_at_scale.dispatcher.shards
DELETE FROM cron_at_scale_dispatcherheartbeat WHERE name = %(name)s;

-- name: ensure_shards  -- run by: cron_at_scale.dispatcher.shards
-- The lease rows of this database's shards (all 64 unless SHARD_DATABASES; created by
-- migration 0004; again here if a table flush removed them).
INSERT INTO cron_at_scale_shardlease (shard, owner, expires_at)
SELECT s, '', statement_timestamp() FROM unnest(%(shards)s::int[]) AS s
ON CONFLICT (shard) DO NOTHING;

-- name: live_worker_queues  -- run by: cron_at_scale.dispatcher.backpressure
-- Queues listed by live workers (the same "alive" as cron_status: a heartbeat within three
-- intervals, %(window)s seconds, not stopped). An error when the table does not exist yet
-- (checked by the caller).
SELECT DISTINCT jsonb_array_elements_text(queues) AS queue FROM cron_at_scale_workerhealth
WHERE last_seen > statement_timestamp() - make_interval(secs => %(window)s) AND state <> 'stopped';
