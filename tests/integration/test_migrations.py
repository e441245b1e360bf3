"""Upgrading a database with jobs in it: migration 0007 (UUIDv7 ids, shard from the id's last 32 bits), the\nmigration linter (no lock that grows with a table after 0007), and an upgrade while the system fires."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from helpers import RecordingPublisher, sql, wait_until

from cron_at_scale.models import NUM_SHARDS, Job

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("cron_at_scale", "0006_attempt_job_no_db_constraint")]


def _latest():
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == "cron_at_scale"]


def test_jobs_stored_before_0007_keep_a_uniform_shard_and_are_all_claimed(monkeypatch):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        ids = [uuid.uuid4() for _ in range(3000)]  # the ids made before 0007
        sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
               SELECT i, statement_timestamp() - interval '1 second', 'demo.tasks.noop', '{}', '{}'
               FROM unnest(%s::uuid[]) AS i""", [ids])
        old = dict(sql("SELECT id, shard FROM cron_at_scale_job"))
        assert old[ids[0]] == (int(ids[0].hex[:8], 16) & 0x7FFFFFFF) % NUM_SHARDS  # 0006: the first 32 bits
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(_latest())
    new = dict(sql("SELECT id, shard FROM cron_at_scale_job"))
    assert new.keys() == old.keys()
    assert all(new[i] == (int(i.hex[-8:], 16) & 0x7FFFFFFF) % NUM_SHARDS for i in ids)
    assert len(set(new.values())) == NUM_SHARDS
    (plan,), = sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'cron_job_pending_shard'")
    assert plan == 1

    # Every old job is claimed by the dispatchers that split the shards between them.
    from cron_at_scale.dispatcher import Dispatcher

    halves = [set(range(0, 32)), set(range(32, 64))]
    claimed = []
    for shards in halves:
        d = Dispatcher(name=f"d{min(shards)}", batch_size=5000, publisher=RecordingPublisher())
        d._next_shards, d.shards.owned = float("inf"), shards  # holds these 32 shards
        got = d.claim()
        assert all(new[r.job_id] in shards for r in got)
        claimed += [r.job_id for r in got]
    assert sorted(claimed) == sorted(ids)
    assert Job.objects.filter(status="in_progress").count() == 3000


def test_0010_leaves_stored_jobs_as_they_were_and_rewrites_nothing():
    executor = MigrationExecutor(connection)
    executor.migrate([("cron_at_scale", "0009_worker_health")])
    try:
        sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
               VALUES (%s, statement_timestamp(), 'demo.tasks.noop', '{}', '{}')""", [uuid.uuid4()])
        (before,), = sql("SELECT relfilenode FROM pg_class WHERE relname = 'cron_at_scale_job'")
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(_latest())
    (after,), = sql("SELECT relfilenode FROM pg_class WHERE relname = 'cron_at_scale_job'")
    assert after == before  # no table rewrite
    assert [r[0] for r in sql("SELECT max_retries FROM cron_at_scale_job")] == [3]  # the default it was stored with
    (nullable, default), = sql("""SELECT is_nullable, column_default FROM information_schema.columns
                                  WHERE table_name = 'cron_at_scale_job' AND column_name = 'max_retries'""")
    assert (nullable, default) == ("YES", None)  # a job inserted without it takes the task's


# -- no lock that grows with a table, from 0008 on (migration_lint) -------------------------------------


def _ours_after(number: int) -> list[str]:
    executor = MigrationExecutor(connection)
    names = [name for app, name in executor.loader.graph.nodes if app == "cron_at_scale"]
    return sorted(n for n in names if int(n.split("_", 1)[0]) > number)


def test_every_migration_after_0007_holds_no_lock_for_the_tables_size():
    from migration_lint import problems, sql_of

    names = _ours_after(7)
    assert "0008_attempt_run_token_dispatch_losses" in names and len(names) >= 4
    found = {name: problems(sql_of("cron_at_scale", name)) for name in names}
    assert {name: p for name, p in found.items() if p} == {}
    # The linter knows the one that did: 0007 rewrote the jobs table (the shard column computed again).
    assert problems(sql_of("cron_at_scale", "0007_job_ids_uuid7"))


def _bad(*operations, atomic=True):
    """The SQL of a migration made of ``operations``, applied after the latest one."""
    from django.db import migrations
    from migration_lint import sql_of_migration

    executor = MigrationExecutor(connection)
    state = executor.loader.project_state(_latest()[0], at_end=True)
    migration = type("Migration", (migrations.Migration,), {"operations": list(operations), "atomic": atomic})(
        "9999_synthetic", "cron_at_scale")
    return sql_of_migration(migration, state)


def test_the_migration_linter_catches_each_lock_that_grows_with_the_table():
    from django.contrib.postgres.functions import RandomUUID
    from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
    from django.db import migrations, models
    from django.db.models.functions import Now
    from migration_lint import problems

    bad = {
        "index built without CONCURRENTLY": migrations.AddIndex(
            "job", models.Index(fields=["locked_by"], name="cron_job_synthetic")),
        "index dropped without CONCURRENTLY": migrations.RemoveIndex("job", "cron_job_task_fire_at"),
        "SET NOT NULL": migrations.AlterField("job", "locked_until", models.DateTimeField(db_default=Now())),
        "volatile default": migrations.AddField("job", "token", models.UUIDField(db_default=RandomUUID())),
        "constraint without NOT VALID": migrations.AddConstraint(
            "job", models.CheckConstraint(condition=models.Q(retries__lte=1000), name="cron_job_synthetic_check")),
        "constraint on an added column": migrations.AddField("job", "weight", models.PositiveIntegerField(null=True)),
        "column type change": migrations.AlterField("jobattempt", "worker", models.TextField(blank=True)),
        "UNIQUE/PRIMARY KEY constraint built under lock": migrations.AddConstraint(
            "jobattempt", models.UniqueConstraint(fields=["job", "scheduled_at"], name="cron_attempt_synthetic")),
    }
    for what, operation in bad.items():
        found = problems(_bad(operation))
        assert any(what in p for p in found), (what, found)
    fine = [
        AddIndexConcurrently("job", models.Index(fields=["locked_by"], name="cron_job_synthetic")),
        RemoveIndexConcurrently("job", "cron_job_task_fire_at"),
        migrations.AddField("job", "note", models.TextField(blank=True, db_default="")),  # constant default
        migrations.AddField("job", "seen_at", models.DateTimeField(null=True, db_default=Now())),  # stable
        migrations.AlterField("job", "max_retries", models.PositiveIntegerField(null=True, blank=True, db_default=3)),
        migrations.CreateModel("Synthetic", [("id", models.BigAutoField(primary_key=True)),
                                             ("n", models.PositiveIntegerField(db_index=True))]),
    ]
    for operation in fine:
        assert problems(_bad(operation, atomic=not isinstance(operation, (AddIndexConcurrently,
                                                                           RemoveIndexConcurrently)))) == []


# -- upgrading a live database: firing goes on while migrate runs ---------------------------------------

UPGRADE_JOBS = int(os.environ.get("CRON_AT_SCALE_UPGRADE_JOBS", "100000"))  # docs/upgrading.md: 1,000,000
STREAM_PER_S = 20  # due jobs a second, fired all through the upgrade


class _Lines:
    """A file-like object over generated COPY text lines (psycopg2's copy_expert reads it)."""

    def __init__(self, lines):
        self.lines = iter(lines)
        self.buffer = ""

    def read(self, size=65536):
        while len(self.buffer) < size:
            line = next(self.lines, None)
            if line is None:
                break
            self.buffer += line
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    readline = read


def load_jobs(n: int) -> None:
    """``n`` jobs by COPY, as a database that has run a while: 70% completed (each with its attempt),
    30% pending over the next 30 days (none due during the test)."""
    ids = [uuid.uuid4() for _ in range(n)]
    done = int(n * 0.7)
    with connection.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        (now,), = cur.fetchall()
        jobs = (f"{i}\t{now - timedelta(seconds=k)}\tdemo.tasks.noop\t{{}}\t{{}}\t"
                f"{'completed' if k < done else 'pending'}\t{now - timedelta(seconds=k)}\t{1 if k < done else 0}\n"
                if k < done else
                f"{i}\t{now + timedelta(days=1, seconds=k)}\tdemo.tasks.noop\t{{}}\t{{}}\tpending\t{now}\t0\n"
                for k, i in enumerate(ids))
        cur.copy_expert("COPY cron_at_scale_job (id, fire_at, task, payload, options, status, updated_at, attempts) "
                        "FROM STDIN", _Lines(jobs))
        attempts = (f"{ids[k]}\t1\t{now - timedelta(seconds=k)}\t{now}\t{now}\t{now}\tsucceeded\n" for k in range(done))
        cur.copy_expert("COPY cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at, "
                        "finished_at, outcome) FROM STDIN", _Lines(attempts))
        cur.execute("ANALYZE cron_at_scale_job")
        cur.execute("ANALYZE cron_at_scale_jobattempt")


def _gaps(times: list[float], start: float, end: float) -> float:
    """The longest time without a fire in [start, end] (fires at ``times``, sorted)."""
    inside = [start] + [t for t in times if start <= t <= end] + [end]
    return max(b - a for a, b in zip(inside, inside[1:]))


INDEX_ONLY = ("AddIndexConcurrently", "RemoveIndexConcurrently", "AddIndex", "RemoveIndex")


def _upgrade_steps() -> tuple[tuple[str, str] | None, int]:
    """From the migration applied now to the latest: the last one that changes a table (columns, a
    table: this checkout's code needs it before it can run), and how many migrations after it only
    build or drop indexes."""
    executor = MigrationExecutor(connection)
    plan = [m for m, backwards in executor.migration_plan(_latest()) if not backwards]
    changes = [i for i, m in enumerate(plan) if any(type(op).__name__ not in INDEX_ONLY for op in m.operations)]
    if not changes:
        return None, len(plan)
    last = plan[changes[-1]]
    return (last.app_label, last.name), len(plan) - changes[-1] - 1


@pytest.mark.acceptance
def test_upgrading_a_live_database_from_0010_never_stops_firing_for_a_second(system, tmp_path):
    # A database of UPGRADE_JOBS jobs at 0010, upgraded to the latest migration. The dispatcher and
    # the worker (real processes) run this checkout's code, which reads the columns the migrations
    # add: so the migrations up to the last one that changes a table run first (catalog changes only,
    # as the linter above holds them; timed), then the processes start, due jobs come every 50 ms,
    # and `manage.py migrate` runs the rest (index builds and drops) meanwhile. Each run appends to
    # a ledger file (outside the database); no gap of a second or more around the live part.
    import subprocess
    import sys
    import time

    from demo.runner import PROJECT_DIR, wait_for_workers

    import cron_at_scale

    executor = MigrationExecutor(connection)
    executor.migrate([("cron_at_scale", "0010_job_max_retries_the_tasks")])
    migrated = False
    try:
        t0 = time.monotonic()
        load_jobs(UPGRADE_JOBS)
        loaded = time.monotonic() - t0
        tables_step, live_steps = _upgrade_steps()
        t0 = time.monotonic()
        if tables_step:
            executor = MigrationExecutor(connection)
            executor.loader.build_graph()
            executor.migrate([tables_step])
        tables_seconds = time.monotonic() - t0
        ledger = tmp_path / "ledger.txt"
        system.worker("w1", concurrency=2)
        system.dispatcher("d1")
        wait_for_workers(system.app, ["w1"])
        (now,), = sql("SELECT statement_timestamp()")
        cron_at_scale.schedule_many([{"task": "demo.tasks.ledger", "kwargs": {"path": str(ledger)},
                                      "at": now + timedelta(seconds=1 + i / STREAM_PER_S)}
                                     for i in range(STREAM_PER_S * 300)])

        def fired() -> list[float]:
            return sorted(float(line.split()[3]) for line in ledger.read_text().splitlines()) if ledger.exists() else []

        wait_until(lambda: len(fired()) >= 2 * STREAM_PER_S, timeout=60, what="the stream to fire")
        moving_from = time.time()  # the dispatcher moves the finished jobs to the history meanwhile
        started = time.time()
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "cron_at_scale", "-v", "1"], cwd=PROJECT_DIR,
                                 env=system.env, capture_output=True, text=True, timeout=600)
        ended = time.time()
        migrated = migrate.returncode == 0
        assert migrated, migrate.stdout + migrate.stderr
        # The finished jobs older than HISTORY_AFTER leave the job table in batches, firing going on.
        old_finished = ("SELECT count(*) FROM cron_at_scale_job WHERE status = 'completed' "
                        "AND updated_at < statement_timestamp() - interval '3600 seconds'")  # HISTORY_AFTER
        wait_until(lambda: sql(old_finished)[0][0] == 0, timeout=600, interval=0.5, what="the moves to the history")
        moved_by = time.time()
        time.sleep(2.0)
        times = fired()
    finally:
        if not migrated:
            executor = MigrationExecutor(connection)
            executor.loader.build_graph()
            executor.migrate(_latest())
    gap = _gaps(times, started - 1.0, ended + 1.0)
    print(f"\nupgrade of {UPGRADE_JOBS:,} jobs (loaded by COPY in {loaded:.1f}s): to {tables_step} in "
          f"{tables_seconds:.2f}s before the processes started; then migrate took {ended - started:.2f}s live; "
          f"{sum(started <= t <= ended for t in times)} fires during it; longest gap {gap:.3f}s\n{migrate.stdout}")
    assert migrate.stdout.count("Applying cron_at_scale.") == live_steps  # the index migrations ran live
    assert gap < 1.0
    # Every finished job is in one place or the other, once, with its attempt.
    done = int(UPGRADE_JOBS * 0.7)
    # One statement, one snapshot: the moves go on, and two counts could see one job in both places.
    (live_done, moved, moved_ids, moved_attempts), = sql(
        "SELECT (SELECT count(*) FROM cron_at_scale_job WHERE status = 'completed' AND task = 'demo.tasks.noop'), "
        "(SELECT count(*) FROM cron_at_scale_jobhistory), (SELECT count(DISTINCT id) FROM cron_at_scale_jobhistory), "
        "(SELECT count(*) FROM cron_at_scale_attempthistory WHERE job_id IN "
        " (SELECT id FROM cron_at_scale_jobhistory WHERE task = 'demo.tasks.noop'))")
    move_gap = _gaps(times, moving_from, moved_by)
    print(f"moved {moved:,} finished jobs to the history in {moved_by - moving_from:.1f}s while firing; "
          f"longest gap {move_gap:.3f}s")
    assert moved == moved_ids and live_done + moved == done and moved > done * 0.9
    assert moved_attempts == moved  # each loaded finished job had one attempt; the stream's are too young to move
    assert move_gap < 1.0
