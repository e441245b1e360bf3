"""Pickup of a job due now: where the milliseconds go between ``schedule_many()`` returning and its start.

    python bench/pickup.py                         # 100 and 250 jobs/s, 20 s each
    python bench/pickup.py --rates 100 --duration 5 --workers 1 --concurrency 2

Starts one real ``cron_dispatcher`` (``bench/pickup.py --role dispatcher``: the command itself,
with the probes of ``bench/pickup_probe.py`` around its wake-up, claim and publish) and
``--workers`` real ``celery worker`` processes (prefork, ``--concurrency`` children each). Then
schedules jobs due now (no ``at``) with ``schedule_many`` at a fixed rate, in calls of 1 to
``--batch-max`` jobs (random sizes, spaced so that the rate holds). Per job, on this host's
``time.time()`` (every process runs on this host), the time of each hop:

    scheduled    schedule_many() returned (its transaction committed, the NOTIFY sent)
    woke         the dispatcher's LISTEN connection returned a notification (absent: a poll, or a
                 claim right after a full one)
    claim_start  the claim began; claimed: its transaction committed
    published    the publish to the broker returned
    received     the worker's parent took the message (Celery's task_received)
    prerun       a pool child began it (Celery's task_prerun)
    started      the start statement returned (start_attempt, synchronous commit: promise 1)
    body         the task's body ran

Prints p50/p99/max of each hop and of the total (scheduled -> body, the figure the issue's
harness measured), per rate; one JSON line on stdout. No timed asserts. TRUNCATEs the job tables
of ``DATABASE_URL``: never point it at a database you care about.

``--plain`` measures the floor the same way: plain Celery tasks sent with ``send_task`` (what a
user would call instead, no database on the path) at the same rate, in the same calls of 1 to
``--batch-max``, to the same workers; ``scheduled`` is then each task's own ``send_task`` returning,
and the hops are scheduled -> received -> prerun -> body.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("CRON_AT_SCALE_DATA_DIR", str(ROOT / ".demo-data"))

HOPS = ("scheduled", "woke", "claim_start", "claimed", "published", "received", "prerun", "started", "body")
PLAIN_HOPS = ("scheduled", "received", "prerun", "body")
TASK = "bench.pickup"


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["bench", "dispatcher"], default="bench", help=argparse.SUPPRESS)
    p.add_argument("--rates", default="100,250", help="jobs/s, comma-separated (100,250)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of scheduling per rate (20)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds scheduled first at each rate, not counted (2)")
    p.add_argument("--batch-max", type=int, default=10, help="jobs per schedule_many call: 1 to this (10)")
    p.add_argument("--workers", type=int, default=2, help="celery worker processes (2)")
    p.add_argument("--concurrency", type=int, default=1, help="prefork children per worker (1)")
    p.add_argument("--worker-args", default="", help="more celery worker options, e.g. '-O fair'")
    p.add_argument("--dispatcher-args", default="", help="more cron_dispatcher options, e.g. '--poll-interval 0.1'")
    p.add_argument("--plain", action="store_true",
                   help="the baseline: plain Celery send_task, no dispatcher, no database")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def run_dispatcher(argv: list[str]) -> None:
    """The ``cron_dispatcher`` command, in this process, with the probes installed."""
    import django

    django.setup()
    from django.core.management import call_command

    from bench.pickup_probe import install_dispatcher_probes

    install_dispatcher_probes()
    call_command("cron_dispatcher", *argv)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def read_probes(path: Path) -> dict[str, dict[str, float]]:
    """{job id: {hop: time}}; a hop seen twice for a job keeps its first time."""
    jobs: dict[str, dict[str, float]] = {}
    for f in path.glob("*.log"):
        for line in f.read_text().splitlines():
            hop, job, at = line.split()
            if hop != "loop":
                jobs.setdefault(job, {}).setdefault(hop, float(at))
    return jobs


def loop_spans(path: Path) -> dict[str, dict]:
    """The dispatcher loop's other work (calls of 0.5 ms or more): count, p50, max (ms)."""
    spans: dict[str, list[float]] = {}
    for f in path.glob("*.log"):
        for line in f.read_text().splitlines():
            hop, name, ms = line.split()
            if hop == "loop":
                spans.setdefault(name, []).append(float(ms))
    return {name: {"n": len(v), "p50": round(statistics.median(v), 2), "max": round(max(v), 2)}
            for name, v in spans.items()}


def hop_table(jobs: dict[str, dict[str, float]], plain: bool = False) -> dict[str, dict]:
    """p50/p99/max (ms) of each hop, from the hop before it that the job has, and of the total."""
    hops = list(PLAIN_HOPS) if plain else [h for h in HOPS if h != "woke"]
    out: dict[str, dict] = {}
    spans: dict[str, list[float]] = {}
    for t in jobs.values():
        if not all(h in t for h in hops):
            continue
        chain = hops
        if not plain and t["started"] <= t["prerun"]:  # BATCH_STARTS: started by the worker's parent, before a pool child
            chain = [h for h in hops if h != "started"]
            chain.insert(chain.index("prerun"), "started")
        for a, b in zip(chain, chain[1:], strict=False):
            spans.setdefault(f"{a} -> {b}", []).append((t[b] - t[a]) * 1000)
        if "woke" in t:  # the notification's share of scheduled -> claim_start
            spans.setdefault("scheduled -> woke (woken jobs)", []).append((t["woke"] - t["scheduled"]) * 1000)
            spans.setdefault("woke -> claim_start (woken jobs)", []).append((t["claim_start"] - t["woke"]) * 1000)
        spans.setdefault("total: scheduled -> body", []).append((t["body"] - t["scheduled"]) * 1000)
        if not plain:
            spans.setdefault("scheduled -> started", []).append((t["started"] - t["scheduled"]) * 1000)
    for name, v in spans.items():
        out[name] = {"n": len(v), "p50": round(statistics.median(v), 2), "p99": round(pct(v, 0.99), 2),
                     "max": round(max(v), 2)}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role == "dispatcher":
        run_dispatcher(args.dispatcher_args.split())
        return 0
    import django

    django.setup()
    from demo.runner import PROJECT_DIR, Processes, child_env, database_url, wait_for_workers
    from django.core.management import call_command
    from django.db import connection

    from bench import pickup_probe  # noqa: F401  (registers the task in this process too)
    from cron_at_scale import schedule_many
    from cron_at_scale.celery_app import get_app

    call_command("migrate", verbosity=0)
    app = get_app()
    probe_dir = Path(tempfile.mkdtemp(prefix="pickup-"))
    from django.conf import settings

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL, PICKUP_PROBE_DIR=str(probe_dir))
    procs = Processes(env, log_dir=ROOT / "bench" / "results" / "logs")
    names = [f"pickup-w{i}" for i in range(args.workers)]
    rng = random.Random(args.seed)
    results: dict = {"clock": "this host's time.time()", "workers": args.workers, "concurrency": args.concurrency,
                     "worker_args": args.worker_args, "dispatcher_args": args.dispatcher_args,
                     "path": "plain Celery send_task" if args.plain else "schedule_many", "rates": {}}
    try:
        for name in names:
            procs.worker(name, concurrency=args.concurrency, extra=["--include", "bench.pickup_probe",
                                                                   *args.worker_args.split()])
        wait_for_workers(app, names)
        with connection.cursor() as cur:
            cur.execute("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
        if not args.plain:
            d_args = [sys.executable, str(ROOT / "bench" / "pickup.py"), "--role", "dispatcher",
                      "--dispatcher-args", f"--name pickup-d -v 0 {args.dispatcher_args}"]
            with open(ROOT / "bench" / "results" / "logs" / "pickup-d.log", "ab") as out:
                procs.procs.append(subprocess.Popen(d_args, cwd=PROJECT_DIR, env=env, stdout=out,
                                                    stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(3)  # the dispatcher connects, takes its shards, LISTENs
        for per_s in [int(r) for r in args.rates.split(",")]:
            for f in probe_dir.glob("*.log"):
                f.write_text("")  # truncated in place: each process keeps appending to its own file
            mine = open(probe_dir / f"bench-{per_s}.log", "a", buffering=1)  # noqa: SIM115
            counted: list[str] = []
            t_start = time.monotonic()
            sent = 0
            total = int(per_s * (args.warmup + args.duration))
            while sent < total:
                k = min(rng.randint(1, args.batch_max), total - sent)
                at = t_start + sent / per_s  # when this call is due, to hold the rate
                pause = at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                if args.plain:  # each task's own send returned
                    stamped = [(app.send_task(pickup_probe.PLAIN).id, time.time()) for _ in range(k)]
                else:  # every job of the call is visible at once, when its transaction commits
                    ids = [str(j.id) for j in schedule_many([{"task": TASK}] * k)]
                    done = time.time()
                    stamped = [(j, done) for j in ids]
                if sent >= per_s * args.warmup:
                    counted += [j for j, _ in stamped]
                    mine.write("".join(f"scheduled {j} {at:.6f}\n" for j, at in stamped))
                sent += k
            behind = time.monotonic() - t_start - total / per_s
            mine.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = read_probes(probe_dir)
                if sum(1 for j in counted if "body" in got.get(j, {})) >= len(counted):
                    break
                time.sleep(0.5)
            got = read_probes(probe_dir)
            jobs_seen = {j: got[j] for j in counted if j in got}
            table = hop_table(jobs_seen, plain=args.plain)
            woken = sum(1 for t in jobs_seen.values() if "woke" in t)
            loop = loop_spans(probe_dir)
            results["rates"][per_s] = {"jobs": len(counted), "ran": sum(1 for t in jobs_seen.values() if "body" in t),
                                       "woken_by_notify": woken, "behind_s": round(behind, 3), "hops": table,
                                       "dispatcher_loop": loop}
            say(f"\n{results['path']}: {per_s} jobs/s, {len(counted)} jobs ({results['rates'][per_s]['ran']} ran, {woken} claimed "
                f"right after a NOTIFY; the scheduler {behind * 1000:.0f} ms behind its rate at the end); "
                f"ms on this host's clock")
            say(f"  {'hop':42s} {'p50':>8s} {'p99':>8s} {'max':>8s}")
            for name, s in table.items():
                say(f"  {name:42s} {s['p50']:8.2f} {s['p99']:8.2f} {s['max']:8.2f}")
            for name, s in loop.items():
                say(f"  dispatcher loop, {name}: {s['n']} calls of 0.5 ms or more, p50 {s['p50']:.2f} max {s['max']:.2f} ms")
            time.sleep(1)
            with connection.cursor() as cur:
                cur.execute("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
    finally:
        procs.stop()
        shutil.rmtree(probe_dir, ignore_errors=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
