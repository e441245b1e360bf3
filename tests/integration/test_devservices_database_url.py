"""A multi-host DATABASE_URL, parsed by devservices.django_database, connects (libpq's failover form)."""

from urllib.parse import quote

import pytest

from devservices import django_database


@pytest.mark.django_db
def test_multiple_hosts_reach_a_real_server():
    """The test server named twice, as Django passes HOST/PORT lists to the driver."""
    import psycopg2
    from django.db import connection

    one = connection.settings_dict
    entry = quote(one["HOST"] or "localhost", safe="") + (f":{one['PORT']}" if one["PORT"] else "")
    cfg = django_database(f"postgresql://{entry},{entry}/{quote(one['NAME'])}?target_session_attrs=read-write")
    assert cfg["HOST"].count(",") == 1
    conn = psycopg2.connect(host=cfg["HOST"], port=cfg["PORT"] or None, dbname=cfg["NAME"], user=one["USER"] or "postgres",
                            password=one["PASSWORD"] or None, connect_timeout=5, **cfg["OPTIONS"])
    conn.close()
