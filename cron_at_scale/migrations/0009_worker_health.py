# A new small table (one row per Celery worker process): nothing existing is rewritten.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cron_at_scale', '0008_attempt_run_token_dispatch_losses'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerHealth',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('pid', models.IntegerField()),
                ('queues', models.JSONField(default=list)),
                ('concurrency', models.IntegerField(default=0)),
                ('running', models.IntegerField(default=0)),
                ('received', models.BigIntegerField(default=0)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_seen', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_received', models.DateTimeField(null=True)),
                ('waiting', models.IntegerField(null=True)),
                ('state', models.CharField(default='ok', max_length=20)),
                ('stuck_since', models.DateTimeField(null=True)),
                ('stuck_count', models.IntegerField(default=0)),
                ('note', models.TextField(blank=True, default='')),
            ],
        ),
    ]
