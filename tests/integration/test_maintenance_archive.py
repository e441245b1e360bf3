"""History: finished jobs leave the live table with their attempts, into time partitions dropped whole."""

from __future__ import annotations

import io
import threading
import time
from datetime import datetime, timedelta

import psycopg2
import pytest
from demo.tasks import noop
from django.db import DatabaseError, connection, transaction
from helpers import sql

import cron_at_scale
from cron_at_scale.maintenance import archive
from cron_at_scale.models import AttemptHistory, Job, JobAttempt, JobHistory

DAY = 86400


def job(status: str, age_seconds: float, attempts: int = 1, open_attempt: bool = False, **kw) -> Job:
    j = cron_at_scale.schedule(noop, kwargs={"n": 1, "text": "é" * 20}, **kw)
    sql("UPDATE cron_at_scale_job SET status = %s, attempts = %s, "
        "updated_at = statement_timestamp() - make_interval(secs => %s) WHERE id = %s",
        [status, attempts, age_seconds, j.id])
    for n in range(1, attempts + 1):
        finished = "NULL" if open_attempt and n == attempts else "statement_timestamp()"
        sql(f"INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, started_at, finished_at, outcome,"
            f" worker) VALUES (%s, %s, statement_timestamp(), statement_timestamp(), {finished}, 'succeeded', 'w1')",
            [j.id, n])
    return j


def partitions() -> list[tuple[str, str]]:
    return sql("""SELECT p.relname, c.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                  JOIN pg_class c ON c.oid = i.inhrelid
                  WHERE p.relname IN ('cron_at_scale_jobhistory', 'cron_at_scale_attempthistory')
                  ORDER BY 1, 2""")


def drop_all_partitions() -> None:
    for parent, name in partitions():
        sql(f'ALTER TABLE {parent} DETACH PARTITION "{name}"')
        sql(f'DROP TABLE "{name}"')


def session():
    """A second connection to the test database, as another process would hold one."""
    s = connection.settings_dict
    return psycopg2.connect(host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"] or None,
                            password=s["PASSWORD"] or None, dbname=s["NAME"])


def sql_rows(name: str):
    from cron_at_scale import sql as db

    return db.run(name)


def columns(table: str) -> list[tuple[str, str]]:
    return sql("""SELECT column_name, data_type FROM information_schema.columns
                  WHERE table_name = %s ORDER BY ordinal_position""", [table])


@pytest.mark.django_db
def test_the_history_tables_have_every_live_column_in_order():
    """The move inserts "statement_timestamp(), moved.*": a column added to a live table and not to
    its history table (or in another order) would put values in the wrong columns."""
    for live, history in [("cron_at_scale_job", "cron_at_scale_jobhistory"),
                          ("cron_at_scale_jobattempt", "cron_at_scale_attempthistory")]:
        assert columns(history) == [("archived_at", "timestamp with time zone")] + columns(live)


@pytest.mark.django_db
def test_finished_jobs_move_with_their_attempts_and_nothing_else_does():
    archive.keep_partitions(DAY, None)
    moving = [job("completed", 700, attempts=3) for _ in range(4)] + [job("cancelled", 900)]
    kept = [job("completed", 60), job("failed", 30 * DAY), job("pending", 30 * DAY), job("paused", 30 * DAY),
            job("in_progress", 30 * DAY), job("cancelled", 30 * DAY, attempts=2, open_attempt=True)]
    before = {r[0]: r[1] for r in sql("SELECT id, to_jsonb(j) FROM cron_at_scale_job j WHERE id = ANY(%s)",
                                      [[j.id for j in moving]])}
    attempts_before = sorted(r[0] for r in sql("SELECT to_jsonb(a) FROM cron_at_scale_jobattempt a "
                                               "WHERE job_id = ANY(%s)", [[j.id for j in moving]]))
    assert archive.move(600, batch_size=2) == (5, False)
    gone = [j.id for j in moving]
    assert not Job.objects.filter(id__in=gone).exists()
    assert not JobAttempt.objects.filter(job_id__in=gone).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {j.id for j in kept}
    assert JobAttempt.objects.filter(job_id__in=[j.id for j in kept]).count() == 1 + 1 + 1 + 1 + 1 + 2
    # Every byte of every column kept, archived_at added.
    after = {r[0]: r[1] for r in sql("SELECT id, to_jsonb(h) - 'archived_at' FROM cron_at_scale_jobhistory h")}
    assert after == before
    attempts_after = sorted(r[0] for r in sql("SELECT to_jsonb(h) - 'archived_at' FROM cron_at_scale_attempthistory h"))
    assert attempts_after == attempts_before and len(attempts_after) == 13
    h = JobHistory.objects.get(id=moving[0].id)
    assert (h.status, h.attempts, h.payload["kwargs"]) == ("completed", 3, {"n": 1, "text": "é" * 20})
    assert AttemptHistory.objects.filter(job_id=moving[0].id).count() == 3
    assert archive.move(600) == (0, False)


@pytest.mark.django_db
def test_without_a_partition_for_now_the_move_fails_and_changes_nothing():
    drop_all_partitions()  # in this test's transaction: rolled back after it
    done = job("completed", 700)
    with pytest.raises(DatabaseError, match="no partition"), transaction.atomic():
        archive.move(600)
    assert Job.objects.filter(id=done.id).exists() and JobAttempt.objects.filter(job_id=done.id).count() == 1
    assert not JobHistory.objects.exists()


@pytest.mark.django_db
def test_a_move_never_waits_for_a_job_another_session_holds():
    archive.keep_partitions(DAY, None)
    ours = [job("completed", 700), job("completed", 700)]
    other = session()
    try:
        # The test's rows are uncommitted (its transaction): the other session cannot see them, so it
        # holds a job of its own, committed, instead.
        with other.cursor() as cur:
            cur.execute("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, status, updated_at)
                           VALUES (gen_random_uuid(), now(), 'demo.tasks.noop', '{}', '{}', 'completed',
                                   now() - interval '1 hour') RETURNING id""")
            (theirs,) = cur.fetchone()
            other.commit()
            cur.execute("SELECT 1 FROM cron_at_scale_job WHERE id = %s FOR UPDATE", [theirs])
            sql("SET LOCAL lock_timeout = '2s'")  # a move that waited would fail here, not hang
            assert archive.move(600) == (2, False)  # ours moved; theirs skipped, not waited for
            assert Job.objects.filter(id=theirs).exists()
            other.rollback()
            cur.execute("DELETE FROM cron_at_scale_job WHERE id = %s", [theirs])
            other.commit()
    finally:
        other.close()
    assert {h.id for h in JobHistory.objects.all()} == {j.id for j in ours}


def test_move_and_settings_refuse_bad_input(settings):
    from cron_at_scale import conf

    with pytest.raises(ValueError, match="after_seconds"):
        archive.move(-1)
    with pytest.raises(ValueError, match="batch_size"):
        archive.move(60, batch_size=0)
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": -1, "HISTORY_PARTITION": 0}
    found = conf.problems()
    assert any("HISTORY_AFTER" in p for p in found) and any("HISTORY_PARTITION" in p for p in found)
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": None, "HISTORY_PARTITION": 3600}
    assert not [p for p in conf.problems() if "HISTORY" in p]


@pytest.fixture
def clean_partitions(transactional_db):
    drop_all_partitions()
    yield
    drop_all_partitions()


def test_partitions_are_made_ahead_without_gaps_and_dropped_whole_after_retention(clean_partitions):
    (now,), = sql("SELECT statement_timestamp()")
    got = archive.keep_partitions(60, retention=120, now=now)
    assert got["locked"] and len(got["attached"]) == 2 * (1 + archive.AHEAD) and not got["dropped"]
    jobs = [n for p, n in partitions() if p == "cron_at_scale_jobhistory"]
    assert jobs[0] == archive.partition_name("cron_at_scale_jobhistory", archive._floor(now, 60))  # noqa: SLF001
    assert archive.keep_partitions(60, retention=120, now=now)["attached"] == []  # nothing twice
    # A row in the first partition, one in the last.
    live = job("completed", 700)
    first, last = archive._floor(now, 60), archive._floor(now, 60) + timedelta(seconds=60 * archive.AHEAD)  # noqa: SLF001
    for at in (first, last):
        sql("INSERT INTO cron_at_scale_jobhistory SELECT %s, j.* FROM cron_at_scale_job j WHERE id = %s", [at, live.id])
    # Just past the first partition's end + 120 s: it goes, the second (a minute younger) stays; new
    # ones follow the last without a gap.
    later = first + timedelta(seconds=60 + 120 + 1)
    got = archive.keep_partitions(60, retention=120, now=later)
    assert got["dropped"] == [archive.partition_name(p, first) for p in archive.PARENTS]
    assert [r[0] for r in sql("SELECT archived_at FROM cron_at_scale_jobhistory")] == [last]
    rows = [r for r in sql_rows("history_partitions") if r.parent == "cron_at_scale_jobhistory"]
    assert len(rows) == (1 + archive.AHEAD) - 1 + len(got["attached"]) // 2
    assert all(a.upper == b.lower for a, b in zip(rows, rows[1:]))  # no gap
    assert rows[-1].upper > later + timedelta(seconds=60 * archive.AHEAD)  # made ahead of the new now
    # A longer partition after a change of setting starts where the last ended: no overlap, no error.
    assert archive.keep_partitions(3600, retention=None, now=later)["attached"]
    # retention None: nothing dropped, however old
    assert archive.keep_partitions(60, retention=None, now=later + timedelta(days=9))["dropped"] == []


def test_only_one_session_keeps_the_partitions_at_a_time(clean_partitions):
    other = session()
    try:
        other.autocommit = True
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(hashtext('cron_at_scale:history partitions'))")
            assert archive.keep_partitions(60, retention=120) == {"attached": [], "dropped": [], "locked": False}
            cur.execute("SELECT pg_advisory_unlock(hashtext('cron_at_scale:history partitions'))")
    finally:
        other.close()
    assert archive.keep_partitions(60, retention=120)["locked"]
    ((held,),) = sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
    assert held == 0  # released after the pass


def test_a_detach_cut_short_by_a_long_reader_is_finished_by_a_later_pass(clean_partitions, monkeypatch):
    """DETACH ... CONCURRENTLY waits for the transactions that use the table; past DDL_TIMEOUT it is
    let go (the partition left "detach pending") and the next pass finishes and drops it."""
    if connection.pg_version < 140000:
        pytest.skip("DETACH ... CONCURRENTLY is PostgreSQL 14's")
    monkeypatch.setattr(archive, "DDL_TIMEOUT", 0.5)
    (now,), = sql("SELECT statement_timestamp()")
    archive.keep_partitions(60, retention=120, now=now)
    reader = session()
    try:
        with reader.cursor() as cur:  # an analytics query's transaction, left open on the history
            cur.execute("SELECT count(*) FROM cron_at_scale_jobhistory")
            with pytest.raises(DatabaseError):
                archive.keep_partitions(60, retention=120, now=now + timedelta(seconds=200))
        reader.rollback()
    finally:
        reader.close()
    (pending,), = sql("""SELECT count(*) FROM pg_inherits WHERE inhdetachpending
                         AND inhparent = 'cron_at_scale_jobhistory'::regclass""")
    assert pending == 1
    got = archive.keep_partitions(60, retention=120, now=now + timedelta(seconds=200))
    assert archive.partition_name("cron_at_scale_jobhistory", archive._floor(now, 60)) in got["dropped"]  # noqa: SLF001
    (pending,), = sql("SELECT count(*) FROM pg_inherits WHERE inhdetachpending")
    assert pending == 0
    ((timeout,),) = sql("SHOW statement_timeout")
    assert timeout == "0"  # the session's limit restored


def test_the_dispatchers_loop_moves_and_keeps_partitions(clean_partitions, settings):
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": 600, "HISTORY_PARTITION": 3600}
    done = [job("completed", 700) for _ in range(3)]
    loop = archive.Archive(budget=0.0)
    assert loop.maybe_run(now=1e9) == 3
    assert JobHistory.objects.count() == 3 and not Job.objects.filter(id__in=[j.id for j in done]).exists()
    assert len(partitions()) == 2 * (1 + archive.AHEAD)
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": None}
    assert not loop.enabled()
    job("completed", 700)
    assert archive.Archive().maybe_run(now=2e9) == 0  # off: nothing moves
    assert Job.objects.count() == 1


def updated_at(j) -> object:
    return sql("SELECT updated_at FROM cron_at_scale_job WHERE id = %s", [j.id])[0][0]


def test_a_move_from_a_floor_walks_only_the_rows_at_or_above_it(clean_partitions):
    archive.keep_partitions(DAY, None)
    old, newer, newest = job("completed", 900), job("completed", 800), job("cancelled", 700)
    floor, top, bottom = updated_at(newer), updated_at(newest), updated_at(old)
    assert archive.move_from(floor, 600) == (2, False, top)
    assert set(Job.objects.values_list("id", flat=True)) == {old.id}  # below the floor: left
    assert archive.move_from(None, 600) == (1, False, bottom)  # no floor: all of it
    assert archive.move_from(None, 600) == (0, False, None)
    with pytest.raises(ValueError, match="floor"):
        archive.move_from(datetime(2026, 1, 1), 600)  # naive


def test_the_loop_walks_from_its_floor_and_from_the_start_every_few_minutes(clean_partitions, settings,
                                                                              monkeypatch):
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": 600, "HISTORY_PARTITION": 3600}
    first = job("completed", 700)
    loop = archive.Archive(budget=0.0)
    assert loop.maybe_run(now=1e9) == 1  # the first pass walks from the start
    assert loop.floor == updated_at_history(first) - timedelta(seconds=archive.FLOOR_MARGIN)
    # A straggler: finished before the floor (say its completion committed late), and a new one.
    straggler, later = job("completed", 700 + archive.FLOOR_MARGIN + 5), job("completed", 650)
    assert loop.maybe_run(now=2e9) == 1
    assert set(Job.objects.values_list("id", flat=True)) == {straggler.id}
    monkeypatch.setattr(loop, "_full_walk_at", 0.0)  # FULL_WALK_INTERVAL has passed
    assert loop.maybe_run(now=3e9) == 1
    assert not Job.objects.exists() and JobHistory.objects.count() == 3
    assert loop.floor == updated_at_history(later) - timedelta(seconds=archive.FLOOR_MARGIN)  # never lowered


def updated_at_history(j) -> object:
    return sql("SELECT updated_at FROM cron_at_scale_jobhistory WHERE id = %s", [j.id])[0][0]


def test_moves_beside_a_claim_of_the_same_table_never_block_or_fail_it(clean_partitions):
    """The move locks finished rows only; the claim, pending ones. Both at once, over and over."""
    from helpers import RecordingPublisher

    from cron_at_scale.dispatcher import Dispatcher

    archive.keep_partitions(DAY, None)
    for _ in range(5):
        cron_at_scale.schedule_many([{"task": "demo.tasks.noop"} for _ in range(1000)])
    sql("UPDATE cron_at_scale_job SET status = 'completed', updated_at = now() - interval '1 hour' "
        "WHERE id IN (SELECT id FROM cron_at_scale_job ORDER BY id LIMIT 2500)")
    errors: list[BaseException] = []

    def mover():
        from django.db import connections
        try:
            while archive.move(600, batch_size=100)[0]:
                pass
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            connections.close_all()

    t = threading.Thread(target=mover)
    t.start()
    d = Dispatcher(name="d0", batch_size=100, publisher=RecordingPublisher())
    d._next_shards, d.shards.owned = float("inf"), set(range(64))  # noqa: SLF001 (holds every shard)
    claimed, deadline = 0, time.monotonic() + 60
    while claimed < 2500 and time.monotonic() < deadline:
        claimed += len(d.claim())
    t.join(60)
    assert not errors
    assert claimed == 2500 and JobHistory.objects.count() == 2500


def test_cron_purge_drops_whole_history_partitions_older_than_its_age(clean_partitions):
    from django.core.management import call_command

    (now,), = sql("SELECT statement_timestamp()")
    archive.keep_partitions(3600, None, now=now - timedelta(days=3))  # three days ago: made, then left
    archive.keep_partitions(3600, None, now=now)
    before = {n for p, n in partitions() if p == "cron_at_scale_jobhistory"}
    out = io.StringIO()
    call_command("cron_purge", "--older-than", "2d", "--dry-run", stdout=out)
    assert "would drop 3 history partitions" in out.getvalue()
    assert {n for p, n in partitions() if p == "cron_at_scale_jobhistory"} == before  # a dry run drops nothing
    call_command("cron_purge", "--older-than", "2d", stdout=(out := io.StringIO()))
    assert "dropped 3 history partitions" in out.getvalue()
    left = {n for p, n in partitions() if p == "cron_at_scale_jobhistory"}
    assert left == {n for n in before if n > archive.partition_name("cron_at_scale_jobhistory", now - timedelta(days=1))}
    assert len(left) == 3


def test_a_failing_pass_is_logged_and_tried_again_a_minute_later_not_every_second(clean_partitions, settings,
                                                                                  caplog):
    settings.CRON_AT_SCALE = {"HISTORY_AFTER": 600}
    job("completed", 700)  # no partition, and the advisory lock held elsewhere: none attached
    other = session()
    try:
        other.autocommit = True
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(hashtext('cron_at_scale:history partitions'))")
        loop = archive.Archive()
        assert loop.maybe_run(now=1e9) == 0
        assert "history move failed" in caplog.text and loop.failed
        assert loop.maybe_run(now=1e9 + 30) == 0 and caplog.text.count("history move failed") == 1
        assert loop.due(1e9 + archive.RETRY_AFTER_FAILURE + 0.1)
    finally:
        other.close()
