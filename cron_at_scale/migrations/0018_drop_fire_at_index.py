from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    """``cron_job_fire_at_id`` goes (docs/indexes.md): it cost every job an index entry at its insert,
    its claim and its completion, for the lists an operator sorts by "next fire". Those lists now
    read each status's range of ``cron_job_status_fire_at`` and merge them
    (``cron_at_scale.ops.fire_order``). Dropped ``CONCURRENTLY`` (writes go on meanwhile), hence not
    atomic; reversing it builds the index again, concurrently too."""

    atomic = False

    dependencies = [
        ('cron_at_scale', '0017_history'),
    ]

    operations = [
        RemoveIndexConcurrently(model_name='job', name='cron_job_fire_at_id'),
    ]
