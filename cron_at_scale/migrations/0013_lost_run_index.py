from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The reaper's count of an occurrence's runs lost while running (``refire_cron``) reads a partial
    index of those rows instead of every attempt of the job. Built ``CONCURRENTLY`` (writes go on
    while it builds; the lock it takes does not block them), hence not atomic."""

    atomic = False

    dependencies = [
        ('cron_at_scale', '0010_job_max_retries_the_tasks'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='jobattempt',
            index=models.Index(condition=models.Q(('outcome', 'lost'), ('started_at__isnull', False)),
                               fields=['job', 'scheduled_at'], name='cron_attempt_lost_run'),
        ),
    ]
