"""Jobs in fire time order without an index on ``fire_at`` alone: a merge of each status's range.

The job table keeps no ``(fire_at, id)`` index over every row: each one cost a job three index
entries (insert, claim, completion) for the lists an operator sorts by "next fire" now and then
(docs/indexes.md). Its ``(status, fire_at, id)`` index holds the same order within each status, so
the first ``stop`` rows of a list in fire time order are the first ``stop`` of each status, merged:
one ordered index range per status (six), the keys of ``stop`` rows from each at most, then the
rows of the window asked for, by id. Lists read this way are bounded in depth (the admin's
``MAX_PAGES``, ``cron_jobs --limit``).
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Any

from django.db.models import QuerySet

from cron_at_scale.models import Status


def _id(row: Any) -> Any:
    return row["id"] if isinstance(row, dict) else row.id


def in_fire_order(queryset: QuerySet, *, stop: int, start: int = 0, descending: bool = False) -> list:
    """Rows ``start``..``stop`` of ``queryset`` ordered by ``(fire_at, id)`` (both descending with
    ``descending``), read as one ordered range of ``cron_job_status_fire_at`` per status (keys
    only), merged, then the window's rows in one query by id (a row gone meanwhile is left out,
    one read in two ranges as its status changed is listed once).

    ``queryset``: ``Job`` rows, as models or as ``values()`` dicts holding ``fire_at`` and ``id``;
    its own ordering is ignored. Each status's query adds ``status = <s>`` to its filters, so a
    filter on ``status`` already there leaves one range to read. Raises ``ValueError`` for a
    negative ``start`` or ``stop``.
    """
    if start < 0 or stop < 0:
        raise ValueError(f"start and stop must be >= 0, got {start} and {stop}")
    if stop <= start:
        return []
    order = ("-fire_at", "-id") if descending else ("fire_at", "id")
    base = queryset.order_by()
    # the ranges' keys only (a deep page reads up to ``stop`` of each), then the window's rows by id
    ranges = [list(base.filter(status=status).order_by(*order).values_list("fire_at", "id")[:stop])
              for status in Status.values]
    # each range is its own snapshot: a job whose status changed between two of them is listed once
    merged = dict.fromkeys(job_id for _, job_id in heapq.merge(*ranges, reverse=descending))
    ids = list(islice(merged, start, stop))
    if not ids:
        return []
    rows = {_id(row): row for row in base.filter(id__in=ids)}
    return [rows[job_id] for job_id in ids if job_id in rows]  # one that left meanwhile (moved, purged) is gone
