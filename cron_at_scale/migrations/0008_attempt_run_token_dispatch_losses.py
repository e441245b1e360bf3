from django.db import migrations, models


class Migration(migrations.Migration):
    """Two columns added without a rewrite or a scan (PostgreSQL 11+: a nullable column, and one with a
    constant default and no CHECK, change only the catalog): the lock is held for milliseconds."""

    dependencies = [
        ('cron_at_scale', '0007_job_ids_uuid7'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='dispatch_losses',
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='jobattempt',
            name='run_token',
            field=models.UUIDField(blank=True, null=True),
        ),
    ]
