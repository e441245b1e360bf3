from django.db import migrations, models


class Migration(migrations.Migration):
    """``max_retries`` NULL means the task's own limit (Celery's meaning), resolved by the worker.

    Only the catalog changes (``DROP DEFAULT``, ``DROP NOT NULL``): no rewrite, no scan, the lock is
    held for milliseconds. Jobs stored before keep their value (3 unless given); the column's
    existing ``>= 0`` CHECK stays as it is.
    """

    dependencies = [
        ('cron_at_scale', '0009_worker_health'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='max_retries',
            field=models.PositiveIntegerField(
                blank=True, null=True, help_text="Retries allowed after the first attempt (empty: the task's)."),
        ),
    ]
