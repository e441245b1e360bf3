"""Argument parsers shared by the cron_* commands: each turns bad input into a clear message;
and the lookup of the jobs a command names by id or key (:func:`resolve_job`, :func:`named_jobs`)."""

from __future__ import annotations

import argparse
import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from django.core.management.base import CommandError

if TYPE_CHECKING:  # the models load with Django's apps, after this module
    from cron_at_scale.models import Job

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION = 100 * 365 * 86400  # seconds: a century; far longer ones overflow PostgreSQL's timestamps


def duration(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"1w"`` or plain seconds (``"3600"``) -> seconds,
    at most ``MAX_DURATION``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 7d, 12h, 30m, 3600)")
    value = float(match[1]) * _UNITS.get(match[2] or "s", 1)
    if value > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"out of range, longer than a century: {text!r}")
    return value


duration.__name__ = "duration"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


positive_int.__name__ = "number"


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


seconds.__name__ = "seconds"


def aware_datetime(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 datetime: {text!r} (e.g. 2030-01-01T09:00:00+00:00)") \
            from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a UTC offset, e.g. {text}+00:00 (a time without one is ambiguous)")
    return value


aware_datetime.__name__ = "datetime"


def job_id(text: str) -> str:
    """A job id (a UUID, any of its spellings) -> its canonical text. Parsed before the command runs,
    so that one malformed id in a list stops it before it changes anything."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id (a UUID such as 0190a0c2-3b5e-7c1d-8f00-123456789abc): "
                                         f"{text[:80]!r}") from None


job_id.__name__ = "job id"


def resolve_job(ref: str, *, live_key: bool = False) -> tuple[Job | None, str | None, str]:
    """What ``ref`` (a job id, any UUID spelling, or an idempotency key) names: ``(job, uid, malformed)``,
    the job or None, the canonical id if ``ref`` reads as one (else None), and :func:`job_id`'s message
    if it does not (else ""). A key names its live job (keys are unique among live jobs), else, unless
    ``live_key``, its latest finished one."""
    from cron_at_scale import conf
    from cron_at_scale.models import LIVE_STATUSES, Job

    job, uid, malformed = None, None, ""
    try:
        uid = job_id(ref)
        job = Job.objects.using(conf.alias_of_job(uid)).filter(id=uid).first()
    except argparse.ArgumentTypeError as e:
        malformed = str(e)
    if job is None:  # a key (also one that reads as a UUID)
        by_key = Job.objects.using(conf.alias_of_key(ref)).filter(key=ref)  # SHARD_DATABASES: the key's
        job = by_key.filter(status__in=LIVE_STATUSES).first()
        if job is None and not live_key:
            job = by_key.order_by("-fire_at", "-id").first()
    return job, uid, malformed


def named_jobs(refs: list[str], *, what: str = "JOB") -> list:
    """The jobs named by ``refs`` (each as :func:`resolve_job` reads it), in order, without duplicates.
    Raises ``CommandError`` naming every ref that names no job (a malformed id among them, with
    :func:`job_id`'s message) before the caller changes anything."""
    jobs, unknown, seen = [], [], set()
    for ref in refs:
        job, _, malformed = resolve_job(ref)
        if job is None:
            unknown.append(f"{malformed}, nor the key of a job" if malformed
                           else f"{ref[:80]!r}: no job has this id or key")
        elif job.id not in seen:
            seen.add(job.id)
            jobs.append(job)
    if unknown:
        raise CommandError(f"{what}: " + "; ".join(unknown) + " (nothing changed)")
    return jobs


def json_of(kind: type):
    name = "list" if kind is list else "object"
    example = '[1, 2]' if kind is list else '{"a": 1}'

    def parse(text: str):
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not JSON ({e}): {text[:80]!r}") from None
        except RecursionError:
            raise argparse.ArgumentTypeError("not JSON this program accepts: nested too deeply") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"must be a JSON {name}, e.g. {example}")
        return value

    parse.__name__ = f"JSON {name}"
    return parse


def flag_error(e, flags: Mapping[str, str]) -> CommandError:
    """A ``cron_at_scale.ValidationError`` as the command's user knows it: the argument at fault named
    by the command's own flag (``flags``: field -> ``"--flag"`` or ``"ARG"``), not the Python name."""
    field = getattr(e, "field", "")
    text = str(e)
    if field in flags and text.startswith(f"{field}: "):
        text = f"{flags[field]}: {text[len(field) + 2:]}"
    return CommandError(text)


def add_job_selection(parser, verb: str) -> None:
    """The arguments of a command that acts on named jobs or, in bulk, on a task's or every recurring job:
    ``JOB`` (ids or keys), ``--task``, ``--all``, ``--yes``."""
    parser.add_argument("jobs", nargs="*", metavar="JOB",
                        help="job ids (UUIDs) or idempotency keys; one that names no job stops the command "
                             "before it changes any")
    parser.add_argument("--task", help=f"{verb} every recurring job of this task name (with --yes)")
    parser.add_argument("--all", action="store_true", help=f"{verb} every recurring job (with --yes)")
    parser.add_argument("--yes", action="store_true",
                        help="with --task or --all: do it (without: list what would change, change nothing)")


def selected_jobs(opts, status: str, verb: str, write) -> list:
    """The jobs ``opts`` (from :func:`add_job_selection`) selects: the named ones, or the recurring jobs in
    ``status`` of ``--task`` / ``--all``. Without ``--yes`` a bulk selection is listed (``write``) and
    ``CommandError`` raised (exit 1): nothing changes. Raises ``CommandError`` for no or a mixed selection."""
    from cron_at_scale.models import Job, ScheduleType

    bulk = opts["task"] is not None or opts["all"]
    if opts["jobs"] and bulk:
        raise CommandError("give JOB ids/keys, or --task / --all, not both")
    if not opts["jobs"] and not bulk:
        raise CommandError(f"give the JOB ids or keys to {verb}, or --task NAME / --all (with --yes)")
    if opts["jobs"]:
        return named_jobs(opts["jobs"])
    from cron_at_scale import conf

    jobs = []
    for alias in conf.shard_aliases():  # every database of SHARD_DATABASES
        query = Job.objects.using(alias).filter(status=status).exclude(schedule_type=ScheduleType.ONCE)
        if opts["task"] is not None:
            query = query.filter(task=opts["task"])
        # what the commands print and compare, not the payloads: a selection can be every recurring job
        jobs += query.order_by("fire_at", "id").only("id", "key", "task", "status", "schedule_type", "fire_at",
                                                     "attempts", "missed_occurrences")
    jobs.sort(key=lambda job: (job.fire_at, job.id))
    if not opts["yes"]:
        for job in jobs:
            write(f"would {verb} {describe(job)}")
        raise CommandError(f"{len(jobs)} {status} recurring job{'s' if len(jobs) != 1 else ''} match; add --yes to "
                           f"{verb} {'them' if len(jobs) != 1 else 'it'} (nothing changed)")
    return jobs


def describe(job) -> str:
    """``<id> (<key or task>)``: how a command names a job in what it prints."""
    return f"{job.id} ({job.key or job.task})"
