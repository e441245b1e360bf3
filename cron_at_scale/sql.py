"""Named queries of the hot path, loaded from ``queries.sql``.

Reviewing what the dispatcher and the workers send to PostgreSQL means
reading that one file. Each statement starts with a header line
``-- name: <name> [:option ...]``, as sqlc's headers do; the options
(:data:`OPTIONS`) say how :func:`cron_at_scale.db.run` sends it:

* ``:async``: committed with ``synchronous_commit = off`` (this statement's
  own transaction only): its loss in a crash of PostgreSQL is harmless, as its
  comment says.
* ``:prepared``: run per task by every worker: a server-side prepared
  statement with a generic plan (see :mod:`cron_at_scale.db`).
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^-- name: (\w+)((?:\s+:\w+)*)\s*$", re.MULTILINE)
KNOWN_OPTIONS = frozenset({"async", "prepared"})


def _load() -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    text = (Path(__file__).with_name("queries.sql")).read_text()
    parts = _HEADER.split(text)
    # parts: [preamble, name1, options1, body1, name2, options2, body2, ...]
    queries, options = {}, {}
    for name, opts, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        # Comments go: psycopg2 would read a "%(x)s" in them as a parameter.
        lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
        options[name] = frozenset(o.lstrip(":") for o in opts.split())
        unknown = options[name] - KNOWN_OPTIONS
        if unknown:
            raise ValueError(f"queries.sql: statement {name} has unknown options {sorted(unknown)}")
    return queries, options


QUERIES, OPTIONS = _load()
