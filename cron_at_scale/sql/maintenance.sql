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
