from django.db import migrations, models

# Partitioned by archived_at; a partition per HISTORY_PARTITION seconds is attached ahead of time by
# the dispatchers (cron_at_scale.maintenance.archive), never here: a migration runs once.
# Every column of the live table, after archived_at and in its order: the move inserts
# "statement_timestamp(), moved.*". A migration that adds a column to the live table adds it here
# too (tests/integration/test_maintenance_archive.py compares the two).
CREATE = """
CREATE TABLE cron_at_scale_jobhistory (archived_at timestamptz NOT NULL, LIKE cron_at_scale_job)
    PARTITION BY RANGE (archived_at);
ALTER TABLE cron_at_scale_jobhistory ADD CONSTRAINT cron_jobhistory_pkey PRIMARY KEY (id, archived_at);
CREATE INDEX cron_jobhistory_archived ON cron_at_scale_jobhistory (archived_at);
CREATE TABLE cron_at_scale_attempthistory (archived_at timestamptz NOT NULL, LIKE cron_at_scale_jobattempt)
    PARTITION BY RANGE (archived_at);
ALTER TABLE cron_at_scale_attempthistory ADD CONSTRAINT cron_attempthistory_pkey PRIMARY KEY (id, archived_at);
CREATE INDEX cron_attempthistory_job ON cron_at_scale_attempthistory (job_id);
"""
DROP = "DROP TABLE cron_at_scale_attempthistory; DROP TABLE cron_at_scale_jobhistory;"


class Migration(migrations.Migration):
    """History tables for finished jobs and their attempts, empty and partitioned by time.

    Instant on a live installation: two new tables, no lock on the live ones (``LIKE`` reads
    only their catalog entries). The finished rows already in the live table move out later,
    in batches of 1,000 on the dispatchers' maintenance thread, while firing goes on.
    """

    dependencies = [
        ('cron_at_scale', '0016_job_trace_context'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE, DROP)],
            state_operations=[
            migrations.CreateModel(
                name='AttemptHistory',
                fields=[
                    ('archived_at', models.DateTimeField()),
                    ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                    ('job_id', models.UUIDField()),
                    ('attempt', models.PositiveIntegerField()),
                    ('scheduled_at', models.DateTimeField()),
                    ('dispatched_at', models.DateTimeField()),
                    ('started_at', models.DateTimeField(blank=True, null=True)),
                    ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ('worker', models.CharField(blank=True, max_length=200)),
                    ('outcome', models.CharField(choices=[('dispatched', 'Dispatched'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('retried', 'Retried'), ('cancelled', 'Cancelled'), ('skipped', 'Skipped'), ('lost', 'Lost')], max_length=12)),
                    ('error', models.TextField(blank=True)),
                    ('traceback', models.TextField(blank=True)),
                    ('result', models.JSONField(blank=True, null=True)),
                ],
                options={
                    'verbose_name': 'finished attempt (history)',
                    'verbose_name_plural': 'finished attempts (history)',
                    'db_table': 'cron_at_scale_attempthistory',
                },
            ),
            migrations.CreateModel(
                name='JobHistory',
                fields=[
                    ('archived_at', models.DateTimeField(help_text='When the job left the live table (UTC).')),
                    ('id', models.UUIDField(primary_key=True, serialize=False)),
                    ('schedule_type', models.CharField(choices=[('once', 'Once'), ('cron', 'Cron'), ('interval', 'Interval')], max_length=8)),
                    ('fire_at', models.DateTimeField()),
                    ('cron_expr', models.CharField(blank=True, max_length=200)),
                    ('timezone', models.CharField(max_length=64)),
                    ('task', models.CharField(max_length=200)),
                    ('payload', models.JSONField(default=dict)),
                    ('queue', models.CharField(blank=True, max_length=200)),
                    ('options', models.JSONField(blank=True, default=dict)),
                    ('status', models.CharField(choices=[('pending', 'Pending'), ('in_progress', 'In Progress'), ('completed', 'Completed'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('paused', 'Paused')], max_length=12)),
                    ('retries', models.PositiveIntegerField()),
                    ('max_retries', models.PositiveIntegerField(null=True)),
                    ('attempts', models.PositiveIntegerField()),
                    ('lost_attempts', models.PositiveIntegerField()),
                    ('key', models.CharField(blank=True, max_length=255, null=True)),
                    ('created_at', models.DateTimeField()),
                    ('updated_at', models.DateTimeField()),
                ],
                options={
                    'verbose_name': 'finished job (history)',
                    'verbose_name_plural': 'finished jobs (history)',
                    'db_table': 'cron_at_scale_jobhistory',
                },
            ),
            ],
        ),
    ]
