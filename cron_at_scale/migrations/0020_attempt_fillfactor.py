from django.db import migrations


class Migration(migrations.Migration):
    """The attempt table's pages keep 30 % free (``fillfactor`` 70, docs/indexes.md). An attempt's
    row is inserted by the claim and updated by its start and its heartbeats, none of which changes
    an indexed column: PostgreSQL makes them HOT updates (no index entry) only if the row's page
    has room for the new version, and at the default of 100 the claim's inserts filled each page,
    so a fifth to a quarter of the starts wrote an entry in each of the table's indexes.
    ``ALTER TABLE ... SET (fillfactor)`` changes the catalogue only (``SHARE UPDATE EXCLUSIVE``:
    reads and writes go on); it applies to pages filled from then on, not to the rows already
    there."""

    dependencies = [
        ('cron_at_scale', '0019_drop_attempt_lease_index'),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE cron_at_scale_jobattempt SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE cron_at_scale_jobattempt RESET (fillfactor)",
        ),
    ]
