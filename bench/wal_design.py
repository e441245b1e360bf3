"""WAL per job of the job table as built and of designs not built: a design pass in SQL, with numbers.

Usage (a PostgreSQL 15+ server with ``pg_walinspect``, a private one: the script runs
``CHECKPOINT``)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5499/soak python bench/wal_design.py --jobs 20000 --turns 2

It makes a schema per variant in that database (``wal_today``, ``wal_pending``, ``wal_hot``,
dropped at its start), with the app's own column set (``LIKE`` the tables of the migrations,
which it runs first), and drives one-off jobs through their whole life in plain SQL, in the
batches the product uses: a ``COPY`` of 1,000, claims of 100 per shard with ``FOR UPDATE SKIP
LOCKED``, starts of 3 (a worker's prefetched batch, synchronous commit), completions of 20 (the
writer thread's). No Celery, no dispatcher: the statements are models of the product's, with its
rows and its indexes, so the WAL they write is the product's; what they read is not timed.

Variants:

- ``today``: the job and attempt tables as the migrations leave them (every index). The job row's
  claim and completion change ``status``, which indexes hold, so neither is a HOT update.
- ``v0020``: ``today`` as migration 0020 left it, before 0021: the admin's ``(status, fire_at, id)``
  index over every row, pending ones too (0021 left them out). The step's before and after, in turns.
- ``pending``: the job table with no index on any column an update changes (primary key and
  ``(task, fire_at, id)`` only; ``fillfactor`` ``--fillfactor``), and a narrow ``pending (shard,
  fire_at, id)`` table the claim deletes from. The claim's and the completion's job updates can be
  HOT; the live key, the admin's status lists and retention would read other tables (docs/storage.md).
- ``hot``: ``pending`` plus an attempt table without the partial index on unfinished attempts, so an
  attempt's finish is HOT too (the reaper would find in-flight attempts through the job table).
- ``ordered``: ``hot`` with the columns each step changes moved to the end of their row: a HOT
  update's record holds only the bytes from the first to the last it changed.
- ``merged``: ``ordered`` with no attempt row while a job's first attempt is in flight: its run
  lives on the job row (HOT updates), and the attempt's row is written once, as it ends, into an
  append-only log keyed by (job_id, attempt). The fewest row versions a job can have with a
  durable claim, start and finish of its own.
- ``batchlog``: state kept per batch, not per job (PgQue's way): the job row is written once; a
  claim moves a per-shard cursor past what it took and appends one row holding the batch's ids, as
  do a start and a completion. Nothing reads it back here: what every reader of a job's state
  would then have to do (the reaper, the admin, the fencing of a start) is not designed.

How a job leaves is not in the figures: ``today``'s purge (two deletes a job) is measured apart
(``--purge``); the other two would leave by dropping a partition (no WAL per job). Prints per
variant and turn the bytes per job (with and without full-page images), per relation, and the
index entries per job; then the medians.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]

VARIANTS = ("today", "v0020", "pending", "hot", "ordered", "merged", "batchlog")
TODAYS = ("today", "v0020")  # the product's own tables: its claim, no pending table
TASK, PAYLOAD = "demo.tasks.noop", '{"args": [1], "kwargs": {}}'


# What each step of a one-off job's life changes: the claim and the completion on the job row, the
# start and the finish on the attempt row. ``ordered`` puts them last, next to each other.
JOB_CHANGES = ("status", "attempts", "locked_by", "locked_until", "updated_at")
ATTEMPT_CHANGES = ("started_at", "finished_at", "locked_until", "worker", "outcome", "run_token")


def ordered_table(q, source: str, target: str, last: tuple[str, ...], fillfactor: int) -> str:
    """``CREATE TABLE target`` with ``source``'s columns (types, defaults, generated), ``last`` moved to
    the end: a HOT update logs only the bytes between its first and last changed byte."""
    cols = q("""SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attgenerated,
                       pg_get_expr(d.adbin, d.adrelid)
                FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
             [source], fetch=True)
    cols.sort(key=lambda c: c[0] in last and 1 + last.index(c[0]))
    defs = []
    for name, kind, notnull, generated, expr in cols:
        d = f'"{name}" {kind}'
        if generated:
            d += f" GENERATED ALWAYS AS ({expr}) STORED"
        elif expr:
            d += f" DEFAULT {expr}"
        defs.append(d + (" NOT NULL" if notnull else ""))
    return f"CREATE TABLE {target} ({', '.join(defs)}) WITH (fillfactor = {fillfactor})"


def narrow_job(s: str) -> list[str]:
    """The designs' job table indexes (none holds a column an update changes) and their pending table."""
    return [f"ALTER TABLE {s}.job ADD PRIMARY KEY (id)",
            f"CREATE INDEX ON {s}.job (task, fire_at, id)",
            f"CREATE TABLE {s}.pending (shard smallint NOT NULL, fire_at timestamptz NOT NULL, id uuid NOT NULL)",
            f"CREATE INDEX ON {s}.pending (shard, fire_at)"]


def log_table(name: str, columns: str) -> str:
    return f"CREATE TABLE {name} (at timestamptz NOT NULL DEFAULT statement_timestamp(), {columns})"


ATTEMPT_LIKE = "(LIKE public.cron_at_scale_jobattempt INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS)"


def schema_sql(variant: str, fillfactor: int, q) -> list[str]:
    s = f"wal_{variant}"
    out = [f"DROP SCHEMA IF EXISTS {s} CASCADE", f"CREATE SCHEMA {s}"]
    if variant in TODAYS:
        out += [f"CREATE TABLE {s}.job (LIKE public.cron_at_scale_job INCLUDING ALL)",
                f"CREATE TABLE {s}.attempt (LIKE public.cron_at_scale_jobattempt INCLUDING ALL)",
                f"ALTER TABLE {s}.attempt SET (fillfactor = 70)"]  # as migration 0020
    elif variant in ("pending", "hot"):
        out += [f"CREATE TABLE {s}.job (LIKE public.cron_at_scale_job INCLUDING DEFAULTS INCLUDING GENERATED) "
                f"WITH (fillfactor = {fillfactor})", *narrow_job(s),
                f"CREATE TABLE {s}.attempt {ATTEMPT_LIKE} WITH (fillfactor = 70)",
                f"ALTER TABLE {s}.attempt ADD PRIMARY KEY (id)",
                f"ALTER TABLE {s}.attempt ADD UNIQUE (job_id, attempt)"]
        if variant == "pending":
            out.append(f"CREATE INDEX ON {s}.attempt (job_id) WHERE finished_at IS NULL")
    elif variant == "ordered":
        out += [ordered_table(q, "public.cron_at_scale_job", f"{s}.job", JOB_CHANGES, fillfactor), *narrow_job(s),
                ordered_table(q, "public.cron_at_scale_jobattempt", f"{s}.attempt", ATTEMPT_CHANGES, 70),
                f"ALTER TABLE {s}.attempt ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY",
                f"ALTER TABLE {s}.attempt ADD PRIMARY KEY (id)",
                f"ALTER TABLE {s}.attempt ADD UNIQUE (job_id, attempt)"]
    elif variant == "merged":
        out += [ordered_table(q, "public.cron_at_scale_job", f"{s}.job", JOB_CHANGES, fillfactor),
                f"ALTER TABLE {s}.job ADD COLUMN run_started_at timestamptz, ADD COLUMN run_token uuid, "
                f"ADD COLUMN run_worker varchar(200) NOT NULL DEFAULT ''", *narrow_job(s),
                f"CREATE TABLE {s}.attempt {ATTEMPT_LIKE}",
                f"ALTER TABLE {s}.attempt ADD PRIMARY KEY (job_id, attempt)"]
    else:  # batchlog
        out += [f"CREATE TABLE {s}.job (LIKE public.cron_at_scale_job INCLUDING DEFAULTS INCLUDING GENERATED)",
                f"ALTER TABLE {s}.job ADD PRIMARY KEY (id)",
                f"CREATE INDEX ON {s}.job (shard, fire_at, id)",
                f"CREATE TABLE {s}.cursor (shard smallint PRIMARY KEY, fire_at timestamptz NOT NULL, id uuid NOT NULL) "
                f"WITH (fillfactor = 50)",
                f"INSERT INTO {s}.cursor SELECT g, '-infinity', '00000000-0000-0000-0000-000000000000' "
                f"FROM generate_series(0, 63) AS g",
                log_table(f"{s}.claim_log", "job_ids uuid[] NOT NULL, attempts int[] NOT NULL"),
                log_table(f"{s}.start_log", "worker text NOT NULL, job_ids uuid[] NOT NULL, attempts int[] NOT NULL, "
                                            "tokens uuid[] NOT NULL"),
                log_table(f"{s}.finish_log", "job_ids uuid[] NOT NULL, attempts int[] NOT NULL, "
                                             "outcomes text[] NOT NULL")]
    if variant == "v0020":  # the status index over every row again, as before migration 0021
        out += [f"""DO $$ DECLARE name text; BEGIN
                        SELECT indexname INTO STRICT name FROM pg_indexes WHERE schemaname = '{s}'
                          AND indexdef LIKE '%(status, fire_at, id) WHERE%';
                        EXECUTE format('DROP INDEX {s}.%I', name); END $$""",
                f"CREATE INDEX ON {s}.job (status, fire_at, id)"]
    return out


def claim_sql(variant: str) -> str:
    s = f"wal_{variant}"
    if variant == "batchlog":  # a cursor per shard moves past what it claimed; the batch is one log row
        return f"""
WITH c AS (SELECT fire_at, id FROM {s}.cursor WHERE shard = %(shard)s FOR UPDATE), due AS (
    SELECT j.id, j.fire_at, j.attempts + 1 AS attempt FROM {s}.job AS j, c
    WHERE j.shard = %(shard)s AND (j.fire_at, j.id) > (c.fire_at, c.id) AND j.fire_at <= now()
    ORDER BY j.fire_at, j.id LIMIT %(limit)s
), moved AS (
    UPDATE {s}.cursor SET (fire_at, id) = (SELECT fire_at, id FROM due ORDER BY fire_at DESC, id DESC LIMIT 1)
    WHERE shard = %(shard)s AND EXISTS (SELECT 1 FROM due)
), logged AS (
    INSERT INTO {s}.claim_log (job_ids, attempts) SELECT array_agg(id), array_agg(attempt) FROM due HAVING count(*) > 0
)
SELECT id, attempt FROM due"""
    if variant in TODAYS:
        due = (f"SELECT id FROM {s}.job WHERE status = 'pending' AND shard = %(shard)s AND fire_at <= now() "
               f"ORDER BY fire_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED")
    else:  # the claim takes the pending entries away: nothing of the job row's indexes changes
        due = (f"DELETE FROM {s}.pending WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.pending "
               f"WHERE shard = %(shard)s AND fire_at <= now() ORDER BY fire_at LIMIT %(limit)s "
               f"FOR UPDATE SKIP LOCKED)) RETURNING id")
    tail = "SELECT id, attempts FROM claimed" if variant == "merged" else f"""
INSERT INTO {s}.attempt (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
SELECT id, attempts, fire_at, statement_timestamp(), locked_until, 'dispatched' FROM claimed
RETURNING job_id, attempt"""
    return f"""
WITH due AS ({due}), claimed AS (
    UPDATE {s}.job AS j
    SET status = 'in_progress', attempts = j.attempts + 1, locked_by = 'bench-dispatcher',
        locked_until = GREATEST(statement_timestamp(), j.fire_at) + interval '30 seconds',
        updated_at = statement_timestamp()
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id, j.attempts, j.fire_at, j.locked_until
)
{tail}"""


def start_sql(variant: str) -> str:
    s = f"wal_{variant}"
    if variant == "batchlog":
        return f"""
INSERT INTO {s}.start_log (worker, job_ids, attempts, tokens)
SELECT 'bench-host:1234', %(job_ids)s::uuid[], %(attempts)s::int[],
       ARRAY(SELECT gen_random_uuid() FROM unnest(%(attempts)s::int[]))"""
    if variant == "merged":  # the first attempt's run lives on the job row until it ends
        return f"""
UPDATE {s}.job AS j
SET run_started_at = statement_timestamp(), run_worker = 'bench-host:1234', run_token = gen_random_uuid(),
    locked_until = statement_timestamp() + interval '300 seconds'
WHERE j.id = ANY(%(job_ids)s::uuid[]) AND j.attempts = ANY(%(attempts)s::int[])"""
    return f"""
UPDATE {s}.attempt AS a
SET started_at = statement_timestamp(), outcome = 'running', worker = 'bench-host:1234',
    run_token = gen_random_uuid(), locked_until = statement_timestamp() + interval '300 seconds'
WHERE a.id = ANY(ARRAY(SELECT o.id FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
                       CROSS JOIN LATERAL (SELECT id FROM {s}.attempt
                                           WHERE job_id = r.job_id AND attempt = r.attempt LIMIT 1) AS o))"""


def finish_sql(variant: str) -> str:
    s = f"wal_{variant}"
    if variant == "batchlog":
        return f"""
INSERT INTO {s}.finish_log (job_ids, attempts, outcomes)
SELECT %(job_ids)s::uuid[], %(attempts)s::int[], ARRAY(SELECT 'succeeded' FROM unnest(%(attempts)s::int[]))"""
    if variant == "merged":  # the attempt's row is written once, as it ends: an append-only log
        return f"""
WITH done AS (
    UPDATE {s}.job AS j SET status = 'completed', locked_by = '', locked_until = NULL,
                            updated_at = statement_timestamp()
    WHERE j.id = ANY(%(job_ids)s::uuid[])
    RETURNING j.id, j.attempts, j.fire_at, j.run_started_at, j.run_worker, j.run_token
)
INSERT INTO {s}.attempt (job_id, attempt, scheduled_at, dispatched_at, started_at, finished_at, worker, outcome,
                         run_token)
SELECT id, attempts, fire_at, run_started_at, run_started_at, statement_timestamp(), run_worker, 'succeeded',
       run_token FROM done"""
    return f"""
WITH done AS (
    UPDATE {s}.attempt AS a SET finished_at = statement_timestamp(), outcome = 'succeeded'
    WHERE a.id = ANY(ARRAY(SELECT o.id FROM unnest(%(job_ids)s::uuid[], %(attempts)s::int[]) AS r(job_id, attempt)
                           CROSS JOIN LATERAL (SELECT id FROM {s}.attempt
                                               WHERE job_id = r.job_id AND attempt = r.attempt LIMIT 1) AS o))
    RETURNING a.job_id
)
UPDATE {s}.job AS j SET status = 'completed', locked_by = '', locked_until = NULL, updated_at = statement_timestamp()
WHERE j.id = ANY(ARRAY(SELECT job_id FROM done))"""


PURGE_SQL = """
WITH gone AS (DELETE FROM wal_{variant}.job WHERE id = ANY(%(ids)s::uuid[]) RETURNING id)
DELETE FROM wal_{variant}.attempt WHERE job_id = ANY(ARRAY(SELECT id FROM gone))"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs measured per variant and turn (20000)")
    p.add_argument("--warm", type=int, default=5_000, help="jobs through each variant before its window (5000)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--fillfactor", type=int, default=80, help="the job table's, in the designs not built (80)")
    p.add_argument("--records", action="store_true", help="also print each relation's bytes by record type")
    p.add_argument("--purge", action="store_true", help="also purge today's finished jobs in the window")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"--variants: unknown {sorted(unknown)}; choose among {VARIANTS}")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    os.environ.setdefault("CRON_AT_SCALE_SETTINGS", "")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from cron_at_scale.ids import job_ids

    call_command("migrate", verbosity=0)
    connection.ensure_connection()
    conn = connection.connection  # psycopg2's, for COPY and plain transactions
    conn.autocommit = True
    ids = job_ids()

    def q(sql: str, params=None, fetch: bool = False):
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if fetch else None

    def tx(sql: str, params=None, fetch: bool = False):
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                rows = cur.fetchall() if fetch else None
            conn.commit()
            return rows
        finally:
            conn.autocommit = True

    q("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    q("SET synchronous_commit = on")

    def lifecycle(variant: str, n: int) -> None:
        s = f"wal_{variant}"
        claim, start, finish = claim_sql(variant), start_sql(variant), finish_sql(variant)
        for base in range(0, n, 1000):
            made = [next(ids) for _ in range(min(1000, n - base))]
            now = datetime.now(timezone.utc).isoformat()
            text = "".join(f"{i.hex}\t{TASK}\t{PAYLOAD}\t{{}}\t{now}\n" for i in made)
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.copy_expert(f"COPY {s}.job (id, task, payload, options, fire_at) FROM STDIN", io.StringIO(text))
                if variant not in (*TODAYS, "batchlog"):
                    cur.execute(f"INSERT INTO {s}.pending (shard, fire_at, id) SELECT shard, fire_at, id FROM {s}.job "
                                f"WHERE id = ANY(%s::uuid[])", [[str(i) for i in made]])
            conn.commit()
            conn.autocommit = True
            claimed: list[tuple] = []
            for shard in range(64):
                while rows := tx(claim, {"shard": shard, "limit": 100}, fetch=True):
                    claimed += rows
            for i in range(0, len(claimed), 3):
                part = claimed[i:i + 3]
                tx(start, {"job_ids": [str(r[0]) for r in part], "attempts": [r[1] for r in part]})
            for i in range(0, len(claimed), 20):
                part = claimed[i:i + 20]
                tx(finish, {"job_ids": [str(r[0]) for r in part], "attempts": [r[1] for r in part]})
            if args.purge and variant in TODAYS:
                tx(PURGE_SQL.format(variant=variant), {"ids": [str(r[0]) for r in claimed]})
            if len(claimed) != len(made):
                raise SystemExit(f"{variant}: claimed {len(claimed)} of {len(made)}")

    def relation_names() -> dict[str, str]:
        rows = q("SELECT c.relfilenode::text, n.nspname || '.' || c.relname FROM pg_class c "
                 "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname LIKE 'wal_%%' "
                 "OR c.relname LIKE 'pg_%%'", fetch=True)
        return dict(rows)

    results: dict[str, list[dict]] = defaultdict(list)
    for turn in range(1, args.turns + 1):
        for variant in variants:
            for sql in schema_sql(variant, args.fillfactor, q):
                q(sql)
            lifecycle(variant, args.warm)
            q(f"VACUUM wal_{variant}.job")
            q("CHECKPOINT")
            [(start_lsn,)] = q("SELECT pg_current_wal_insert_lsn()", fetch=True)
            lifecycle(variant, args.jobs)
            [(end_lsn,)] = q("SELECT pg_current_wal_insert_lsn()", fetch=True)
            tx("SELECT txid_current()")  # a synchronous commit: the window is flushed, for pg_walinspect
            names = relation_names()
            by_rel: Counter = Counter()
            by_kind: Counter = Counter()
            kind_n: Counter = Counter()
            entries: Counter = Counter()
            total = fpi = 0
            records = q("SELECT resource_manager, record_type, record_length, fpi_length, block_ref "
                        "FROM pg_get_wal_records_info(%s, %s)", [start_lsn, end_lsn], fetch=True)
            for rmgr, rtype, length, fpi_len, block_ref in records:
                total += length
                fpi += fpi_len
                m = re.search(r"rel \d+/\d+/(\d+)", block_ref or "")
                rel = names.get(m.group(1), "other") if m else f"({rmgr})"
                by_rel[rel] += length - fpi_len
                by_kind[(rel, rtype)] += length - fpi_len
                kind_n[(rel, rtype)] += 1
                if rmgr == "Btree" and rtype.startswith("INSERT_LEAF"):
                    entries[rel] += 1
            n = args.jobs
            row = {"total": total / n, "no_fpi": (total - fpi) / n,
                   "by_rel": {k: v / n for k, v in by_rel.most_common()},
                   "entries": {k: v / n for k, v in entries.most_common()},
                   "records": {f"{r} {t}": (b / n, kind_n[(r, t)] / n) for (r, t), b in by_kind.most_common()}}
            results[variant].append(row)
            print(f"turn {turn} {variant:8s} {row['no_fpi']:7.0f} B/job without full-page images, "
                  f"{row['total']:7.0f} with; index entries/job {sum(row['entries'].values()):.1f}", flush=True)
            for rel, b in row["by_rel"].items():
                if b >= 5:
                    print(f"    {rel:45s} {b:6.0f} B   {row['entries'].get(rel, 0):4.1f} entries")
            if args.records:
                for what, (b, c) in row["records"].items():
                    if b >= 5:
                        print(f"      {what:60s} {b:6.0f} B  {c:4.2f} records  {b / c:5.0f} B each")
            q(f"DROP SCHEMA wal_{variant} CASCADE")
    print("\nmedians, B per job without full-page images (with):")
    for variant, rows in results.items():
        print(f"  {variant:8s} {statistics.median(r['no_fpi'] for r in rows):7.0f} "
              f"({statistics.median(r['total'] for r in rows):.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
