"""System checks (``manage.py check``): what would break cron_at_scale's promises.

Errors: ``E001`` a bad ``CRON_AT_SCALE`` setting (a ``DATABASE`` that is not an
alias of ``settings.DATABASES`` included); ``E002`` the jobs' database (the
``DATABASE`` alias) is not PostgreSQL (the claim needs ``FOR UPDATE SKIP LOCKED``,
``jsonb``, ``LISTEN/NOTIFY``); ``E003`` the Celery app's task class is not
``JobTask`` (scheduled runs would not be logged, deduplicated or completed);
``E004`` pickle is accepted by Celery (a message from the broker could run
code); ``E005`` a task's retry option a scheduled run cannot honour (named);
``E006`` ``CRON_AT_SCALE["DATABASE"]`` is not ``"default"`` and the app's models are
not routed there, or ``SHARD_DATABASES`` is set and they are not routed to each of its aliases
(``cron_at_scale.routers.CronAtScaleRouter`` missing from ``DATABASE_ROUTERS``, or a router
before it sending them elsewhere).
Warnings: ``W001`` a broker visibility timeout shorter than the run
lease; ``W002`` Django reconnecting to PostgreSQL on every task; ``W003`` a
run lease not longer than two heartbeats; ``W004`` PostgreSQL without the
durability an attempt's start relies on (``manage.py check --database default``,
on the ``DATABASE`` alias);
``W005`` a task's retry options that contradict each other (``retry_backoff``
above ``retry_backoff_max``: every delay is the cap); ``W006`` a
``beat_schedule`` entry the beat drop-in (``cron_at_scale.beat:Scheduler``)
cannot map, named (a custom schedule class, solar, Celery's day rule): under
the drop-in it does not run.
"""

from __future__ import annotations

from django.core.checks import Error, Warning, register

from cron_at_scale import conf
from cron_at_scale.celery_app import pickle_problems, refuse_pickle  # noqa: F401 (refuse_pickle: its old home)

HINT_SETTINGS = "See docs/settings.md (every key, its default, unit and reason; cron_at_scale.conf.DEFAULTS in code)."


@register()
def check_settings(app_configs=None, **kwargs):
    """cron_at_scale.E001: a bad ``CRON_AT_SCALE`` setting (unknown key, wrong type, not > 0)."""
    return [Error(message, hint=HINT_SETTINGS, id="cron_at_scale.E001") for message in conf.problems()]


@register()
def check_router(app_configs=None, **kwargs):
    """cron_at_scale.E006: the app's models are not routed to ``CRON_AT_SCALE["DATABASE"]`` (another
    alias than "default"): migrate would put the tables on "default" while every statement of the
    package goes to the alias. Checked by what Django's routers answer, not by the router's name: a
    router of the user's own that does the same passes."""
    from django.conf import settings
    from django.db import router

    from cron_at_scale.models import Job

    if conf.problems():
        return []  # E001 names a bad DATABASE
    alias = conf.db_alias()
    sharded = conf.shard_map() is not None
    homes = [alias, *(a for a in conf.shard_aliases() if a != alias)] if sharded else [alias]
    if homes == ["default"]:
        return []
    label = Job._meta.app_label

    def routed_to(home: str) -> bool:
        with conf.using(home):
            return router.db_for_read(Job) == home and router.db_for_write(Job) == home

    routed = (all(routed_to(home) and router.allow_migrate(home, label, model_name="job") for home in homes)
              and not any(router.allow_migrate(other, label, model_name="job")
                          for other in settings.DATABASES if other not in homes))
    if routed:
        return []
    if sharded:
        return [Error(
            f"CRON_AT_SCALE['SHARD_DATABASES'] puts jobs on {', '.join(map(repr, homes))} but the app's models are "
            "not routed there: migrate would not make its tables on each, or the ORM would read a job elsewhere.",
            hint="Add 'cron_at_scale.routers.CronAtScaleRouter' to DATABASE_ROUTERS (before any router that "
                 "routes every app); see docs/sharding.md.",
            id="cron_at_scale.E006")]
    return [Error(
        f"CRON_AT_SCALE['DATABASE'] is {alias!r} but the app's models are not routed to it: migrate would put "
        "its tables elsewhere, while every statement of cron_at_scale runs on that alias.",
        hint="Add 'cron_at_scale.routers.CronAtScaleRouter' to DATABASE_ROUTERS (before any router that "
             "routes every app); see docs/own-database.md.",
        id="cron_at_scale.E006")]


@register("database")
def check_database(app_configs=None, databases=None, **kwargs):
    from django.conf import settings
    from django.db import connections

    alias = conf.db_alias()
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return []  # E001 names it
    try:
        homes = list(dict.fromkeys([alias, *conf.shard_aliases()]))  # and every database of SHARD_DATABASES
    except Exception:  # noqa: BLE001 (E001 names a bad SHARD_DATABASES)
        homes = [alias]
    for home in homes:
        engine = connections[home].vendor
        if engine != "postgresql":
            return [Error(
                f"cron_at_scale needs PostgreSQL 13+; the {home} database is {engine}.",
                hint=f"Its claim uses FOR UPDATE SKIP LOCKED, jsonb and LISTEN/NOTIFY. Point DATABASES[{home!r}] "
                     "(or DATABASE_URL) at PostgreSQL; for a laptop, the repository's docker-compose.yml starts one.",
                id="cron_at_scale.E002")]
    try:
        from cron_at_scale import sql as db

        fsync, commit = db.run("durability_settings", fetch="one", retries=0)
    except Exception:  # noqa: BLE001 (the database is down: other checks and the processes say so)
        return []
    if fsync != "on" or commit in ("off", "local"):
        return [Warning(
            f"PostgreSQL runs with fsync={fsync}, synchronous_commit={commit}: a start of an attempt may be lost "
            "in a crash, and the same (job, attempt) may then run twice.",
            hint="Keep fsync on and synchronous_commit at 'on' (the default) or stronger; see docs/guarantees.md.",
            id="cron_at_scale.W004")]
    return []


@register()
def check_celery(app_configs=None, **kwargs):
    from cron_at_scale.celery_app import get_app
    from cron_at_scale.worker.task import JobTask

    if conf.problems():
        return []  # E001 already names the bad setting; the app may not even be loadable
    try:
        app = get_app()
    except Exception as e:  # noqa: BLE001 (a check reports, it does not crash manage.py)
        return [Error(f"cannot load the Celery app: {e}", hint="Check CRON_AT_SCALE['CELERY_APP'].",
                      id="cron_at_scale.E003")]
    errors = []
    task_cls = app.Task if isinstance(app.Task, type) else type(app.Task)
    if not issubclass(task_cls, JobTask):
        errors.append(Error(
            f"The Celery app {app.main!r} does not use cron_at_scale's task class ({task_cls.__module__}."
            f"{task_cls.__qualname__}).",
            hint='Create it as Celery("proj", task_cls="cron_at_scale.worker:JobTask") so that scheduled runs '
                 "are logged, deduplicated and completed.",
            id="cron_at_scale.E003"))
    for problem in pickle_problems(app):
        errors.append(Error(f"Celery {problem}.", hint="Scheduled messages are JSON only: set "
                            "CELERY_TASK_SERIALIZER = 'json' and CELERY_ACCEPT_CONTENT = ['json'].",
                            id="cron_at_scale.E004"))
    visibility = (app.conf.get("broker_transport_options") or {}).get("visibility_timeout")
    if visibility is not None and float(visibility) < float(conf.get("RUN_LEASE")):
        errors.append(Warning(
            f"The broker's visibility_timeout ({visibility}s) is shorter than RUN_LEASE "
            f"({conf.get('RUN_LEASE')}s).",
            hint="An acks_late task's message would be redelivered while it still runs; the attempt log skips "
                 "the copy, but raise visibility_timeout above RUN_LEASE.", id="cron_at_scale.W001"))
    return errors


@register()
def check_connections(app_configs=None, **kwargs):
    from django.conf import settings

    warnings = []
    alias = conf.db_alias()
    default = settings.DATABASES.get(alias, {}) if isinstance(alias, str) else {}
    if not default.get("CONN_MAX_AGE") and not getattr(settings, "CELERY_DB_REUSE_MAX", None):
        warnings.append(Warning(
            "Celery workers will open a new PostgreSQL connection for every task (CONN_MAX_AGE = 0 and "
            "CELERY_DB_REUSE_MAX unset).",
            hint=f"Set DATABASES[{alias!r}]['CONN_MAX_AGE'] (e.g. 600) and CELERY_DB_REUSE_MAX (e.g. 1000).",
            id="cron_at_scale.W002"))
    if not conf.problems() and float(conf.get("RUN_LEASE")) <= 2 * float(conf.get("HEARTBEAT_INTERVAL")):
        warnings.append(Warning(
            f"RUN_LEASE ({conf.get('RUN_LEASE')}s) is not longer than two heartbeats "
            f"(HEARTBEAT_INTERVAL {conf.get('HEARTBEAT_INTERVAL')}s).",
            hint="One late heartbeat would let the lease expire and the job run again; keep RUN_LEASE >= 3 x "
                 "HEARTBEAT_INTERVAL.", id="cron_at_scale.W003"))
    return warnings


_reading_tasks = False


@register()
def check_retry_options(app_configs=None, **kwargs):
    """cron_at_scale.E005 / W005: each task's Celery retry options, as a scheduled run reads them."""
    from cron_at_scale.celery_app import get_app
    from cron_at_scale.policy import retry

    global _reading_tasks
    if conf.problems() or _reading_tasks:
        return []
    _reading_tasks = True  # importing the task modules runs the checks again (Celery's Django fixup)
    try:
        app = get_app()
        app.loader.import_default_modules()
        tasks = sorted(app.tasks.items())
    except Exception:  # noqa: BLE001 (E003 reports an app that does not load)
        return []
    finally:
        _reading_tasks = False
    out = []
    for name, task in tasks:
        for problem in retry.unsupported(task):
            out.append(Error(f"Task {name}: {problem}.", hint="Drop it, or retry with self.retry(countdown=..., "
                             "max_retries=...) (see docs/settings.md, Retries).", id="cron_at_scale.E005"))
        for problem in retry.contradictions(task):
            out.append(Warning(f"Task {name}: {problem}.", hint="Lower retry_backoff or raise retry_backoff_max "
                               "(Celery reads them the same way; see docs/settings.md, Retries).",
                               id="cron_at_scale.W005"))
    return out


@register()
def check_beat_schedule(app_configs=None, **kwargs):
    """cron_at_scale.W006: each ``beat_schedule`` entry the beat drop-in would not run, by name."""
    from cron_at_scale.beat.mapping import unmapped
    from cron_at_scale.celery_app import get_app

    if conf.problems():
        return []
    try:
        app = get_app()
        entries = app.conf.beat_schedule
    except Exception:  # noqa: BLE001 (E003 reports an app that does not load)
        return []
    return [Warning(f"beat_schedule entry {name!r} cannot be mapped to a job: {why}. Under "
                    "'celery beat -S cron_at_scale.beat:Scheduler' it does not run.",
                    hint="Express it as a crontab, a timedelta or seconds, or schedule it with "
                         "cron_at_scale.schedule(cron=...) (docs/from-celery-beat.md). If you do not run the "
                         "drop-in, add cron_at_scale.W006 to SILENCED_SYSTEM_CHECKS.",
                    id="cron_at_scale.W006")
            for name, why in unmapped(entries, app)]
