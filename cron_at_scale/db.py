"""Run the named queries on Django's connection, surviving a database restart."""

from __future__ import annotations

import logging
import time

from django.db import InterfaceError, OperationalError, close_old_connections, connection

from .sql import QUERIES

log = logging.getLogger(__name__)


def run(name: str, params: dict | None = None, *, fetch: str = "all", retries: int = 1):
    """Execute query ``name`` in autocommit; return rows (``fetch='all'``), one row, or None.

    On a broken connection (PostgreSQL restarted) the connection is dropped
    and the statement tried again ``retries`` times. Only for statements that
    are safe to repeat (each of ours is conditional on the row's state).
    """
    for attempt in range(retries + 1):
        try:
            with connection.cursor() as cur:
                cur.execute(QUERIES[name], params or {})
                if fetch == "all":
                    return cur.fetchall()
                if fetch == "one":
                    return cur.fetchone()
                return cur.rowcount
        except (OperationalError, InterfaceError):
            if attempt == retries:
                raise
            log.warning("database connection lost running %s; reconnecting", name)
            reset_connection()
            time.sleep(0.2 * (attempt + 1))
    return None


def reset_connection() -> None:
    """Drop Django's connection of this thread so the next query reconnects."""
    try:
        connection.close()
    except Exception:  # a dead socket may fail to close; the next use reconnects anyway
        connection.connection = None
    close_old_connections()
