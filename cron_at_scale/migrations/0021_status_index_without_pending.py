from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """``cron_job_status_fire_at`` leaves pending rows out (docs/indexes.md): every job paid it an entry at
    its insert for the lists of pending jobs, which the claim's ``(shard, fire_at)`` index already
    holds (``cron_at_scale.ops.fire_order`` merges its shards' ranges). The new index is built
    ``CONCURRENTLY`` under a name of its own, the old one dropped ``CONCURRENTLY`` (writes go on
    meanwhile, hence not atomic), then the new one takes the old name (a catalog change)."""

    atomic = False

    dependencies = [
        ('cron_at_scale', '0020_attempt_fillfactor'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'pending'), _negated=True),
                               fields=['status', 'fire_at', 'id'], name='cron_job_status_not_pending'),
        ),
        RemoveIndexConcurrently(model_name='job', name='cron_job_status_fire_at'),
        migrations.RenameIndex(model_name='job', new_name='cron_job_status_fire_at',
                               old_name='cron_job_status_not_pending'),
    ]
