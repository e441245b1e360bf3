"""CPU cost of ``cron.next_fire_times`` per call, A/B: another revision's cron.py against this one.

    .venv/bin/python bench/cron_ab.py                 # A = main's cron.py, B = the working tree's
    .venv/bin/python bench/cron_ab.py --base HEAD~3 --turns 10 --calls 20000

Both modules are loaded side by side (A from ``git show BASE:cron_at_scale/cron.py``) and timed in
alternating turns in one process, so machine load hits both alike. Prints CPU microseconds per call
(``time.process_time``: this process's CPU seconds, as /proc/self/stat counts them) for each
expression: the median over turns, A then B, and B/A. Expressions A cannot parse are timed for B only.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPRESSIONS = [
    ("*/5 * * * *", "America/New_York", 1),   # the claim's advance of a typical job
    ("*/5 * * * *", "America/New_York", 256),  # a catch-up chunk (recurrence._CHUNK)
    ("0 9 * * 1-5", "Europe/Berlin", 1),
    ("0 0 L * *", "Europe/Berlin", 1),
    ("0 0 LW * *", "UTC", 12),
    ("0 9 * * 2#2", "America/New_York", 1),
    ("0 2 * * 5L", "America/New_York", 12),
]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses looks the module up while building CronExpr
    spec.loader.exec_module(module)
    return module


def per_call(mod, expr: str, tz: str, n: int, calls: int) -> float:
    after = datetime(2024, 5, 5, 12, 3, tzinfo=timezone.utc)
    fn = mod.next_fire_times
    fn(expr, tz, after, n)  # parse cache and zone warm
    started = time.process_time()
    for _ in range(calls):
        fn(expr, tz, after, n)
    return (time.process_time() - started) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="git revision of A (default main)")
    ap.add_argument("--turns", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000, help="calls per turn and expression")
    args = ap.parse_args()
    source = subprocess.run(["git", "show", f"{args.base}:cron_at_scale/cron.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        a_path = Path(tmp) / "cron_a.py"
        a_path.write_text(source, encoding="utf-8")
        a = load("cron_a", a_path)
        b = load("cron_b", ROOT / "cron_at_scale" / "cron.py")
        print(f"A = {args.base}:cron_at_scale/cron.py, B = working tree; {args.turns} turns x {args.calls} calls; "
              "CPU us/call, median")
        print(f"{'expression':<16} {'zone':<17} {'n':>4} {'A':>9} {'B':>9} {'B/A':>6}")
        for expr, tz, n in EXPRESSIONS:
            try:
                a.parse(expr)
                a_ok = True
            except ValueError:
                a_ok = False
            ta: list[float] = []
            tb: list[float] = []
            for turn in range(args.turns):
                order = [(a, ta), (b, tb)] if turn % 2 == 0 else [(b, tb), (a, ta)]
                for mod, out in order:
                    if mod is a and not a_ok:
                        continue
                    out.append(per_call(mod, expr, tz, n, max(1, args.calls // n)))
            mb = statistics.median(tb)
            if a_ok:
                ma = statistics.median(ta)
                print(f"{expr:<16} {tz:<17} {n:>4} {ma:>9.2f} {mb:>9.2f} {mb / ma:>6.3f}")
            else:
                print(f"{expr:<16} {tz:<17} {n:>4} {'refused':>9} {mb:>9.2f} {'':>6}")


if __name__ == "__main__":
    main()
