-- The runner's own statements, for every room: the database clock (cron_at_scale.sql.db_now).
-- Loaded by cron_at_scale/sql/__init__.py with the other rooms' files (a name is unique across them):
-- each query starts with a "-- name: <name> [:option ...]  -- run by: <module>" line, the module
-- the one that runs it (tests/unit/test_sql.py checks it); parameters are %(name)s.
-- Options: :async (this statement commits with synchronous_commit off: its loss in a
-- crash is harmless, its comment says why), :prepared (run per task by every worker:
-- a prepared statement with a generic plan, see cron_at_scale/sql/__init__.py).
-- Every time comes from the database clock, never from a node: statement_timestamp()
-- (not now(), which is frozen at the start of a surrounding transaction).

-- name: db_now  -- run by: cron_at_scale.sql
-- The database's clock (an aware timestamptz, UTC on Django's connection): the one read of it by
-- itself, through cron_at_scale.sql.db_now (schedule(), a change under a row lock, beat's import,
-- cron_status, and a worker's measure of its own clock's offset, cron_at_scale.worker.clock).
-- Statements that need the time read statement_timestamp() themselves, in the same round trip.
SELECT statement_timestamp() AS db_now;
