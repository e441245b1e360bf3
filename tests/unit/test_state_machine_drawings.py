"""docs/state_machine.md's drawings say what its tables say: every edge drawn is a row of the table.

An edge is ``A ──label──► B`` on one line of a drawing (``A`` may be a box corner, when the edge
leaves a vertical line); its label names statements. For each statement named, the table of the
same section has a row from ``A`` (when ``A`` is a state) to ``B`` that names that statement.
"""

from __future__ import annotations

import re
from pathlib import Path

from cron_at_scale.models import Outcome, Status
from cron_at_scale.sql import QUERIES

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "state_machine.md").read_text()
STATES = set(Status.values) | set(Outcome.values)
EDGE = re.compile(r"(?:(\w+)\s+)?[├└┌┘│ ]*─+(?!►)([^─►◄]+?)─+►\s*(?=(\w+))")


def sections() -> list[tuple[str, list[str], list[tuple[set[str], set[str], str]]]]:
    """(title, drawing lines, table rows as (from states, to states, statement cell)) per ## section."""
    out = []
    for part in re.split(r"^## ", PAGE, flags=re.M)[1:]:
        title = part.splitlines()[0]
        drawing = "\n".join(re.findall(r"```\n(.*?)```", part, re.S)).splitlines()
        rows = []
        for line in part.splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cols) == 4 and cols[0] not in ("from", "---"):
                src = set(re.findall(r"`(\w+)`", cols[0]))
                dst = set(re.findall(r"`(\w+)`", cols[1])) or (src if "(same)" in cols[1] else set())
                rows.append((src, dst, cols[2]))
        out.append((title, drawing, rows))
    return out


def edges(drawing: list[str]) -> list[tuple[str | None, str, str]]:
    found = []
    for line in drawing:
        for m in EDGE.finditer(line):
            src = m.group(1) if m.group(1) in STATES else None
            if m.group(3) in STATES:
                found.append((src, m.group(2).strip(), m.group(3)))
    return found


def test_every_drawn_edge_is_a_row_of_its_table():
    checked, wrong = 0, []
    for title, drawing, rows in sections():
        for src, label, dst in edges(drawing):
            for statement in (w for w in re.findall(r"\w+", label) if w in QUERIES):
                checked += 1
                if not any(dst in to and (src is None or src in frm or not frm) and re.search(rf"`{statement}`", cell)
                           for frm, to, cell in rows):
                    wrong.append(f"{title}: {src or '…'} ──{statement}──► {dst}")
    assert checked >= 12, f"only {checked} drawn edges found: the drawings' shape changed"
    assert not wrong, "drawn in docs/state_machine.md but no row of its table says so:\n" + "\n".join(wrong)
