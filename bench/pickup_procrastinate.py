"""Pickup of a job due now, with procrastinate instead of cron_at_scale: ``bench/pickup.py``'s total, for comparison.

    pip install procrastinate "psycopg[binary]"   # NOT a dependency of this project: use a scratch venv
    createdb procr_bench                           # the schema is applied on the first run
    PROCRASTINATE_DSN=postgresql://postgres@127.0.0.1:5432/procr_bench \\
        python bench/pickup_procrastinate.py --rates 100,250 --duration 10 --workers 2

Starts ``--workers`` procrastinate worker processes (``--role worker``: ``app.run_worker_async``,
concurrency 1, LISTEN/NOTIFY on, procrastinate's defaults otherwise: 5 s fallback polling). Then
defers jobs due now at a fixed rate, 1 to ``--batch-max`` jobs per ``batch_defer_async`` call (one
statement, one transaction, like ``schedule_many``), and per job, on this host's ``time.time()``:

    scheduled    batch_defer_async() returned (the jobs' INSERT committed, their NOTIFY sent)
    body         the (async) task body began, in the worker process that fetched the job

Prints p50/p99/max of scheduled -> body per rate, and one JSON line on stdout. TRUNCATEs
``procrastinate_jobs`` of ``PROCRASTINATE_DSN``: never point it at a database you care about.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DSN = os.environ.get("PROCRASTINATE_DSN", "postgresql://postgres@127.0.0.1:5432/procr_bench")


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["bench", "worker"], default="bench", help=argparse.SUPPRESS)
    p.add_argument("--probe-dir", help=argparse.SUPPRESS)
    p.add_argument("--name", default="w0", help=argparse.SUPPRESS)
    p.add_argument("--rates", default="100,250", help="jobs/s, comma-separated (100,250)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of deferring per rate (10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds deferred first at each rate, not counted (2)")
    p.add_argument("--batch-max", type=int, default=10, help="jobs per batch_defer_async call: 1 to this (10)")
    p.add_argument("--workers", type=int, default=4, help="procrastinate worker processes, concurrency 1 each (4)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def make_app(probe: Path | None = None):
    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App is instantiated in the main module": harmless
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))
    out = open(probe, "a", buffering=1) if probe else None  # noqa: SIM115

    @app.task(name="pickup", pass_context=True)
    async def pickup(context) -> None:
        out.write(f"body {context.job.id} {time.time():.6f}\n")

    return app, pickup


async def run_worker(args: argparse.Namespace) -> None:
    app, _ = make_app(Path(args.probe_dir) / f"{args.name}.log")
    async with app.open_async():
        await app.run_worker_async(name=args.name, concurrency=1, listen_notify=True)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def read_bodies(path: Path) -> dict[str, float]:
    got: dict[str, float] = {}
    for f in path.glob("*.log"):
        for line in f.read_text().splitlines():
            _, job, at = line.split()
            got.setdefault(job, float(at))
    return got


async def bench(args: argparse.Namespace) -> dict:
    app, pickup = make_app()
    probe_dir = Path(tempfile.mkdtemp(prefix="pickup-procr-"))
    rng = random.Random(args.seed)
    results: dict = {"system": "procrastinate", "clock": "this host's time.time()", "workers": args.workers,
                     "concurrency": 1, "rates": {}}
    procs: list[subprocess.Popen] = []
    async with app.open_async():
        conn = app.connector
        if not (await conn.execute_query_one_async("SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS ok"))["ok"]:
            await app.schema_manager.apply_schema_async()
        await conn.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
        await conn.execute_query_async("DELETE FROM procrastinate_workers")
        try:
            for i in range(args.workers):
                procs.append(subprocess.Popen([sys.executable, __file__, "--role", "worker", "--name", f"w{i}",
                                               "--probe-dir", str(probe_dir)], start_new_session=True))
            deadline = time.monotonic() + 30
            while (await conn.execute_query_one_async("SELECT count(*) AS n FROM procrastinate_workers"))["n"] \
                    < args.workers and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1)  # the workers LISTEN once registered
            for per_s in [int(r) for r in args.rates.split(",")]:
                for f in probe_dir.glob("*.log"):
                    f.write_text("")  # truncated in place: each worker keeps appending to its own file
                scheduled: dict[str, float] = {}
                t_start = time.monotonic()
                sent = 0
                total = int(per_s * (args.warmup + args.duration))
                while sent < total:
                    k = min(rng.randint(1, args.batch_max), total - sent)
                    pause = t_start + sent / per_s - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)
                    ids = await pickup.batch_defer_async(*[{}] * k)
                    done = time.time()
                    if sent >= per_s * args.warmup:
                        scheduled.update((str(j), done) for j in ids)
                    sent += k
                behind = time.monotonic() - t_start - total / per_s
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    got = read_bodies(probe_dir)
                    if all(j in got for j in scheduled):
                        break
                    await asyncio.sleep(0.5)
                got = read_bodies(probe_dir)
                v = [(got[j] - t) * 1000 for j, t in scheduled.items() if j in got]
                row = {"jobs": len(scheduled), "ran": len(v), "behind_s": round(behind, 3),
                       "total": {"p50": round(pct(v, 0.5), 2), "p99": round(pct(v, 0.99), 2),
                                 "max": round(max(v), 2)} if v else None}
                results["rates"][per_s] = row
                say(f"\n{per_s} jobs/s, {len(scheduled)} jobs ({len(v)} ran; the deferrer {behind * 1000:.0f} ms "
                    f"behind its rate at the end); ms on this host's clock")
                say(f"  {'hop':42s} {'p50':>8s} {'p99':>8s} {'max':>8s}")
                if v:
                    t = row["total"]
                    say(f"  {'total: scheduled -> body':42s} {t['p50']:8.2f} {t['p99']:8.2f} {t['max']:8.2f}")
                await asyncio.sleep(1)
                await conn.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            shutil.rmtree(probe_dir, ignore_errors=True)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role == "worker":
        asyncio.run(run_worker(args))
        return 0
    print(json.dumps(asyncio.run(bench(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
