"""The SQL files and the code agree: each statement of ``cron_at_scale/sql/*.sql`` is run by the one
module its header names, and every statement the code names exists. Pure: the loader and the
package's source, read as text (no database)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cron_at_scale import sql

PACKAGE = Path(sql.__file__).resolve().parent.parent  # cron_at_scale/
# Receivers of run(): the modules import the runner as ``from cron_at_scale import sql as db``.
RUNNER_NAMES = frozenset({"db", "sql"})
# Modules that may send SQL on a cursor of their own (see cron_at_scale.sql's docstring): the runner;
# the operator's read-only figures built at run time; the dispatcher's LISTEN, on its own connection.
CURSOR_MODULES = frozenset({"cron_at_scale.sql", "cron_at_scale.ops.status", "cron_at_scale.dispatcher.wakeup"})
# A statement that only reads the clock (a cutoff computed from it, retention_cutoff, is a statement's own use).
BARE_CLOCK = re.compile(r"^\s*SELECT\s+(extract\s*\(\s*epoch\s+FROM\s+)?"
                        r"(now|statement_timestamp|clock_timestamp|transaction_timestamp|current_timestamp)\s*(\(\s*\))?"
                        r"\s*\)?\s*(::\s*\w+)?\s*(AS\s+\w+)?\s*;?\s*$", re.IGNORECASE)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def statement_references(tree: ast.Module) -> list[tuple[str, int]]:
    """(name, line) of each statement the module names: ``db.run("name", ...)`` / ``sql.run(...)``
    / ``run("name", ...)`` and ``QUERIES["name"]``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f, first = node.func, node.args[0]
            runner = (isinstance(f, ast.Attribute) and f.attr == "run" and isinstance(f.value, ast.Name)
                      and f.value.id in RUNNER_NAMES) or (isinstance(f, ast.Name) and f.id == "run")
            if runner and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((first.value, node.lineno))
        elif isinstance(node, ast.Subscript):
            v, key = node.value, node.slice
            named = (isinstance(v, ast.Name) and v.id == "QUERIES") or (isinstance(v, ast.Attribute) and v.attr == "QUERIES")
            if named and isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.append((key.value, node.lineno))
    return found


def references() -> dict[str, dict[str, list[int]]]:
    """statement name -> {module: [lines]}"""
    refs: dict[str, dict[str, list[int]]] = {}
    for module, tree in modules().items():
        for name, line in statement_references(tree):
            refs.setdefault(name, {}).setdefault(module, []).append(line)
    return refs


def ownership_problems(owners: dict[str, str], refs: dict[str, dict[str, list[int]]]) -> list[str]:
    problems = []
    for name, owner in sorted(owners.items()):
        users = sorted(refs.get(name, {}))
        if users != [owner]:
            problems.append(f"{name}: its header says run by {owner}; run by {', '.join(users) or 'no module'}")
    for name, users in sorted(refs.items()):
        if name not in owners:
            where = ", ".join(f"{m}:{lines[0]}" for m, lines in sorted(users.items()))
            problems.append(f"{name}: named at {where}, in no sql/*.sql file")
    return problems


def test_each_statement_is_run_by_the_one_module_its_header_names():
    assert ownership_problems(sql.OWNERS, references()) == []


def test_the_check_sees_a_second_user_a_wrong_owner_and_an_unknown_name():
    refs = references()
    planted = {**refs, "claim": {**refs["claim"], "cron_at_scale.maintenance.reaper": [1]}}
    assert any(p.startswith("claim:") for p in ownership_problems(sql.OWNERS, planted))
    misnamed = {**sql.OWNERS, "reap": "cron_at_scale.maintenance.overdue"}
    assert any(p.startswith("reap:") for p in ownership_problems(misnamed, refs))
    unknown = {**refs, "no_such_statement": {"cron_at_scale.api.control": [1]}}
    assert any(p.startswith("no_such_statement:") for p in ownership_problems(sql.OWNERS, unknown))


def test_every_header_names_an_existing_module():
    known = set(modules())
    assert {name: owner for name, owner in sql.OWNERS.items() if owner not in known} == {}


def test_named_statements_are_sent_through_run():
    readers = {m for m, tree in modules().items() if m != "cron_at_scale.sql"
               for node in ast.walk(tree) if isinstance(node, ast.Subscript)
               and isinstance(node.value, (ast.Name, ast.Attribute))
               and getattr(node.value, "id", getattr(node.value, "attr", None)) == "QUERIES"}
    assert readers == set(), "named statements go through cron_at_scale.sql.run()"


def test_sql_on_a_cursor_of_its_own_only_where_the_rule_allows():
    senders = {}
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and node.func.attr in ("execute", "executemany", "copy_expert", "copy_from")):
                senders.setdefault(module, node.lineno)
    assert {m: line for m, line in senders.items() if m not in CURSOR_MODULES} == {}


def test_the_database_clock_is_read_by_itself_only_through_db_now():
    reads = []
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and BARE_CLOCK.match(node.value):
                reads.append(f"{module}:{node.lineno}")
    assert reads == []
    assert [n for n, text in sql.QUERIES.items() if BARE_CLOCK.match(text)] == ["db_now"]


def write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_the_loader_reads_headers_options_and_owners(tmp_path):
    queries, options, owners = sql._load(write(tmp_path, {"a.sql": (
        "-- preamble\n\n"
        "-- name: one :prepared :async  -- run by: cron_at_scale.worker.attempts\n"
        "-- a comment with %(x)s\nSELECT %(y)s;\n\n"
        "-- name: two  -- run by: cron_at_scale.sql\nSELECT 2;\n")}))
    assert queries == {"one": "SELECT %(y)s", "two": "SELECT 2"}
    assert options == {"one": frozenset({"prepared", "async"}), "two": frozenset()}
    assert owners == {"one": "cron_at_scale.worker.attempts", "two": "cron_at_scale.sql"}


def test_the_loader_refuses_a_name_in_two_files(tmp_path):
    header = "-- name: same  -- run by: cron_at_scale.sql\nSELECT 1;\n"
    with pytest.raises(ValueError, match="same is also in a.sql"):
        sql._load(write(tmp_path, {"a.sql": header, "b.sql": header}))


@pytest.mark.parametrize("header", [
    "-- name: nobody",  # no owner
    "-- name: bad :prepared",  # options, no owner
    "-- name: bad  -- run by: somewhere.else",  # not a module of the package
    "-- name: bad  -- run by cron_at_scale.sql",  # no colon
    "--name: bad  -- run by: cron_at_scale.sql",
    "-- name: bad-name  -- run by: cron_at_scale.sql",
])
def test_the_loader_refuses_a_malformed_header(tmp_path, header):
    with pytest.raises(ValueError, match="malformed header"):
        sql._load(write(tmp_path, {"a.sql": header + "\nSELECT 1;\n"}))


def test_the_loader_refuses_an_unknown_option(tmp_path):
    with pytest.raises(ValueError, match="unknown options"):
        sql._load(write(tmp_path, {"a.sql": "-- name: x :fast  -- run by: cron_at_scale.sql\nSELECT 1;\n"}))
