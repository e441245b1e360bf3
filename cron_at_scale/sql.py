"""Named queries of the hot path, loaded from ``queries.sql``.

Reviewing what the dispatcher and the workers send to PostgreSQL means
reading that one file.
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = (Path(__file__).with_name("queries.sql")).read_text()
    parts = _HEADER.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        # Comments go: psycopg2 would read a "%(x)s" in them as a parameter.
        lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


QUERIES: dict[str, str] = _load()
