"""Jobs in fire time order without an index on ``fire_at`` alone: a merge of index ranges.

The job table keeps no ``(fire_at, id)`` index over every row: each one cost a job three index
entries (insert, claim, completion) for the lists an operator sorts by "next fire" now and then
(docs/indexes.md). Nor does it index pending rows by ``(status, fire_at)``: they are in the claim's
``(shard, fire_at)`` index already, and a second entry at every insert is what
``cron_job_status_fire_at`` used to cost before migration 0021 left pending rows out of it. So:

* pending rows in fire time order are a merge of each shard's range of ``cron_job_pending_shard``
  (:func:`pending_in_fire_order`, :func:`pending_keys`): 64 short ordered walks, merged by
  PostgreSQL (a ``Merge Append`` of a ``UNION ALL``), reading about ``stop`` entries in all;
* the other statuses' rows are ranges of ``cron_job_status_fire_at`` (``status <> 'pending'``);
* a list over every status (:func:`in_fire_order`) merges one range per status, the pending one
  itself a merge of the shards': the keys of ``stop`` rows from each at most, then the rows of the
  window asked for, by id.

Lists read this way are bounded in depth (the admin's ``MAX_PAGES``, ``cron_jobs --limit``).
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Any

from django.db.models import Q, QuerySet

from cron_at_scale.conf import ALL_SHARDS
from cron_at_scale.models import Status

# Pending rows, as the claim's (shard, fire_at) index holds them: with shard IN (every shard) a count
# or an unordered read of a fire_at range is one index range per shard, not a walk of the whole index.
PENDING = Q(status=Status.PENDING, shard__in=ALL_SHARDS)


def _id(row: Any) -> Any:
    return row["id"] if isinstance(row, dict) else row.id


def _check(start: int, stop: int) -> None:
    if start < 0 or stop < 0:
        raise ValueError(f"start and stop must be >= 0, got {start} and {stop}")


def pending_keys(queryset: QuerySet, *, stop: int, start: int = 0, descending: bool = False) -> list[tuple]:
    """``(fire_at, id)`` of the pending rows ``start``..``stop`` of ``queryset`` in ``(fire_at, id)``
    order (both descending with ``descending``), in one statement: each shard's first ``stop`` rows
    from ``cron_job_pending_shard`` (its own filters kept), merged by PostgreSQL. ``queryset``: ``Job``
    rows, any filters; its ordering is ignored. Raises ``ValueError`` for a negative bound."""
    _check(start, stop)
    if stop <= start:
        return []
    order = ("-fire_at", "-id") if descending else ("fire_at", "id")
    base = queryset.order_by().filter(status=Status.PENDING)
    parts = [base.filter(shard=shard).order_by(*order).values_list("fire_at", "id")[:stop] for shard in ALL_SHARDS]
    return list(parts[0].union(*parts[1:], all=True).order_by(*order)[start:stop])


def pending_in_fire_order(queryset: QuerySet, *, stop: int, start: int = 0, descending: bool = False) -> list:
    """The pending rows ``start``..``stop`` of ``queryset`` in ``(fire_at, id)`` order, as models or as
    ``values()`` dicts as ``queryset`` gives them: :func:`pending_keys`, then the window's rows by id
    (a row claimed or gone meanwhile is left out). Raises ``ValueError`` for a negative bound."""
    return _rows(queryset, [job_id for _, job_id in pending_keys(queryset, start=start, stop=stop,
                                                                   descending=descending)])


def _rows(queryset: QuerySet, ids: list) -> list:
    if not ids:
        return []
    rows = {_id(row): row for row in queryset.order_by().filter(id__in=ids)}
    return [rows[job_id] for job_id in ids if job_id in rows]  # one that left meanwhile (moved, purged) is gone


def in_fire_order(queryset: QuerySet, *, stop: int, start: int = 0, descending: bool = False) -> list:
    """Rows ``start``..``stop`` of ``queryset`` ordered by ``(fire_at, id)`` (both descending with
    ``descending``), read as one ordered range per status (keys only: the pending one a merge of the
    shards' ranges, :func:`pending_keys`; the others a range of ``cron_job_status_fire_at``), merged,
    then the window's rows in one query by id (a row gone meanwhile is left out, one read in two
    ranges as its status changed is listed once).

    ``queryset``: ``Job`` rows, as models or as ``values()`` dicts holding ``fire_at`` and ``id``;
    its own ordering is ignored. Each status's query adds ``status = <s>`` to its filters, so a
    filter on ``status`` already there leaves one range to read. Raises ``ValueError`` for a
    negative ``start`` or ``stop``.
    """
    _check(start, stop)
    if stop <= start:
        return []
    order = ("-fire_at", "-id") if descending else ("fire_at", "id")
    base = queryset.order_by()
    # the ranges' keys only (a deep page reads up to ``stop`` of each), then the window's rows by id
    ranges = [pending_keys(base, stop=stop, descending=descending) if status == Status.PENDING
              else list(base.filter(status=status).order_by(*order).values_list("fire_at", "id")[:stop])
              for status in Status.values]
    # each range is its own snapshot: a job whose status changed between two of them is listed once
    merged = dict.fromkeys(job_id for _, job_id in heapq.merge(*ranges, reverse=descending))
    return _rows(base, list(islice(merged, start, stop)))
