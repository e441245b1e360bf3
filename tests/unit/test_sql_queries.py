"""docs/state_machine.md and queries.sql say the same thing: every statement the page names exists,
and every status or outcome the statements write or test is one of the models' choices."""

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
    assert not missing, f"docs/state_machine.md names statements that queries.sql does not have: {missing}"


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
