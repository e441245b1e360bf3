-- The operator's statements: the admin's lists, the system checks (cron_at_scale/admin.py,
-- cron_at_scale/checks.py). cron_status's bounded counts are built in cron_at_scale/ops/status.py.
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: task_names  -- run by: cron_at_scale.admin
-- The distinct task names (at most %(limit)s), for the admin's task filter: a skip scan of the
-- index leading on task, one index probe per value, whatever the table size.
WITH RECURSIVE v AS (
    (SELECT task AS value FROM cron_at_scale_job ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT task FROM cron_at_scale_job WHERE task > v.value ORDER BY task LIMIT 1)
    FROM v WHERE v.value IS NOT NULL
)
SELECT value FROM v WHERE value IS NOT NULL LIMIT %(limit)s;

-- name: durability_settings  -- run by: cron_at_scale.checks
-- The server's fsync and synchronous_commit, for the system check that warns when a start of an
-- attempt could be lost in a crash (cron_at_scale.W004).
SELECT current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS synchronous_commit;

-- name: oldest_due_per_queue  -- run by: cron_at_scale.ops.status
-- The oldest due, unclaimed job of each job queue ('' is the default: routed by task), for the
-- dashboard's queues section: one walk of the oldest %(per_shard)s due pending jobs of each shard
-- (%(shards)s: every shard) in fire_at order, by the claim's (shard, fire_at) index, so a backlog of
-- millions costs a bounded read; a queue whose due jobs all lie beyond those walks is not listed.
SELECT DISTINCT ON (queue) queue, task, id, fire_at,
       extract(epoch FROM statement_timestamp() - fire_at)::float8 AS late_seconds
FROM unnest(%(shards)s::smallint[]) AS s(shard)
CROSS JOIN LATERAL (
    SELECT queue, task, id, fire_at FROM cron_at_scale_job
    WHERE status = 'pending' AND shard = s.shard AND fire_at <= statement_timestamp()
    ORDER BY fire_at LIMIT %(per_shard)s
) AS due
ORDER BY queue, fire_at
LIMIT 200;
