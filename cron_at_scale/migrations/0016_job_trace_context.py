from django.db import migrations, models


class Migration(migrations.Migration):
    """The trace context of the ``schedule()`` call that made a job (cron_at_scale.ops.tracing).

    Catalog-only: one nullable column without a default (no rewrite, no scan, no index).
    """

    dependencies = [
        ('cron_at_scale', '0015_attempt_dispatch_losses'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='trace_context',
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
