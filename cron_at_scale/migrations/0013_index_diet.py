from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """Indexes for what the statements run now (docs/indexes.md), each built or dropped
    ``CONCURRENTLY`` (writes go on meanwhile; no lock waits for the table's size), hence not atomic.

    - ``cron_job_pending_fire_at`` goes: the claim reads each shard's head from
      ``cron_job_pending_shard``; the dashboard's pending buckets use ``cron_job_status_fire_at``.
    - the queue index holds named queues only (``cron_job_named_queue_fire_at``): a job of the
      default queue no longer costs an index entry at insert, claim and completion.
    """

    atomic = False

    dependencies = [
        ('cron_at_scale', '0012_job_expired_runs'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='job',
            index=models.Index(condition=models.Q(('queue', ''), _negated=True), fields=['queue', 'fire_at', 'id'],
                               name='cron_job_named_queue_fire_at'),
        ),
        RemoveIndexConcurrently(model_name='job', name='cron_job_queue_fire_at'),
        RemoveIndexConcurrently(model_name='job', name='cron_job_pending_fire_at'),
    ]
