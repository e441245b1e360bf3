from django.db import migrations, models


class Migration(migrations.Migration):
    """Overdue recurring jobs and bounded run history (cron_at_scale.overdue, cron_at_scale.history).

    Catalog-only: nullable columns, and one with a constant ``db_default`` (PostgreSQL 11+ stores
    it in the catalog): no rewrite, no scan, no index. The overdue and trim scans walk the partial
    index ``cron_job_recurring_fire_at`` (recurring jobs only) and ``cron_attempt_job_attempt``.
    """

    dependencies = [
        ('cron_at_scale', '0010_job_max_retries_the_tasks'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='due_since',
            field=models.DateTimeField(blank=True, help_text='The earliest occurrence fired since the last success (empty: none).', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='grace',
            field=models.FloatField(blank=True, help_text='Seconds an occurrence may go without a success before the job is overdue (empty: the OVERDUE_GRACE setting).', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='last_success_at',
            field=models.DateTimeField(blank=True, help_text='When a run last succeeded (UTC).', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='last_success_occurrence',
            field=models.DateTimeField(blank=True, help_text='The latest scheduled time a successful run was fired for.', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='overdue_since',
            field=models.DateTimeField(blank=True, help_text='When the dispatchers opened its current overdue episode (empty: none).', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='resumed_at',
            field=models.DateTimeField(blank=True, help_text='Last resume: earlier occurrences never make it overdue.', null=True),
        ),
        migrations.AddField(
            model_name='jobattempt',
            name='occurrence_losses',
            field=models.IntegerField(db_default=0),
        ),
    ]
