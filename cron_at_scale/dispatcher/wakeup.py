"""Wake-ups: the dispatcher sleeps on PostgreSQL ``LISTEN`` instead of a bare timer.

A statement-level trigger (migration 0004) sends one ``NOTIFY
cron_at_scale_due`` per INSERT statement that adds a job due within two
seconds (never one per row of a bulk insert; PostgreSQL also folds identical
notifications of one transaction into one). A job scheduled "now" therefore
fires without waiting for the poll interval. Notifications are only a hint:
the poll still runs, so a lost one (a reconnect) costs one poll interval.
"""

from __future__ import annotations

import logging
import select

import psycopg2

from cron_at_scale import sql as db

log = logging.getLogger(__name__)

CHANNEL = "cron_at_scale_due"


class Wakeup:
    """A dedicated autocommit connection LISTENing on ``CHANNEL``, to the app's database
    (``CRON_AT_SCALE["DATABASE"]``: where the trigger notifies)."""

    def __init__(self):
        self.conn = None

    def _connect(self):
        params = db.get_connection().get_connection_params()
        conn = psycopg2.connect(**params)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"LISTEN {CHANNEL}")
        return conn

    def wait(self, timeout: float, stop_event=None) -> bool:
        """Sleep up to ``timeout`` seconds or until a notification; True if woken by one."""
        if timeout <= 0:
            return False
        try:
            if self.conn is None:
                self.conn = self._connect()
            ready, _, _ = select.select([self.conn], [], [], timeout)
            if not ready:
                return False
            self.conn.poll()
            woke = bool(self.conn.notifies)
            self.conn.notifies.clear()
            return woke
        except (psycopg2.Error, OSError, ValueError):
            log.info("LISTEN connection lost; falling back to polling until it reconnects")
            self.close()
            if stop_event is not None:
                stop_event.wait(timeout)
            return False

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg2.Error:
                pass
            self.conn = None
