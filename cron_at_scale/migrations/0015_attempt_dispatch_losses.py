from django.db import migrations, models


class Migration(migrations.Migration):
    """A recurring run's dispatch losses, carried on its attempts (cron_at_scale.reaper).

    Catalog-only: one column with a constant ``db_default`` (PostgreSQL 11+ stores it in the
    catalog): no rewrite, no scan, no index.
    """

    dependencies = [
        ('cron_at_scale', '0014_job_autovacuum'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobattempt',
            name='dispatch_losses',
            field=models.IntegerField(db_default=0),
        ),
    ]
