"""Stored jobs keep their UUIDv7 ids: the database computes the shard from their tail and ids made together sit
together in the primary key (the id generator alone is tested in tests/unit/test_ids.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.db import connection

import cron_at_scale
from cron_at_scale.models import NUM_SHARDS, Job


def _ms(u) -> int:
    return u.int >> 80


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
