"""The modules' old paths (before the code moved into rooms) import the very same modules; the
repository's own code and docs use the new ones."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cron_at_scale import compat

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(compat.MOVED))
def test_an_old_path_imports_the_new_module_itself(old):
    new, stays = compat.MOVED[old]
    module = importlib.import_module(f"cron_at_scale.{new}")
    sys.modules.pop(f"cron_at_scale.{old}", None)
    if stays:
        assert importlib.import_module(f"cron_at_scale.{old}") is module
    else:
        with pytest.warns(compat.MovedWarning, match=f"cron_at_scale.{new}"):
            assert importlib.import_module(f"cron_at_scale.{old}") is module


def test_a_patch_through_an_old_path_holds_for_the_new_one(monkeypatch):
    import cron_at_scale.scheduling as old

    monkeypatch.setattr("cron_at_scale.scheduling.db_now", lambda: "patched")
    from cron_at_scale.api import schedule

    assert schedule.db_now() == "patched" and old is schedule


def test_the_paths_users_write_in_settings_resolve_without_a_warning():
    code = ("import warnings; warnings.simplefilter('error');"
            "from celery.utils.imports import symbol_by_name as s;"
            "s('cron_at_scale.worker:JobTask'); s('cron_at_scale.beat:Scheduler');"
            "import cron_at_scale.scheduling;"
            "from cron_at_scale.cron import next_fire_times; from cron_at_scale.dispatcher import Dispatcher")
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": f"{ROOT}:{ROOT / 'example_project'}:{ROOT / 'tests'}",
           "PATH": "/usr/bin:/bin", "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup();" + code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_repository_uses_no_old_path():
    old = "|".join(re.escape(name) for name, (_, stays) in compat.MOVED.items() if not stays)
    dotted = re.compile(rf"cron_at_scale[./](?:{old})\b")
    from_package = re.compile(r"from cron_at_scale import ([\w, ]+)")
    moved = {name for name, (_, stays) in compat.MOVED.items() if not stays}

    def old_path_in(line: str) -> bool:
        m = from_package.search(line)
        names = {part.split(" as ")[0].strip() for part in m.group(1).split(",")} if m else set()
        return bool(dotted.search(line)) or bool(names & moved)

    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.sql", "*.toml", "*.ini", "*.cfg"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        if name in ("cron_at_scale/compat.py", "tests/unit/test_compat.py", "docs/upgrading.md") or "/migrations/" in name:
            continue
        for n, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if old_path_in(line) and "cron_at_scale.dlq" not in line:
                hits.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not hits, "old module paths still used:\n" + "\n".join(hits[:40])
