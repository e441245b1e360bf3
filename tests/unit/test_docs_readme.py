"""The README's map of the code names every module of the package, and only modules that exist.

The map is the table under "The map: every module, by room": a row per folder (its first cell,
a path under the repository), its modules named in backticks in the second cell. Package faces
(an ``__init__.py`` below the top) and migrations are not listed one by one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cron_at_scale"


def mapped() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### The map: every module, by room", 1)[1].split("\n\n| outside", 1)[0]
    names = set()
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 2 and cols[0].startswith("`cron_at_scale/"):
            folder = cols[0].strip("`")
            names |= {folder + name for name in re.findall(r"`([\w.]+\.(?:py|sql))`", cols[1])}
    return names


def modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix not in (".py", ".sql") or "/migrations/" in rel or "__pycache__" in rel:
            continue
        if path.name == "__init__.py" and path.parent != PACKAGE and path.parent.name != "sql":
            continue  # a package's face
        found.add(rel)
    return found


def test_the_map_names_every_module():
    missing = sorted(modules() - mapped())
    assert not missing, f"README.md's map of the code does not name: {missing}"


def test_the_map_names_no_module_that_is_gone():
    gone = sorted(mapped() - modules())
    assert not gone, f"README.md's map of the code names modules that do not exist: {gone}"


def test_the_map_was_read():
    assert len(mapped()) > 60
