"""Each promise's proof can fail: the bug the promise rules out, planted in a copy of the package,
makes the tests of its proof fail (docs/guarantees.md names the mutants each proof kills).

Per mutant (``table.py``): the repository is copied to a temp dir, the bug planted, and the killers run
there by pytest in a subprocess, with the copy first on every process's import path (``runner.py``
checks that each process, the workers and dispatchers the tests start included, imported the copy).
The mutant is killed when that run exits 1 (tests failed) and each killer failed in its call; a
collection or usage error (exit 2-5), pytest failing to start, a setup error, or a killer that passed
fails this test with the output. A killer must pass unmutated: earlier in this session, or else in
one unmutated copy run first for all of them, so a proof that fails anyway kills nothing.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from mutants import runner
from mutants.conftest import RESULTS, SESSION
from mutants.table import BY_ID, MUTANTS, WORKER_SQL, Edit, Mutant

RUN_TIMEOUT = 400.0  # seconds for one run of a mutant's killers (the slowest takes ~60 s on a loaded box)


def test_every_mutant_is_planted_in_todays_source():
    """A refactor that moves a mutant's text makes it stale: it would plant nothing."""
    problems = [p for m in MUTANTS for p in runner.stale(m)]
    assert not problems, "\n".join(problems)


def test_every_killer_is_a_test_that_exists():
    missing = []
    for m in MUTANTS:
        for killer in m.killers:
            path, _, name = killer.partition("::")
            source = runner.REPO / path
            if not source.is_file() or not re.search(rf"^def {re.escape(name)}\(", source.read_text(), re.MULTILINE):
                missing.append(f"mutant {m.id}: {killer}")
    assert not missing, missing


def test_the_table_is_well_formed():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), ids
    for m in MUTANTS:
        assert m.edits and m.killers and m.what, m.id
        assert all(e.file.startswith("cron_at_scale/") and e.old != e.new for e in m.edits), m.id


def _selected_mutants(session) -> list[Mutant]:
    ids = {item.callspec.params["mutant"].id for item in session.items
           if item.originalname == "test_the_proof_of_its_promise_fails_on_the_planted_bug"}
    return [m for m in MUTANTS if m.id in ids]


class Baseline:
    """Whether each killer passes unmutated, and why not."""

    def __init__(self):
        self.run: runner.Run | None = None
        self.seconds = 0.0

    def verdict(self, killer: str) -> tuple[str, str]:
        """("passed" | "skipped" | "failed", detail)."""
        earlier = {n: o for n, o in SESSION.items() if n == killer or n.startswith(killer + "[")}
        if earlier and all(set(o.values()) == {"passed"} for o in earlier.values()):
            return "passed", "earlier in this session"
        if self.run is not None and self.run.passed(killer):
            return "passed", "in an unmutated copy"
        cases = self.run.matching(killer) if self.run is not None else earlier
        if cases and all("skipped" in o.values() for o in cases.values()):
            return "skipped", f"{killer} skips here"
        where = "in an unmutated copy" if self.run is not None else "earlier in this session"
        tail = self.run.tail() if self.run is not None else ""
        return "failed", f"{killer} does not pass unmutated ({where}): {cases}\n{tail}"


@pytest.fixture(scope="session")
def baseline(request) -> Baseline:
    """Runs, in one unmutated copy, the killers of the selected mutants that did not pass earlier in
    this session (the main suite runs most of them before tests/mutants)."""
    base = Baseline()
    killers = sorted({k for m in _selected_mutants(request.session) for k in m.killers})
    todo = [k for k in killers if base.verdict(k)[0] != "passed"]
    if todo:
        tmp = Path(tempfile.mkdtemp(prefix="cas-mutant-base-"))
        try:
            copy = runner.make_copy(tmp / "repo")
            base.run = runner.run_tests(copy, todo, timeout=RUN_TIMEOUT * 2)
            base.seconds = base.run.seconds
            problems = runner.import_problems(base.run, copy, ("celery", "cron_dispatcher")
                                              if any(k.startswith(("tests/faults", "tests/acceptance")) for k in todo)
                                              else ())
            assert not problems, f"the unmutated copy did not run as itself: {problems}\n{base.run.tail()}"
            if base.run.code not in (0, 1):
                pytest.fail(f"the unmutated run of {todo} ended with exit code {base.run.code}:\n{base.run.tail()}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"[mutants] baseline: {len(todo)} killers run unmutated in {base.seconds:.1f} s")
    return base


@pytest.mark.mutants
@pytest.mark.timeout(2 * RUN_TIMEOUT + 120)  # the first one also waits for the baseline run
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_the_proof_of_its_promise_fails_on_the_planted_bug(mutant: Mutant, baseline: Baseline):
    for killer in mutant.killers:
        verdict, detail = baseline.verdict(killer)
        if verdict == "skipped":
            pytest.skip(f"mutant {mutant.id}: {detail}")
        assert verdict == "passed", f"mutant {mutant.id}: a proof that fails unmutated kills nothing: {detail}"
    j = runner.judge(mutant, RUN_TIMEOUT)
    run = j.run
    RESULTS.append({"id": mutant.id, "promise": mutant.promise, "killers": list(mutant.killers),
                    "seconds": run.seconds, "cpu": run.cpu_seconds, "verdict": j.verdict,
                    "baseline_s": baseline.seconds})
    print(f"[mutants] {mutant.id} (promise {mutant.promise}) {j.verdict} by {', '.join(mutant.killers)} "
          f"in {run.seconds:.1f} s (cpu {run.cpu_seconds:.1f} s): {run.first_error()[:200]}")
    assert not j.import_problems, f"mutant {mutant.id}: the run did not run the mutant: {j.import_problems}\n{run.tail()}"
    assert run.code in (0, 1) and j.verdict != "not run", (
        f"mutant {mutant.id}: pytest ended with exit code {run.code}, {j.verdict} (not test failures: a "
        f"collection or usage error, a timeout, or pytest failed to start):\n{run.tail()}")
    assert not j.survived, (f"mutant {mutant.id} ({mutant.what}) survived: these proofs did not fail: {j.survived}; "
                            f"outcomes {[run.matching(k) for k in j.survived]}\n{run.tail()}")
    assert j.verdict == "killed"


# -- the judge itself can fail: a harmless edit survives, a broken package is no kill, a child that
# -- imports another package is caught (each with a fast killer)

_FAST = "tests/integration/test_sql.py::test_a_start_before_its_fire_at_by_the_database_clock_is_refused_and_says_how_early"
_REAL_WORKER = "tests/acceptance/test_dispatcher_loop.py::test_a_job_cancelled_after_its_claim_is_skipped_and_recorded"


@pytest.mark.mutants
def test_a_harmless_edit_survives():
    harmless = Mutant("harmless", 4, "a comment changed", (Edit(WORKER_SQL, "-- Nothing starts before its scheduled_at",
                                                                 "-- Nothing at all starts before its scheduled_at"),),
                      (_FAST,))
    j = runner.judge(harmless, RUN_TIMEOUT)
    assert j.verdict == "survived" and j.survived == [_FAST] and j.run.code == 0, (j.verdict, j.run.tail())


@pytest.mark.mutants
def test_a_package_that_does_not_import_is_not_a_kill():
    broken = Mutant("broken", 4, "a syntax error", (Edit("cron_at_scale/sql/__init__.py", "import functools\n",
                                                         "import functools(\n"),), (_FAST,))
    j = runner.judge(broken, RUN_TIMEOUT)
    # pytest-django imports the package at start: pytest fails to start (exit 1, no test run)
    assert j.verdict in ("not run", "exit 2", "exit 3", "exit 4", "exit 5") and not j.run.failed(_FAST), (
        j.verdict, j.run.tail())


@pytest.mark.mutants
def test_a_child_that_imports_the_real_package_is_caught():
    # The cancel bug planted, but the workers the killer starts get the real repository first on their
    # path: they run the real package, the killer passes, and the judge must say why.
    cancel = BY_ID["G"]

    def real_package_first(copy: Path) -> None:
        path = copy / "example_project" / "demo" / "runner.py"
        text = path.read_text()
        old = "PYTHONPATH=os.pathsep.join([str(REPO_DIR), "
        assert old in text
        path.write_text(text.replace(old, f"PYTHONPATH=os.pathsep.join([{str(runner.REPO)!r}, str(REPO_DIR), "))

    j = runner.judge(cancel, RUN_TIMEOUT, tamper=real_package_first)
    assert j.verdict == "not planted", (j.verdict, j.import_problems, j.run.tail())
    assert any("celery" in p for p in j.import_problems), j.import_problems
