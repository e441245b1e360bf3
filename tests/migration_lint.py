"""A linter for migrations, by the SQL they run (``sqlmigrate``): nothing that holds a lock for a time
that grows with a table (imported as ``migration_lint`` by tests/integration/test_migrations.py).

On a table the migration did not create itself, each of these is reported: a table rewrite (a
column added with a volatile default, a stored generated column or a serial; ``ALTER COLUMN ...
TYPE``; ``SET TABLESPACE``, ``SET LOGGED``; ``VACUUM FULL``, ``CLUSTER``), a scan under an exclusive
lock (``SET NOT NULL``, ``ADD CONSTRAINT`` of a CHECK or FOREIGN KEY without ``NOT VALID``, a CHECK
on an added column, a UNIQUE or PRIMARY KEY constraint not ``USING INDEX``), an index built or
dropped without ``CONCURRENTLY`` (``REINDEX`` too), and a one-statement ``UPDATE``/``DELETE`` of a
whole table (a backfill goes in batches, from Python).
"""

from __future__ import annotations

import re
from io import StringIO

_NAME = r'"?([\w.]+)"?'
_CREATE_TABLE = re.compile(rf"^CREATE TABLE (?:IF NOT EXISTS )?{_NAME}", re.I)
_CREATE_INDEX = re.compile(rf"^CREATE (?:UNIQUE )?INDEX (CONCURRENTLY )?(?:IF NOT EXISTS )?.*? ON (?:ONLY )?{_NAME}", re.I)
_ALTER_TABLE = re.compile(rf"^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?{_NAME}\s+(.*)$", re.I | re.S)
_FUNCTION = re.compile(r"\b(\w+)\s*\(")


def statements(sql_text: str) -> list[str]:
    """The statements of ``sqlmigrate``'s output: comments and BEGIN/COMMIT left out."""
    lines = [ln for ln in sql_text.splitlines() if ln.strip() and not ln.lstrip().startswith("--")]
    out = [s.strip() for s in "\n".join(lines).split(";\n")]
    return [s.rstrip(";").strip() for s in out if s.rstrip(";").strip().upper() not in ("", "BEGIN", "COMMIT")]


def sql_of(app_label: str, name: str) -> str:
    """``manage.py sqlmigrate app_label name``'s output."""
    from django.core.management import call_command

    out = StringIO()
    call_command("sqlmigrate", app_label, name, stdout=out)
    return out.getvalue()


def sql_of_migration(migration, state) -> str:
    """The SQL of a migration object (one not on disk: the linter's own test), applied to ``state``,
    as ``sqlmigrate`` collects it."""
    from django.db import connection

    with connection.schema_editor(collect_sql=True, atomic=migration.atomic) as editor:
        migration.apply(state, editor, collect_sql=True)
    return "\n".join(editor.collected_sql)


def volatile_functions(names: set[str]) -> set[str]:
    """Which of these function names PostgreSQL has as volatile (any overload)."""
    if not names:
        return set()
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT DISTINCT lower(proname) FROM pg_proc WHERE lower(proname) = ANY(%s) AND provolatile = 'v'",
                    [sorted(n.lower() for n in names)])
        return {r[0] for r in cur.fetchall()}


def _split_actions(actions: str) -> list[str]:
    """``ADD COLUMN a ..., ALTER COLUMN b ...``: the comma-separated actions (commas inside
    parentheses kept)."""
    parts, depth, current = [], 0, []
    for ch in actions:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def problems(sql_text: str) -> list[str]:
    """What in this migration's SQL holds a lock for a time that grows with a table (empty: none)."""
    found: list[str] = []
    stmts = statements(sql_text)
    created = {m.group(1).lower() for s in stmts if (m := _CREATE_TABLE.match(s))}
    for stmt in stmts:
        flat = " ".join(stmt.split())
        upper = flat.upper()
        if m := _CREATE_INDEX.match(flat):
            if not m.group(1) and m.group(2).lower() not in created:
                found.append(f"index built without CONCURRENTLY (blocks writes for the table's size): {flat}")
            continue
        if upper.startswith("DROP INDEX") and not upper.startswith("DROP INDEX CONCURRENTLY"):
            found.append(f"index dropped without CONCURRENTLY (an exclusive lock, queued behind every query): {flat}")
            continue
        if upper.startswith("REINDEX") and "CONCURRENTLY" not in upper:
            found.append(f"REINDEX without CONCURRENTLY: {flat}")
            continue
        if upper.startswith(("VACUUM FULL", "CLUSTER")):
            found.append(f"table rewrite: {flat}")
            continue
        if m := re.match(rf"^(UPDATE|DELETE FROM)\s+{_NAME}", flat, re.I):
            if m.group(2).lower() not in created:
                found.append(f"one-statement {m.group(1).upper()} of a table (backfill in batches): {flat}")
            continue
        m = _ALTER_TABLE.match(flat)
        if not m or m.group(1).lower() in created:
            continue
        for action in _split_actions(m.group(2)):
            a = action.upper()
            if re.match(r"^ALTER (COLUMN )?\S+ (SET DATA )?TYPE\b", a):
                found.append(f"column type change (a rewrite or a scan, under an exclusive lock): {flat}")
            elif re.match(r"^ALTER (COLUMN )?\S+ SET NOT NULL\b", a):
                found.append(f"SET NOT NULL (a scan under an exclusive lock): {flat}")
            elif a.startswith("ADD CONSTRAINT") or a.startswith(("CHECK", "FOREIGN KEY", "UNIQUE", "PRIMARY KEY")):
                if re.search(r"\b(UNIQUE|PRIMARY KEY)\b", a) and "USING INDEX" not in a:
                    found.append(f"UNIQUE/PRIMARY KEY constraint built under lock (build the index "
                                 f"CONCURRENTLY, then USING INDEX): {flat}")
                elif re.search(r"\b(CHECK|FOREIGN KEY)\b", a) and "NOT VALID" not in a:
                    found.append(f"constraint without NOT VALID (a scan under lock): {flat}")
            elif a.startswith("ADD COLUMN") or (a.startswith("ADD ") and not a.startswith("ADD CONSTRAINT")):
                if re.search(r"\bGENERATED ALWAYS AS\b.*\bSTORED\b", a) or re.search(r"\b(BIG|SMALL)?SERIAL\b", a):
                    found.append(f"column computed for every row (a rewrite): {flat}")
                if re.search(r"\bCHECK\s*\(", a) or re.search(r"\bREFERENCES\b", a):
                    found.append(f"constraint on an added column (a scan under lock): {flat}")
                if re.search(r"\bNOT NULL\b", a) and not re.search(r"\bDEFAULT\b", a):
                    found.append(f"NOT NULL column without a default (fails on a table with rows): {flat}")
                default = re.search(r"\bDEFAULT\b(.*?)(?:\bNOT NULL\b|\bNULL\b|\bCHECK\b|\bREFERENCES\b|$)", action,
                                    re.I | re.S)
                if default:
                    volatile = volatile_functions(set(_FUNCTION.findall(default.group(1))))
                    if volatile:
                        found.append(f"volatile default {sorted(volatile)} (a rewrite): {flat}")
            elif re.match(r"^SET (TABLESPACE|LOGGED|UNLOGGED|WITHOUT OIDS|ACCESS METHOD)\b", a):
                found.append(f"table rewrite: {flat}")
    return found
