# Job ids become UUIDv7 (time-ordered, cron_at_scale/ids.py), so the shard is
# taken from the random last 32 bits of the id instead of its first 32 (now
# the timestamp). PostgreSQL cannot change a generated column's expression in
# place: the column is dropped and added again, which rewrites the job table
# (a few seconds per million jobs, writes blocked meanwhile). Existing ids keep
# a uniform shard: a UUIDv4's last 32 bits are random too.

import cron_at_scale.ids
from django.db import migrations, models
from django.db.models import Q

NUM_SHARDS = 64


class Migration(migrations.Migration):

    dependencies = [
        ('cron_at_scale', '0006_attempt_job_no_db_constraint'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='id',
            field=models.UUIDField(default=cron_at_scale.ids.new_job_id, editable=False, primary_key=True, serialize=False),
        ),
        migrations.RemoveIndex(model_name='job', name='cron_job_pending_shard'),
        migrations.RemoveField(model_name='job', name='shard'),
        migrations.AddField(
            model_name='job',
            name='shard',
            field=models.GeneratedField(
                db_persist=True,
                expression=models.Func(
                    models.F('id'),
                    template="((('x' || right(%(expressions)s::text, 8))::bit(32)::int & 2147483647) "
                             f"%% {NUM_SHARDS})",
                ),
                output_field=models.SmallIntegerField(),
            ),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=Q(status='pending'), fields=['shard', 'fire_at'], name='cron_job_pending_shard'),
        ),
    ]
