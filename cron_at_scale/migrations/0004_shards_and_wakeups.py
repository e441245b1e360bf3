from django.db import migrations, models

NUM_SHARDS = 64  # fixed: shard ownership is leased per shard, so N dispatchers split 64 ways

NOTIFY_SQL = """
CREATE FUNCTION cron_at_scale_notify_due_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM cron_new_rows
               WHERE status = 'pending' AND fire_at <= statement_timestamp() + interval '2 seconds') THEN
        PERFORM pg_notify('cron_at_scale_due', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cron_at_scale_notify_due_v1
    AFTER INSERT ON cron_at_scale_job
    REFERENCING NEW TABLE AS cron_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION cron_at_scale_notify_due_v1();
"""

DROP_NOTIFY_SQL = """
DROP TRIGGER IF EXISTS cron_at_scale_notify_due_v1 ON cron_at_scale_job;
DROP FUNCTION IF EXISTS cron_at_scale_notify_due_v1();
"""


def create_shard_leases(apps, schema_editor):
    ShardLease = apps.get_model("cron_at_scale", "ShardLease")
    ShardLease.objects.using(schema_editor.connection.alias).bulk_create([ShardLease(shard=i) for i in range(NUM_SHARDS)], ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [("cron_at_scale", "0003_admin_indexes_permissions")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="shard",
            field=models.GeneratedField(
                expression=models.Func(
                    models.F("id"),
                    template="((('x' || substr(replace(%(expressions)s::text, '-', ''), 1, 8))::bit(32)::int "
                             f"& 2147483647) %% {NUM_SHARDS})",
                ),
                output_field=models.SmallIntegerField(),
                db_persist=True,
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["shard", "fire_at"], name="cron_job_pending_shard",
                               condition=models.Q(status="pending")),
        ),
        migrations.CreateModel(
            name="ShardLease",
            fields=[
                ("shard", models.SmallIntegerField(primary_key=True, serialize=False)),
                ("owner", models.CharField(blank=True, db_default="", max_length=200)),
                ("expires_at", models.DateTimeField(db_default=models.functions.Now())),
            ],
        ),
        migrations.CreateModel(
            name="DispatcherHeartbeat",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("last_seen", models.DateTimeField(db_default=models.functions.Now())),
                ("shards", models.JSONField(default=list)),
            ],
        ),
        migrations.RunPython(create_shard_leases, migrations.RunPython.noop),
        migrations.RunSQL(NOTIFY_SQL, DROP_NOTIFY_SQL),
    ]
