"""docs/state_machine.md says what the code does: every statement the page names exists in
cron_at_scale/sql/*.sql, every status or outcome the statements write or test is one of the models'
choices, and every edge its drawings show is a row of its tables.

An edge is ``A ──label──► B`` on one line of a drawing (``A`` may be a box corner, when the edge
leaves a vertical line); its label names statements. For each statement named, the table of the
same section has a row from ``A`` (when ``A`` is a state) to ``B`` that names that statement.
"""

from __future__ import annotations

import re
from pathlib import Path

from cron_at_scale.models import Outcome, ScheduleType, Status
from cron_at_scale.sql import QUERIES

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "state_machine.md").read_text()


def _statement_cells() -> list[str]:
    cells = []
    for line in PAGE.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cols) == 4 and cols[2] not in ("statement", "---"):
            cells.append(cols[2])
    return cells


def test_every_statement_the_page_names_is_in_queries_sql():
    cells = _statement_cells()
    assert len(cells) > 20, "the page's tables were not found"
    named = {name for cell in cells if "*ORM" not in cell and "*SQL" not in cell
             for name in re.findall(r"`(\w+)`", cell)}
    # `done`, `completed`: CTEs of start_attempt, named by the page as such
    ctes = {"done", "completed", "logged", "status"}
    missing = sorted(n for n in named - ctes if n not in QUERIES)
    assert not missing, f"docs/state_machine.md names statements that cron_at_scale/sql/*.sql does not have: {missing}"


def test_every_status_and_outcome_literal_in_queries_sql_is_a_model_choice():
    allowed = {"status": set(Status.values), "outcome": set(Outcome.values), "schedule_type": set(ScheduleType.values)}
    found = 0
    for name, text in QUERIES.items():
        for column, choices in allowed.items():
            # column = 'x', column <> 'x', column IN ('x', 'y'), and CASE ... THEN 'x' written to that column
            for m in re.finditer(rf"\b{column}\s*(?:=|<>|!=)\s*'(\w+)'", text):
                found += 1
                assert m.group(1) in choices, f"{name}: {column} = '{m.group(1)}' is not a {column} choice"
            for m in re.finditer(rf"\b{column}\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", text):
                for lit in re.findall(r"'(\w+)'", m.group(1)):
                    found += 1
                    assert lit in choices, f"{name}: {column} IN (... '{lit}' ...) is not a {column} choice"
            for m in re.finditer(rf"\b{column}\s*=\s*CASE\b(.*?)\bEND\b", text, re.S):
                for lit in re.findall(r"THEN\s+'(\w+)'|ELSE\s+'(\w+)'", m.group(1)):
                    value = lit[0] or lit[1]
                    found += 1
                    assert value in choices, f"{name}: {column} set to '{value}', not a {column} choice"
    assert found > 30


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
