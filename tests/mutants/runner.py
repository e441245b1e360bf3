"""Planting a mutant into a copy of the repository and running its proof there.

The copy holds the whole repository but its virtualenv and data (``cron_at_scale/``, ``tests/``,
``example_project/``, ``devservices/``, ...): pytest runs from it, so its rootdir (first on
``sys.path``, the ``pythonpath`` of pyproject.toml) is the copy, and every process the tests start
gets the copy first on its ``PYTHONPATH`` (``demo.runner.child_env`` puts the repository of the
``example_project`` it runs from there; the fault suite's ``faultkit.child_env`` builds on it). The
editable install's finder comes after ``sys.path`` on ``sys.meta_path``, so it never wins.

That is checked, not assumed: the copy's ``cron_at_scale/__init__.py`` gets two lines that append
``pid, __file__, argv`` of every process importing it to a file (``IMPORTS_ENV``). After the run,
every line must name the copy, and the processes the mutant says its killers start (``celery``,
``cron_dispatcher``) must be among them: a child that imported the real package writes nothing and
is missed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from mutants.table import Mutant

REPO = Path(__file__).resolve().parents[2]
IMPORTS_ENV = "CRON_AT_SCALE_MUTANT_IMPORTS"
OUTCOMES_ENV = "CRON_AT_SCALE_MUTANT_OUTCOMES"
PLUGIN = "_mutant_outcomes"  # written into the copy's root, loaded with -p

# Not copied: version control, virtualenvs, the embedded servers' data, caches.
_IGNORE = shutil.ignore_patterns(".git", ".venv*", ".tox", ".test-data", ".demo-data", "__pycache__", "*.pyc",
                                 "*.egg-info", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist")

_INSTRUMENT = f"""

# Planted by tests/mutants/runner.py in a copy of the package: which file each process imports.
if __import__("os").environ.get("{IMPORTS_ENV}"):
    def _mutant_probe():
        import json, os, sys
        line = json.dumps({{"pid": os.getpid(), "file": __file__, "argv": sys.argv}}) + "\\n"
        fd = os.open(os.environ["{IMPORTS_ENV}"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    _mutant_probe()
    del _mutant_probe
"""

_OUTCOMES = f"""import json, os


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        line = json.dumps({{"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}}) + "\\n"
        with open(os.environ["{OUTCOMES_ENV}"], "a") as f:
            f.write(line)
"""


def stale(mutant: Mutant, root: Path = REPO) -> list[str]:
    """Why ``mutant`` cannot be planted in the source under ``root`` (empty: each old text occurs once)."""
    out = []
    for edit in mutant.edits:
        path = root / edit.file
        if not path.is_file():
            out.append(f"mutant {mutant.id}: {edit.file} does not exist")
            continue
        n = path.read_text().count(edit.old)
        if n != 1:
            out.append(f"mutant {mutant.id} is stale: its old text occurs {n} times in {edit.file} (must be once), "
                       f"update tests/mutants/table.py: {edit.old[:120]!r}")
    return out


def make_copy(dest: Path, mutant: Mutant | None = None, src: Path = REPO,
              tamper: Callable[[Path], None] | None = None) -> Path:
    """The repository copied to ``dest`` (no venv, no data), instrumented, with ``mutant`` planted;
    ``tamper(copy)`` changes it further (the self-tests: a copy whose children import another package)."""
    shutil.copytree(src, dest, ignore=_IGNORE, symlinks=True)
    if mutant is not None:
        problems = stale(mutant, dest)
        if problems:
            raise AssertionError("; ".join(problems))
        for edit in mutant.edits:
            path = dest / edit.file
            text = path.read_text()
            path.write_text(text.replace(edit.old, edit.new, 1))
    init = dest / "cron_at_scale" / "__init__.py"
    init.write_text(init.read_text() + _INSTRUMENT)
    (dest / f"{PLUGIN}.py").write_text(_OUTCOMES)
    if tamper is not None:
        tamper(dest)
    return dest


def inner_services() -> dict[str, str]:
    """DATABASE_URL and CELERY_BROKER_URL for the run in the copy: this session's servers, another
    database name (pytest-django makes ``test_<name>``: this session's own test database is left alone)."""
    db_url = os.environ.get("DATABASE_URL", "").strip()
    broker = os.environ.get("CELERY_BROKER_URL", "").strip()
    if not db_url or not broker:
        from demo.runner import database_url  # noqa: PLC0415
        from django.conf import settings  # noqa: PLC0415

        if not db_url:
            params = dict(settings.DATABASES["default"])
            params["NAME"] = params["NAME"].removeprefix("test_")  # pytest-django renamed it in place
            db_url = database_url(params)
        broker = broker or settings.CELERY_BROKER_URL
    parts = urlsplit(db_url)
    name = parts.path.lstrip("/") or "cron_at_scale"
    return {"DATABASE_URL": parts._replace(path=f"/{name}_mutants").geturl(), "CELERY_BROKER_URL": broker}


@dataclass
class Run:
    """One pytest run in a copy: its exit code, each test's outcome, the imports seen, its output."""

    code: int
    seconds: float
    cpu_seconds: float  # of the pytest process and every child it waited for (RUSAGE_CHILDREN)
    output: str
    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)  # nodeid -> {phase: outcome}
    imports: list[dict] = field(default_factory=list)

    def matching(self, killer: str) -> dict[str, dict[str, str]]:
        """The outcomes of ``killer``'s cases (itself, or its parametrized ``killer[...]`` ones)."""
        return {n: o for n, o in self.outcomes.items() if n == killer or n.startswith(killer + "[")}

    def failed(self, killer: str) -> bool:
        """Some case of ``killer`` failed in its call: the assertion, not a setup error."""
        return any(o.get("call") == "failed" for o in self.matching(killer).values())

    def passed(self, killer: str) -> bool:
        """Every case of ``killer`` ran and passed (none skipped, none erred)."""
        cases = self.matching(killer)
        return bool(cases) and all(o.get("call") == "passed" and set(o.values()) == {"passed"}
                                   for o in cases.values())

    def first_error(self) -> str:
        """The first assertion or error line of the output (``E   ...``): why the run failed."""
        return next((ln[1:].strip() for ln in self.output.splitlines() if ln.startswith("E ")), "")

    def tail(self, n: int = 6000) -> str:
        return self.output[-n:]


def run_tests(copy: Path, node_ids: list[str], timeout: float) -> Run:
    """pytest on ``node_ids`` in ``copy``, in a subprocess of this venv's python."""
    work = Path(tempfile.mkdtemp(prefix="run-", dir=copy.parent))
    imports, outcomes = work / "imports.jsonl", work / "outcomes.jsonl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", IMPORTS_ENV, OUTCOMES_ENV)}
    env.update(inner_services())
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *(p for p in [os.environ.get("PYTHONPATH", "")] if p)])
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["CRON_AT_SCALE_DATA_DIR"] = str(work / "data")  # embedded servers (when no URL is set) of its own
    env[IMPORTS_ENV], env[OUTCOMES_ENV] = str(imports), str(outcomes)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, "--no-header",
           "-o", "console_output_style=classic", *node_ids]
    before = os.times()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, output = -1, out + f"\n[mutants] the run did not end within {timeout:.0f} s"
    seconds = time.monotonic() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    run = Run(code, seconds, cpu, output)
    for line in _lines(outcomes):
        run.outcomes.setdefault(line["nodeid"], {})[line["when"]] = line["outcome"]
    run.imports = list(_lines(imports))
    return run


def _lines(path: Path):
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def import_problems(run: Run, copy: Path, spawns: tuple[str, ...]) -> list[str]:
    """Why the run may not have run the copy: an import from elsewhere, or a process said to start
    that never imported the copy (it imported the real package, or never started)."""
    out = []
    root = str(copy.resolve()) + os.sep
    elsewhere = [i for i in run.imports if not str(Path(i["file"]).resolve()).startswith(root)]
    if elsewhere:
        out.append(f"imported from outside the copy: {elsewhere[:3]}")
    if not any("pytest" in " ".join(i["argv"]) for i in run.imports):
        out.append("the pytest process did not import cron_at_scale from the copy")
    for word in spawns:
        if not any(word in " ".join(i["argv"]) for i in run.imports):
            out.append(f"no {word} process imported cron_at_scale from the copy")
    return out


@dataclass
class Judgement:
    """What planting one mutant came to: ``verdict`` is "killed", "survived" (a killer passed),
    "not planted" (a process ran something else than the copy), "exit N" (pytest's exit code
    N other than 0 and 1: a collection or usage error, a timeout) or "not run" (no killer ran:
    pytest itself failed to start, which exits 1 too)."""

    verdict: str
    run: Run
    survived: list[str]  # killers that did not fail in their call
    import_problems: list[str]


def judge(mutant: Mutant, timeout: float, tamper: Callable[[Path], None] | None = None) -> Judgement:
    """Plant ``mutant`` in a fresh copy, run its killers there, and judge the run (the copy is removed)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"cas-mutant-{mutant.id}-"))
    try:
        copy = make_copy(tmp / "repo", mutant, tamper=tamper)  # raises if the mutant is stale
        run = run_tests(copy, list(mutant.killers), timeout=timeout)
        problems = import_problems(run, copy, mutant.spawns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    survived = [k for k in mutant.killers if not run.failed(k)]
    if problems:
        verdict = "not planted"
    elif run.code not in (0, 1):
        verdict = f"exit {run.code}"
    elif not any(run.matching(k) for k in mutant.killers):
        verdict = "not run"  # exit 1 from a traceback before any test ran (pytest itself failed to start)
    else:
        verdict = "killed" if run.code == 1 and not survived else "survived"
    return Judgement(verdict, run, survived, problems)
