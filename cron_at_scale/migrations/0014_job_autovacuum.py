from django.db import migrations


class Migration(migrations.Migration):
    """Autovacuum of the job table once 1% of its rows are dead, not PostgreSQL's default 20%.

    Each claim leaves one dead row version. At the default, a 10M-row table waits for 2M of them
    between vacuums (minutes at 10,000 jobs/s, and they stay after the stream ends); at 1% a
    vacuum comes with each autovacuum round (``autovacuum_naptime``, 60 s) and clears the few
    hundred thousand since the last one (docs/benchmarks.md, the soak). A per-table storage
    parameter: ``ALTER TABLE ... SET`` takes a SHARE UPDATE EXCLUSIVE lock, which reads and
    writes do not wait for (a running autovacuum of the table gives way to it), and rewrites
    nothing.
    """

    dependencies = [
        ('cron_at_scale', '0013_index_diet'),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE cron_at_scale_job SET (autovacuum_vacuum_scale_factor = 0.01)",
            reverse_sql="ALTER TABLE cron_at_scale_job RESET (autovacuum_vacuum_scale_factor)",
        ),
    ]
