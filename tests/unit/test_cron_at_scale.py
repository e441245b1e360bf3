"""The lazy wrappers in cron_at_scale keep the signatures (and so the type hints) of what they wrap."""

from __future__ import annotations

import inspect

import pytest

import cron_at_scale
from cron_at_scale import worker
from cron_at_scale.api import schedule as scheduling


@pytest.mark.parametrize("name", ["schedule", "reschedule", "schedule_many", "cancel", "requeue", "pause",
                                  "resume"])
def test_wrapper_has_the_signature_of_the_scheduling_function(name):
    wrapper, wrapped = getattr(cron_at_scale, name), getattr(scheduling, name)
    assert wrapper is not wrapped  # a wrapper, so importing cron_at_scale needs no app registry
    assert inspect.signature(wrapper) == inspect.signature(wrapped)


def test_the_rest_of_the_public_api_is_the_thing_itself():
    assert cron_at_scale.JobTask is worker.JobTask and cron_at_scale.current_job is worker.current_job
    assert set(cron_at_scale.__all__) >= {"schedule", "schedule_many", "cancel", "requeue", "pause", "resume",
                                          "JobTask", "RetryableError", "ValidationError", "current_job"}
    with pytest.raises(AttributeError):
        cron_at_scale.no_such_name  # noqa: B018


def _imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside a function."""
    import ast
    from pathlib import Path

    root = Path(cron_at_scale.__file__).parent
    mods = {}
    for f in root.rglob("*.py"):
        if "migrations" not in f.parts:
            parts = f.relative_to(root.parent).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(n.names) else [base, *subs]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def test_no_import_circle_runs_through_more_than_two_modules():
    """A circle of two (a module and its helper) is allowed; a longer one means a room leans on a room
    that leans back on it, however lazily the import is written."""
    graph = _imports()
    circles = []
    for start in graph:  # the modules reachable from start that reach start back: its circle
        seen, todo = set(), [start]
        while todo:
            for w in graph[todo.pop()]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        if start in seen:
            back = {w for w in seen if w == start or _reaches(graph, w, start)}
            if len(back) > 2:
                circles.append(sorted(back))
    assert not circles, f"import circles of more than two modules: {circles[0]}"


def _reaches(graph: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        for w in graph[todo.pop()]:
            if w == b:
                return True
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False
