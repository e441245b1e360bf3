"""Small helpers for the tests (imported as ``helpers``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def sql(query: str, params=()):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else cur.rowcount
