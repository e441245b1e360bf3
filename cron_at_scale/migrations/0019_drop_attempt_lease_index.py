from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    """``cron_attempt_open_lease`` (locked_until, unfinished attempts) goes (docs/indexes.md). An
    index on ``locked_until`` made every update that moves a lease a non-HOT one: an attempt's
    start and every heartbeat wrote an entry in each of the table's four indexes. Without it they
    are HOT updates (no index entry, when the row's page has room). The reaper and the dashboard
    read the unfinished attempts through ``cron_attempt_open_job``, whose predicate is the same,
    and test each lease: what they read is the attempts in flight, not the table. Dropped
    ``CONCURRENTLY`` (writes go on meanwhile), hence not atomic; reversing it builds the index
    again, concurrently too."""

    atomic = False

    dependencies = [
        ('cron_at_scale', '0018_drop_fire_at_index'),
    ]

    operations = [
        RemoveIndexConcurrently(model_name='jobattempt', name='cron_attempt_open_lease'),
    ]
