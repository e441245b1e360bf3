-- Maintenance, run by the dispatchers beside the claim: the reaper, overdue jobs, the attempt
-- history's trim, retention (cron_at_scale/maintenance/).
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: reap  -- run by: cron_at_scale.maintenance.reaper
-- Attempts whose lease expired with nobody finishing them (a dead worker, a
-- lost broker message, a dispatcher killed before publishing) are marked
-- lost. Safe with many dispatchers reaping at once (SKIP LOCKED).
-- A running attempt only while the database clock is no later than %(running_until)s (the
-- reaper's own reading of it, on its monotonic clock, plus a tolerance; NULL: none now): a
-- clock stepped forward would expire every running lease at once, heartbeats current or not
-- (cron_at_scale.maintenance.reaper holds them until the heartbeats renewed them on the new clock).
WITH expired AS (
    SELECT id FROM cron_at_scale_jobattempt
    WHERE finished_at IS NULL AND locked_until < statement_timestamp()
      AND (started_at IS NULL OR statement_timestamp() <= %(running_until)s::timestamptz)
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

-- name: reap_stale  -- run by: cron_at_scale.maintenance.reaper
-- After the database clock stepped back: running attempts whose lease, written before the
-- step, ran out by the reaper's monotonic clock with no heartbeat since (their locked_until
-- still the value seen, %(ids)s / %(until)s), marked lost as reap does; the clock alone would
-- keep them the step's length longer.
WITH expired AS (
    SELECT a.id FROM unnest(%(ids)s::bigint[], %(until)s::timestamptz[]) AS s(id, locked_until)
    JOIN cron_at_scale_jobattempt AS a ON a.id = s.id AND a.locked_until = s.locked_until
    WHERE a.finished_at IS NULL
    FOR UPDATE OF a SKIP LOCKED
)
UPDATE cron_at_scale_jobattempt AS a
SET outcome = 'lost', finished_at = statement_timestamp(),
    error = 'lease expired while running: the worker died (its lease counted past a step back of the database clock)'
FROM expired
WHERE a.id = expired.id
RETURNING a.job_id, a.attempt, a.scheduled_at, a.started_at IS NOT NULL AS started, a.occurrence_losses,
          a.dispatch_losses;

-- name: running_leases  -- run by: cron_at_scale.maintenance.reaper
-- Running attempts whose lease ends more than %(beyond)s seconds from now (the run lease and a
-- tolerance): no heartbeat on this clock wrote it, so it was written before a step back of the
-- database clock. Their ids, leases and the clock, for the reaper to count them on its own clock.
SELECT id, locked_until, statement_timestamp() AS db_now FROM cron_at_scale_jobattempt
WHERE finished_at IS NULL AND started_at IS NOT NULL
  AND locked_until > statement_timestamp() + make_interval(secs => %(beyond)s)
ORDER BY locked_until
LIMIT %(limit)s;

-- name: reap_once  -- run by: cron_at_scale.maintenance.reaper
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

-- name: refire_cron  -- run by: cron_at_scale.maintenance.reaper
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

-- name: overdue_jobs  -- run by: cron_at_scale.maintenance.overdue
-- Recurring jobs overdue now, most overdue first, at most %(limit)s; total: how many in all.
-- The rule (cron_at_scale.maintenance.overdue): a pending recurring job is overdue when the
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

-- name: recurring_health  -- run by: cron_at_scale.maintenance.overdue
-- Live recurring jobs with a key (at most %(limit)s, by key): overdue or not (the
-- rule of overdue_jobs), the latest success. The metrics' per-key gauges.
SELECT key, last_success_at,
       status = 'pending' AND GREATEST(LEAST(due_since, GREATEST(fire_at, occurrence_at)), resumed_at)
           <= statement_timestamp() - make_interval(secs => COALESCE(grace, %(grace)s::float8)) AS overdue
FROM cron_at_scale_job
WHERE NOT schedule_type = 'once' AND key IS NOT NULL AND status IN ('pending', 'paused')
ORDER BY key
LIMIT %(limit)s;

-- name: overdue_open  -- run by: cron_at_scale.maintenance.overdue
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

-- name: overdue_close  -- run by: cron_at_scale.maintenance.overdue
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

-- name: history_due  -- run by: cron_at_scale.maintenance.history
-- Recurring jobs with attempts to trim (cron_at_scale.maintenance.history): their oldest attempt row is
-- not their latest, and is beyond their latest %(keep)s or older than %(age)s seconds (NULL:
-- no such limit). One index probe per recurring job.
SELECT j.id, j.attempts
FROM cron_at_scale_job AS j
CROSS JOIN LATERAL (SELECT a.attempt, a.dispatched_at FROM cron_at_scale_jobattempt AS a
                    WHERE a.job_id = j.id ORDER BY a.attempt LIMIT 1) AS oldest
WHERE NOT j.schedule_type = 'once' AND oldest.attempt < j.attempts
  AND (oldest.attempt <= j.attempts - %(keep)s::int
       OR oldest.dispatched_at < statement_timestamp() - make_interval(secs => %(age)s::float8));

-- name: history_trim :async  -- run by: cron_at_scale.maintenance.history
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

-- name: retention_cutoff  -- run by: cron_at_scale.maintenance.retention
-- Retention (cron_at_scale/maintenance/retention.py): finished jobs last updated before this are purged.
SELECT statement_timestamp() - make_interval(secs => %(age)s);

-- name: retention_chunk  -- run by: cron_at_scale.maintenance.retention
-- The next chunk of finished jobs, oldest first: a keyset walk of cron_job_finished_updated.
SELECT id, updated_at FROM cron_at_scale_job
WHERE status IN ('completed', 'cancelled') AND updated_at < %(cutoff)s
  AND (updated_at, id) > (%(after_at)s, %(after_id)s)
ORDER BY updated_at, id
LIMIT %(n)s;

-- name: retention_count_attempts  -- run by: cron_at_scale.maintenance.retention
SELECT count(*) FROM cron_at_scale_jobattempt WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL;

-- name: retention_delete_attempts  -- run by: cron_at_scale.maintenance.retention
-- At most %(n)s finished attempts of these jobs, skipping rows another session holds.
DELETE FROM cron_at_scale_jobattempt WHERE id IN (
    SELECT id FROM cron_at_scale_jobattempt
    WHERE job_id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
);

-- name: retention_delete_jobs  -- run by: cron_at_scale.maintenance.retention
-- The jobs, re-checked under their row lock: still finished, still old, no attempt left.
DELETE FROM cron_at_scale_job WHERE id IN (
    SELECT j.id FROM cron_at_scale_job AS j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status IN ('completed', 'cancelled') AND j.updated_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS a WHERE a.job_id = j.id)
    FOR UPDATE SKIP LOCKED
);

-- name: archive_move  -- run by: cron_at_scale.maintenance.archive
-- History (cron_at_scale/maintenance/archive.py): up to %(n)s finished jobs, oldest first, leave the
-- live tables with their attempts, into the history tables, in one statement: completed or cancelled
-- more than %(after)s seconds ago, every attempt finished (a cancelled job's last run may still be
-- going; it stays). Rows another session holds are skipped, never waited for. The job row is
-- locked first: the statements that add an attempt lock their job, so no attempt of a moving job
-- appears meanwhile. The bodies are copied once, here; the history rows are never updated.
-- The finished-jobs walk is retention's index, cron_job_finished_updated, from %(floor)s (the
-- mover's floor: its entries below are those of rows already moved, dead but kept in the index while
-- the vacuum horizon is pinned; '-infinity' walks it all). Returns the jobs moved and the newest
-- updated_at among them.
WITH moving AS (
    SELECT j.id FROM cron_at_scale_job AS j
    WHERE j.status IN ('completed', 'cancelled')
      AND j.updated_at >= %(floor)s::timestamptz
      AND j.updated_at < statement_timestamp() - make_interval(secs => %(after)s)
      AND NOT EXISTS (SELECT 1 FROM cron_at_scale_jobattempt AS a WHERE a.job_id = j.id AND a.finished_at IS NULL)
    ORDER BY j.updated_at, j.id
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM cron_at_scale_jobattempt AS a USING moving AS m WHERE a.job_id = m.id RETURNING a.*
), jobs AS (
    DELETE FROM cron_at_scale_job AS j USING moving AS m WHERE j.id = m.id RETURNING j.*
), kept_attempts AS (
    INSERT INTO cron_at_scale_attempthistory SELECT statement_timestamp(), attempts.* FROM attempts
), kept_jobs AS (
    INSERT INTO cron_at_scale_jobhistory SELECT statement_timestamp(), jobs.* FROM jobs RETURNING updated_at
)
SELECT count(*) AS moved, max(updated_at) AS newest FROM kept_jobs;

-- name: history_lock  -- run by: cron_at_scale.maintenance.archive
-- One dispatcher at a time attaches and drops history partitions: a session lock (released with
-- the session if its dispatcher dies), tried, never waited for. No lease row: a row updated per
-- pass would pile up dead versions under a pinned vacuum horizon.
SELECT pg_try_advisory_lock(hashtext('cron_at_scale:history partitions')) AS locked;

-- name: history_unlock  -- run by: cron_at_scale.maintenance.archive
SELECT pg_advisory_unlock(hashtext('cron_at_scale:history partitions')) AS unlocked;

-- name: history_partitions  -- run by: cron_at_scale.maintenance.archive
-- The partitions of both history tables, with their bounds (read back from the catalog), and whether
-- a DETACH ... CONCURRENTLY was cut short (PostgreSQL 14+; to_jsonb reads the column where it exists).
SELECT p.relname AS parent, c.relname AS name,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lower,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz AS upper,
       coalesce((to_jsonb(i) ->> 'inhdetachpending')::boolean, false) AS detaching
FROM pg_inherits AS i
JOIN pg_class AS p ON p.oid = i.inhparent
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE p.oid IN ('cron_at_scale_jobhistory'::regclass, 'cron_at_scale_attempthistory'::regclass)
ORDER BY p.relname, 3;

-- name: history_create_partition  -- run by: cron_at_scale.maintenance.archive
-- A partition is made as a table of its own, then attached: ATTACH PARTITION takes SHARE UPDATE
-- EXCLUSIVE on the parent, which the moves' inserts do not wait for (CREATE TABLE ... PARTITION OF
-- would take ACCESS EXCLUSIVE). Its CHECK makes the attach skip its validation scan.
CREATE TABLE IF NOT EXISTS {partition} (LIKE {parent} INCLUDING DEFAULTS,
    CONSTRAINT {check} CHECK (archived_at >= %(lower)s AND archived_at < %(upper)s));

-- name: history_attach_partition  -- run by: cron_at_scale.maintenance.archive
ALTER TABLE {parent} ATTACH PARTITION {partition} FOR VALUES FROM (%(lower)s) TO (%(upper)s);

-- name: history_drop_check  -- run by: cron_at_scale.maintenance.archive
-- Once attached, the partition's bound says what the CHECK said.
ALTER TABLE {partition} DROP CONSTRAINT IF EXISTS {check};

-- name: history_detach_partition  -- run by: cron_at_scale.maintenance.archive
-- Outside any transaction block (so on a direct connection, never through a transaction pooler):
-- it waits for the transactions that use the parent, without blocking them or the moves.
ALTER TABLE {parent} DETACH PARTITION {partition} CONCURRENTLY;

-- name: history_detach_partition_locking  -- run by: cron_at_scale.maintenance.archive
-- PostgreSQL 13, which has no DETACH ... CONCURRENTLY: ACCESS EXCLUSIVE on the parent, briefly.
ALTER TABLE {parent} DETACH PARTITION {partition};

-- name: history_finalize_detach  -- run by: cron_at_scale.maintenance.archive
-- A DETACH ... CONCURRENTLY cut short (a timeout, a crash) is finished this way.
ALTER TABLE {parent} DETACH PARTITION {partition} FINALIZE;

-- name: history_drop_partition  -- run by: cron_at_scale.maintenance.archive
DROP TABLE IF EXISTS {partition};

-- name: history_statement_timeout  -- run by: cron_at_scale.maintenance.archive
-- The partition statements' own limit, set for the session around them and reset after: a detach
-- waiting for a long transaction (an analytics query on the history) is let go, and finished later.
SELECT set_config('statement_timeout', %(timeout)s, false) AS statement_timeout;
