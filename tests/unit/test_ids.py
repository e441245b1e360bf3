"""Job ids are UUIDv7 (RFC 9562): time-ordered, with a uniform shard from their random bits.

What the database makes of them (shard column, primary-key order) is in tests/integration/test_ids.py.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from cron_at_scale.ids import job_ids, new_job_id
from cron_at_scale.models import NUM_SHARDS


def _ms(u: uuid.UUID) -> int:
    return u.int >> 80


@pytest.mark.parametrize("make", [lambda: new_job_id(), lambda: next(job_ids(batch=3))], ids=["one", "batch"])
def test_version_variant_and_time(make):
    before = time.time_ns() // 1_000_000
    u = make()
    after = time.time_ns() // 1_000_000
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert before <= _ms(u) <= after
    assert uuid.UUID(str(u)) == u and hash(uuid.UUID(str(u))) == hash(u)


def test_batches_are_distinct_ordered_by_time_and_random_in_their_tail():
    gen = job_ids(batch=1000)
    first = [next(gen) for _ in range(5000)]
    time.sleep(0.003)
    later = [next(gen) for _ in range(1000)]
    assert len(set(first + later)) == 6000
    assert max(first[-1000:]) < min(later)  # a later batch sorts after an earlier one
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in first + later)
    tails = Counter((int(u.hex[-8:], 16) & 0x7FFFFFFF) % NUM_SHARDS for u in first + later)
    assert len(tails) == NUM_SHARDS and max(tails.values()) < 3 * 6000 / NUM_SHARDS
