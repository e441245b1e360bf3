"""Job ids are UUIDv7 (RFC 9562): time-ordered in the primary key, with a uniform shard from their random bits."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import pytest
from django.db import connection

import cron_at_scale
from cron_at_scale.ids import job_ids, new_job_id
from cron_at_scale.models import NUM_SHARDS, Job


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


@pytest.mark.django_db
def test_stored_jobs_get_v7_ids_and_the_database_shard_of_their_tail():
    one = cron_at_scale.schedule("demo.tasks.noop", countdown=60)
    many = cron_at_scale.schedule_many([{"task": "demo.tasks.noop", "countdown": 60} for _ in range(2000)])
    created = Job.objects.create(task="demo.tasks.noop", fire_at=datetime(2030, 1, 1, tzinfo=timezone.utc))
    jobs = [one, *many, created]
    assert all(j.id.version == 7 for j in jobs)
    assert _ms(one.id) <= _ms(many[0].id) <= _ms(created.id)
    shards = dict(Job.objects.values_list("id", "shard"))
    for j in jobs:
        assert shards[j.id] == (int(j.id.hex[-8:], 16) & 0x7FFFFFFF) % NUM_SHARDS
    assert len({shards[j.id] for j in jobs}) == NUM_SHARDS  # 2,002 jobs reach every shard
    with connection.cursor() as cur:  # ids of jobs made together sit together in the primary key
        cur.execute("SELECT count(*) FROM cron_at_scale_job WHERE id > %s AND id < %s",
                    [min(j.id for j in many), max(j.id for j in many)])
        assert 1998 <= cur.fetchone()[0] <= 2000  # the 2,000 and at most the two jobs made beside them
