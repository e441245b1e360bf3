"""Argument parsers shared by the cron_* commands: each turns bad input into a clear message."""

from __future__ import annotations

import argparse
import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import datetime

from django.core.management.base import CommandError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"1w"`` or plain seconds (``"3600"``) -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 7d, 12h, 30m, 3600)")
    return float(match[1]) * _UNITS.get(match[2] or "s", 1)


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
