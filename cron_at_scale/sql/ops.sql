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
