"""What the "own database" advice rests on: a transaction held open pins the vacuum horizon of
its own database only (PostgreSQL computes the horizon of a non-shared table from the backends
connected to that table's database). The scheduler's hot rows, here a shard lease renewed over
and over, keep every dead version while the application's database holds a snapshot open, and
lose them at the next VACUUM when the snapshot is held in another database of the cluster."""

from __future__ import annotations

import time

import psycopg2
import pytest
from django.db import connection
from helpers import sql

RENEWALS = 300


def _dead_after_vacuum() -> int:
    sql("VACUUM cron_at_scale_shardlease")
    sql("SELECT pg_stat_clear_snapshot()")
    ((dead,),) = sql("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'cron_at_scale_shardlease'")
    return dead


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pinned_in", ["the scheduler's database", "another database of the cluster"])
def test_a_snapshot_held_open_keeps_dead_versions_only_in_its_own_database(pinned_in):
    s = connection.settings_dict
    same = pinned_in == "the scheduler's database"
    pin = psycopg2.connect(host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"] or None,
                           password=s["PASSWORD"] or None, dbname=s["NAME"] if same else "postgres")
    try:
        pin.set_session(isolation_level="REPEATABLE READ")
        with pin.cursor() as cur:  # an analytics query's snapshot, and an xid (a forgotten BEGIN; UPDATE ...)
            cur.execute("SELECT txid_current()")
            cur.execute("SELECT count(*) FROM pg_class")
            cur.execute("SELECT pg_backend_pid()")
            (pin_pid,) = cur.fetchone()
        sql("INSERT INTO cron_at_scale_shardlease (shard, owner, expires_at) VALUES (999, 'pin-test', now())")
        for _ in range(RENEWALS):
            sql("UPDATE cron_at_scale_shardlease SET expires_at = statement_timestamp() WHERE shard = 999")
        held = _dead_after_vacuum()
    finally:
        pin.close()
    # The server ends a closed connection's backend on its own time: on a loaded box, after a VACUUM
    # run at once would still see its snapshot.
    deadline = time.monotonic() + 30
    while sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pin_pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if same:
        assert held >= RENEWALS, f"only {held} dead versions kept behind a snapshot in the same database"
        assert _dead_after_vacuum() < 5, "the dead versions stayed after the snapshot ended"
    else:
        assert held < 5, f"{held} dead versions kept behind a snapshot held in another database"
