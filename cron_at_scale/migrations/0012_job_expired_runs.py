from django.db import migrations, models


class Migration(migrations.Migration):
    """``expired_runs``: runs skipped for not starting within the job's ``expires`` seconds.

    A new column with a constant database default and no CHECK: PostgreSQL 11+ records the default
    in the catalog, no rewrite, no scan; the lock is held for milliseconds.
    """

    dependencies = [
        ('cron_at_scale', '0011_job_overdue_history'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='expired_runs',
            field=models.IntegerField(db_default=0),
        ),
    ]
