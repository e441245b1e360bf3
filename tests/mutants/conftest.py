"""The mutant suite's session bookkeeping: the outcome of every test run earlier in this session (a
proof that already passed unmutated need not run again unmutated), and the table at the end."""

from __future__ import annotations

import pytest

# nodeid -> {phase: outcome} of every test this session ran (all kinds, not only tests/mutants)
SESSION: dict[str, dict[str, str]] = {}
# one row per mutant run here: id, promise, killers, seconds, cpu seconds, verdict
RESULTS: list[dict] = []


class _SessionOutcomes:
    @staticmethod
    def pytest_runtest_logreport(report):
        SESSION.setdefault(report.nodeid, {})[report.when] = report.outcome


def pytest_configure(config):
    # Registered as a plugin of its own, so that it hears every test's report, not only this folder's.
    if not config.pluginmanager.has_plugin("mutants-session-outcomes"):
        config.pluginmanager.register(_SessionOutcomes(), "mutants-session-outcomes")


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("mutants: each planted bug against its promise's proof")
    head = f"{'id':<3} {'promise':>7} {'seconds':>8} {'cpu s':>6}  {'verdict':<9} killed by"
    tr.write_line(head)
    tr.write_line("-" * 100)
    for r in RESULTS:
        tr.write_line(f"{r['id']:<3} {r['promise']:>7} {r['seconds']:>8.1f} {r['cpu']:>6.1f}  {r['verdict']:<9} "
                      + ", ".join(r["killers"]))
    total = sum(r["seconds"] for r in RESULTS)
    tr.write_line(f"{len(RESULTS)} mutants, {total:.0f} s of runs (baseline: {RESULTS[0].get('baseline_s', 0):.0f} s)")


@pytest.fixture(scope="session")
def session_outcomes():
    return SESSION
