"""docs/guarantees.md held to tests/mutants: every promise names the mutants its proof kills, every
mutant named there is in the table (for that promise), every mutant of the table is named by its
promise, and the promise's text cites the test files that kill them."""

from __future__ import annotations

import re
from pathlib import Path

from mutants.table import BY_ID, MUTANTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "guarantees.md"
_MUTANTS_LINE = re.compile(r"^\s*\*Mutants:\*\s*(.+?)\s*\(`tests/mutants`\)\.?\s*$", re.MULTILINE)


def promises() -> dict[int, str]:
    """Promise number -> its paragraph, from the page's "The promises" section."""
    section = DOC.read_text().split("## The promises", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^(\d+)\. \*\*", section, flags=re.MULTILINE)
    return {int(number): text for number, text in zip(parts[1::2], parts[2::2], strict=True)}


def named(text: str) -> list[str]:
    lines = _MUTANTS_LINE.findall(text)
    assert len(lines) <= 1, f"more than one *Mutants:* line: {lines}"
    return [m.strip() for m in lines[0].split(",")] if lines else []


def test_the_page_has_its_promises():
    assert sorted(promises()) == list(range(1, len(promises()) + 1)) and len(promises()) >= 8


def test_every_promise_names_the_mutants_its_proof_kills():
    problems = []
    for number, text in promises().items():
        ids = named(text)
        if not ids:
            problems.append(f"promise {number} names no mutant (a '*Mutants:* A, B (`tests/mutants`).' line)")
        for mid in ids:
            mutant = BY_ID.get(mid)
            if mutant is None:
                problems.append(f"promise {number} names mutant {mid!r}, which tests/mutants/table.py does not have")
            elif mutant.promise != number:
                problems.append(f"promise {number} names mutant {mid}, which the table gives to promise {mutant.promise}")
    assert not problems, "\n".join(problems)


def test_every_mutant_is_named_by_its_promise_which_cites_its_killers():
    texts = promises()
    problems = []
    for m in MUTANTS:
        text = texts.get(m.promise, "")
        if m.id not in named(text):
            problems.append(f"mutant {m.id} (promise {m.promise}) is not named in that promise's *Mutants:* line")
        for killer in m.killers:
            if killer.split("::", 1)[0] not in text:
                problems.append(f"promise {m.promise} does not cite {killer.split('::', 1)[0]}, which kills mutant {m.id}")
    assert not problems, "\n".join(problems)
