"""The SQL: every statement the package sends, loaded from ``sql/<room>.sql``, and the runner that sends them.

One file per room that runs the statements (``dispatcher.sql``, ``worker.sql``,
``maintenance.sql``, ``api.sql``, ``ops.sql``, and ``common.sql`` for this
module's own :func:`db_now`): reviewing what the dispatcher and the workers send
to PostgreSQL means reading two files. Each statement starts with a header line
``-- name: <name> [:option ...]  -- run by: <module>``, as sqlc's headers do,
naming the one module that runs it (``tests/unit/test_sql.py`` keeps that
true); a name is unique across the files. The options (:data:`OPTIONS`) say how
:func:`run` sends it:

* ``:async``: committed with ``synchronous_commit = off`` (this statement's
  own transaction only): its loss in a crash of PostgreSQL is harmless, as its
  comment says.
* ``:prepared``: run per task by every worker, or per batch by every
  dispatcher (the claim): a server-side prepared statement with a generic plan.

The rules: a named statement is sent through :func:`run` (a ``COPY ... FROM
STDIN`` too, with ``copy_from=``), never with a cursor of the caller's; the
database's clock is read through :func:`db_now` (or a statement's own
``statement_timestamp()``, in its round trip). The one exception: the operator's
read-only figures that :mod:`cron_at_scale.ops.status` builds at run time (bounded
counts and planner estimates, their WHERE made from filters, for ``cron_status``,
the metrics and the admin's paginator), sent on a cursor of its own, as their text
is not known until then and none is a named statement. The dispatcher's LISTEN
(:mod:`cron_at_scale.dispatcher.wakeup`) runs on a dedicated connection, not Django's.

The runner runs the named queries on Django's connection to the app's database
(``CRON_AT_SCALE["DATABASE"]``, :func:`get_connection`), surviving a database restart.
Every connection and transaction of the package's own is that alias's:
``get_connection()``, ``transaction.atomic(using=conf.db_alias())``.
The worker's per-task statements are server-side prepared statements
(``PREPARE`` once per connection, then ``EXECUTE`` with a generic plan):
planning them took longer than running them (~1 ms against ~0.1 ms). Set
``CRON_AT_SCALE["PREPARED_STATEMENTS"] = False`` behind a pooler that does
not keep sessions (PgBouncer in transaction mode).
"""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid
import weakref
from collections import namedtuple
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    ProgrammingError,
    close_old_connections,
    connections,
)
from psycopg2 import sql as pgsql

from cron_at_scale import conf

log = logging.getLogger(__name__)


_HEADER = re.compile(r"^-- name: (\w+)((?:[ \t]+:\w+)*)[ \t]+-- run by: (cron_at_scale(?:\.\w+)*)[ \t]*$",
                     re.MULTILINE)
_ANY_HEADER = re.compile(r"^--[ \t]*name[ \t]*:.*$", re.MULTILINE)  # what looks like a header, well-formed or not
KNOWN_OPTIONS = frozenset({"async", "prepared"})
DIRECTORY = Path(__file__).parent


def _load(directory: Path = DIRECTORY) -> tuple[dict[str, str], dict[str, frozenset[str]], dict[str, str]]:
    """The statements of ``directory/*.sql``: (name -> text, name -> options, name -> the module that
    runs it). Raises ``ValueError`` for a malformed header, an unknown option or a name in two places."""
    queries: dict[str, str] = {}
    options: dict[str, frozenset[str]] = {}
    owners: dict[str, str] = {}
    where: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        text = path.read_text()
        for line in _ANY_HEADER.findall(text):
            if not _HEADER.match(line):
                raise ValueError(f"{path.name}: malformed header {line!r}: "
                                 "expected '-- name: <name> [:option ...]  -- run by: cron_at_scale.<module>'")
        parts = _HEADER.split(text)
        # parts: [preamble, name1, options1, owner1, body1, name2, ...]
        for name, opts, owner, body in zip(parts[1::4], parts[2::4], parts[3::4], parts[4::4]):
            if name in queries:
                raise ValueError(f"{path.name}: statement {name} is also in {where[name]}")
            where[name] = path.name
            # Comments go: psycopg2 would read a "%(x)s" in them as a parameter.
            lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
            queries[name] = "\n".join(lines).strip().rstrip(";")
            options[name] = frozenset(o.lstrip(":") for o in opts.split())
            owners[name] = owner
            unknown = options[name] - KNOWN_OPTIONS
            if unknown:
                raise ValueError(f"{path.name}: statement {name} has unknown options {sorted(unknown)}")
    return queries, options, owners


QUERIES, OPTIONS, OWNERS = _load()
# OWNERS: statement name -> the module that runs it (its header's "run by")

# Statements marked :prepared: run per task by every worker, or per batch by every dispatcher (the
# claim, whose own transaction sets the same plan settings: claim_settings), worth preparing.
PREPARED = frozenset(name for name, opts in OPTIONS.items() if "prepared" in opts)
_PARAM = re.compile(r"%\((\w+)\)s")
_ASYNC = "SET LOCAL synchronous_commit = off; "  # statements marked :async, in their own transaction
# Left to itself PostgreSQL keeps planning these per execution (their array
# parameters make each custom plan look cheaper): ~1 ms of planning against
# ~0.1 ms of execution. Their generic plan should reach each row by primary key
# or (job_id, attempt), never by a scan of the table (statements written
# without joins, sequential and bitmap scans off): a plan that scans is
# O(table) at every task.
_GENERIC = ("SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; "
            "SET LOCAL enable_bitmapscan = off;")
# A statement's own SET LOCALs, sent only when it runs in its own transaction: inside a
# caller's transaction (an eager run, a test) they would outlive it and change the caller's
# commit and plans.
_SETTINGS = {name: (_ASYNC if "async" in OPTIONS[name] else "") + (_GENERIC + " " if name in PREPARED else "")
             for name in QUERIES}
# The generic plan is made at the first EXECUTE after a PREPARE, for the tables as
# they were then (their current size, the statistics' density): the statements are
# prepared again every REPLAN_EVERY executions or REPLAN_SECONDS, so a plan made
# while the tables were empty (a fresh deployment, a TRUNCATE), when PostgreSQL's
# choice of index is a coin toss, does not outlive their growth. Never more often than
# REPLAN_MIN_SECONDS: preparing and planning the start statement again costs milliseconds of
# PostgreSQL's CPU, which a busy pool process paid every few hundred tasks.
REPLAN_EVERY = 200
REPLAN_MIN_SECONDS = 1.0
REPLAN_SECONDS = 30.0
_templates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # raw connection -> {name: _Prepared}


@dataclass
class _Prepared:
    """A worker statement as PREPAREd on one connection."""

    settings: str  # its SET LOCALs, sent with each EXECUTE outside a caller's transaction
    execute: str  # EXECUTE cas_<name>(%(param)s::type, ...)
    body: str  # the PREPAREd text, to prepare it again
    runs: int = 0
    prepared_at: float = field(default_factory=time.monotonic)

    def sql(self, bare: bool) -> str:
        return self.execute if bare else self.settings + self.execute


def _execute_prepared(cur, conn, name: str, params: dict, bare: bool) -> None:
    try:
        _execute_prepared_once(cur, conn, name, params, bare)
    except ProgrammingError as e:  # the session lost its prepared statements (DISCARD ALL by a pooler)
        if f"cas_{name}" not in str(e):
            raise
        _templates.pop(conn.connection, None)
        if conn.in_atomic_block:  # the transaction is aborted: the caller's next one prepares them again
            raise
        _execute_prepared_once(cur, conn, name, params, bare)


def _execute_prepared_once(cur, conn, name: str, params: dict, bare: bool) -> None:
    cache = _templates.setdefault(conn.connection, {})
    entry = cache.get(name)
    if entry is None:
        text = QUERIES[name]
        names: list[str] = []
        for found in _PARAM.findall(text):
            if found not in names:
                names.append(found)
        body = _PARAM.sub(lambda m: f"${names.index(m.group(1)) + 1}", text)
        cur.execute(f"DEALLOCATE ALL; PREPARE cas_{name} AS {body}" if not cache else f"PREPARE cas_{name} AS {body}")
        cur.execute("SELECT unnest(parameter_types)::text FROM pg_prepared_statements WHERE name = %s",
                    [f"cas_{name}"])
        types = [r[0] for r in cur.fetchall()]
        args = ", ".join(f"%({n})s::{t}" for n, t in zip(names, types))
        entry = cache[name] = _Prepared(_SETTINGS[name], f"EXECUTE cas_{name}({args})", body)
    elif (age := time.monotonic() - entry.prepared_at) > REPLAN_SECONDS or (
            entry.runs >= REPLAN_EVERY and age >= REPLAN_MIN_SECONDS):
        cur.execute(f"DEALLOCATE cas_{name}; PREPARE cas_{name} AS {entry.body}")  # for the tables as they are now
        entry.runs, entry.prepared_at = 0, time.monotonic()
    entry.runs += 1
    cur.execute(entry.sql(bare), params)


_PLAIN_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def array(values: Iterable[Any]) -> str:
    """``values`` as one PostgreSQL array literal (``'{a,b,NULL}'``), for a parameter the
    statement casts (``%(ids)s::uuid[]``). psycopg2 adapts a list item by item, ~5 µs per UUID or
    datetime: 60 ms of a 1,000-row claim's write of twelve columns; the literal costs ~1 µs an item.

    Items: None, UUIDs, ints, floats, aware datetimes (ISO 8601, with their offset) and plain words
    (``dispatched``); anything else raises ``TypeError`` (a string that would need quoting).
    """
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        elif isinstance(v, datetime):
            if v.tzinfo is None:
                raise TypeError(f"naive datetime {v!r} in an array parameter")
            parts.append(v.isoformat())
        elif isinstance(v, (uuid.UUID, int, float)):
            parts.append(str(v).lower() if isinstance(v, bool) else str(v))
        elif isinstance(v, str) and _PLAIN_WORD.match(v):
            parts.append(v)
        else:
            raise TypeError(f"{v!r} cannot go in an array literal unquoted")
    return "{" + ",".join(parts) + "}"


def run(name: str, params: dict | None = None, *, fetch: str = "all", retries: int = 1, copy_from: Any = None,
        identifiers: dict[str, str] | None = None):
    """Execute query ``name`` in autocommit; return its rows (``fetch='all'``), one row or None
    (``'one'``), each a named tuple of its columns, or the row count (``'count'``).

    ``identifiers``: for a statement with ``{name}`` placeholders (the history partitions' DDL),
    the table and constraint names they stand for, quoted as identifiers (psycopg2.sql).

    On a broken connection (PostgreSQL restarted) the connection is dropped
    and the statement tried again ``retries`` times. Only for statements that
    are safe to repeat (each of ours is conditional on the row's state).

    ``copy_from``: for a ``COPY ... FROM STDIN`` statement, the file its rows are read from
    (psycopg2's ``copy_expert``); give ``retries=0``, a stream cannot be read twice.
    """
    conn = get_connection()
    for attempt in range(retries + 1):
        try:
            # In the caller's transaction (an eager run, a test) a SET LOCAL would outlive
            # this statement and change the caller's commit and plans: none is sent.
            bare = conn.in_atomic_block
            with conn.cursor() as cur:
                if copy_from is not None:
                    cur.copy_expert(QUERIES[name] if bare else _SETTINGS[name] + QUERIES[name], copy_from)
                elif name in PREPARED and conf.get("PREPARED_STATEMENTS"):
                    _execute_prepared(cur, conn, name, params or {}, bare)
                else:
                    text = QUERIES[name] if bare else _SETTINGS[name] + QUERIES[name]
                    if identifiers:
                        conn.ensure_connection()
                        text = pgsql.SQL(text).format(**{k: pgsql.Identifier(v) for k, v in identifiers.items()}) \
                            .as_string(conn.connection)
                    cur.execute(text, params or {})
                return cur.rowcount if copy_from is not None else _fetch(cur, fetch, name)
        except (OperationalError, InterfaceError):
            if attempt == retries:
                raise
            log.warning("database connection lost running %s; reconnecting", name)
            reset_connection()
            time.sleep(0.2 * (attempt + 1))
    return None


def db_now(*, retries: int = 0) -> datetime:
    """The database's clock, ``statement_timestamp()``: an aware datetime in UTC.

    The one way to read it by itself (one round trip, statement ``db_now``, on Django's connection,
    in the caller's transaction if any); a statement that needs the time reads it in its own text.
    Every node's notion of "now" that matters (when a job is due, a lease's end, a worker's clock
    offset, :mod:`cron_at_scale.worker.clock`) is this clock's, never its own. ``retries``: as
    :func:`run`'s, on a broken connection (none by default: a caller's transaction cannot be redone).
    """
    return run("db_now", fetch="one", retries=retries)[0].astimezone(timezone.utc)


_row_types: dict[str, Any] = {}  # statement name -> its row type: a statement's columns never change


def _fetch(cur, fetch: str, name: str = ""):
    if fetch == "count":
        return cur.rowcount
    row_type = _row_types.get(name)
    if row_type is None:
        row_type = _row_type(tuple(c.name for c in cur.description))
        if name:
            _row_types[name] = row_type
    if fetch == "all":
        return [row_type._make(r) for r in cur.fetchall()]
    row = cur.fetchone()
    return None if row is None else row_type._make(row)


@functools.lru_cache(maxsize=256)
def _row_type(columns: tuple[str, ...]):
    """Rows by column name (a named tuple per column list, built once): a reordered SELECT
    cannot silently shift what a caller reads. Columns must be named (``AS name``)."""
    return namedtuple("Row", columns, rename=True)  # an unnamed column becomes _<position>


def as_row(values: dict):
    """A row by column name (as :func:`run` returns them) from a dict of its columns, in order: a row
    sent to another process as a plain dict (a batch's start, handed to the pool process)."""
    return _row_type(tuple(values))._make(values.values())


def get_connection():
    """This thread's Django connection to the app's database (``CRON_AT_SCALE["DATABASE"]``)."""
    return connections[conf.db_alias()]


def reset_connection() -> None:
    """Drop this thread's connection to the app's database so the next query reconnects."""
    connection = get_connection()
    try:
        connection.close()
    except Exception:  # a dead socket may fail to close; the next use reconnects anyway
        connection.connection = None
    close_old_connections()
