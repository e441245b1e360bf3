"""Test settings with the 64 shards on two databases: ``CRON_AT_SCALE["SHARD_DATABASES"]``.

The suite's settings (tests/settings.py) with two aliases: ``default`` (the application's tables,
the app's unsharded tables, and shards 0-31) and ``second`` (shards 32-63), routed by
``cron_at_scale.routers.CronAtScaleRouter``. A run creates ``test_<name>_sharded`` and
``test_<name>_sharded_second``, not the main suite's ``test_<name>``. ``second`` is on the same
PostgreSQL server unless ``SECOND_DATABASE_URL`` names another (a private cluster).

The processes a test starts (dispatchers, a celery worker) use these settings too, with the
test databases' URLs: ``DATABASE_URL`` for ``default``, ``SECOND_DATABASE_URL`` for ``second``.
"""

import json
import os

import devservices
from tests.settings import *  # noqa: F403

_default = DATABASES["default"]  # noqa: F405
_second_url = os.environ.get("SECOND_DATABASE_URL")
DATABASES = {
    "default": {**_default, "TEST": {"NAME": f"test_{_default['NAME']}_sharded"}},
    "second": {**(devservices.django_database(_second_url, conn_max_age=600) if _second_url else _default),
               "TEST": {"NAME": f"test_{_default['NAME']}_sharded_second"}},
}
DATABASE_ROUTERS = ["cron_at_scale.routers.CronAtScaleRouter"]

# The defaults the processes would run with (a queue held until a live worker lists it), and the
# shards split in two.
# shards split in two; CRON_AT_SCALE_SETTINGS (JSON) still overrides keys (bench/sharded.py).
CRON_AT_SCALE = {**CRON_AT_SCALE, "HOLD_UNCONSUMED_QUEUES": True,  # noqa: F405
                 "SHARD_DATABASES": {"default": ["0-31"], "second": ["32-63"]},
                 **json.loads(os.environ.get("CRON_AT_SCALE_SETTINGS") or "{}")}
