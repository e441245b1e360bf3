"""Firing from one database against firing from two (``SHARD_DATABASES``), in turns: jobs/s and CPU per
job of the dispatchers and of PostgreSQL's backends, from /proc.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x CELERY_BROKER_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python bench/sharded.py --jobs 50000 --turns 3 [--second-url postgres://...:5499/x]

Two databases, ``bench_shard_a`` and ``bench_shard_b``, on DATABASE_URL's server (or the second on
``--second-url``'s, another cluster). Each turn runs both modes, one then two (A B A B):

* one: every shard on ``bench_shard_a``; two ``cron_dispatcher`` processes share its 64 shards by lease;
* two: shards 0-31 on ``bench_shard_a``, 32-63 on ``bench_shard_b``; one ``cron_dispatcher --database``
  for each.

The dispatchers start first and idle; then ``schedule_many`` writes ``--jobs`` jobs due now and the
clock runs until every message is on the Redis queue (no worker: the messages are counted). CPU per
job: the dispatcher processes' and their PostgreSQL backends' user+system time over that span (the
scheduling call's own backend excluded). Each mode runs in a process of its own with its settings
(``tests.settings`` / ``tests.settings_sharded``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
DBS = ("bench_shard_a", "bench_shard_b")
TICK = os.sysconf("SC_CLK_TCK")


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def cpu(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> list[int]:
    out = [pid]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out += tree(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def child(mode: str, jobs: int) -> None:
    """One measurement, in a process configured for ``mode``; prints one JSON line."""
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    import cron_at_scale
    from cron_at_scale import conf

    homes = conf.shard_aliases()
    for alias in homes:
        call_command("migrate", database=alias, verbosity=0)
        with connections[alias].cursor() as cur:
            cur.execute("TRUNCATE cron_at_scale_job, cron_at_scale_jobattempt, cron_at_scale_shardlease, "
                        "cron_at_scale_dispatcherheartbeat")
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("celery")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project"), str(ROOT / "tests")])}
    args = [[f"--database={a}"] for a in homes] if len(homes) > 1 else [[], []]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "example_project" / "manage.py"), "cron_dispatcher", "-v", "0",
                               "--name", f"bench-{mode}-{i}", *extra], env=env, cwd=ROOT / "example_project",
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i, extra in enumerate(args)]
    try:
        def backends() -> list[int]:
            pids = []
            for alias in homes:
                with connections[alias].cursor() as cur:
                    cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
                    pids += [r[0] for r in cur.fetchall()]
            return pids

        deadline = time.monotonic() + 60
        while len(backends()) < len(procs) and time.monotonic() < deadline:  # each dispatcher connected
            time.sleep(0.2)
        time.sleep(2.0)  # settled: shard leases taken, first idle polls done
        mine = {pid for alias in homes for pid in [connections[alias].cursor().connection.info.backend_pid]}
        watched = [p for proc in procs for p in tree(proc.pid)] + [p for p in backends() if p not in mine]
        before = {p: cpu(p) for p in watched}
        t0 = time.monotonic()
        cron_at_scale.schedule_many([{"task": "demo.tasks.noop", "args": [i]} for i in range(jobs)])
        while broker.llen("celery") < jobs:
            if time.monotonic() - t0 > 600:
                raise SystemExit(f"{mode}: only {broker.llen('celery')} of {jobs} messages after 600 s")
            time.sleep(0.02)
        took = time.monotonic() - t0
        dispatchers = sum(cpu(p) - before[p] for proc in procs for p in tree(proc.pid) if p in before)
        postgres = sum(cpu(p) - before[p] for p in watched if p in before) - dispatchers
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    print(json.dumps({"mode": mode, "jobs": jobs, "seconds": took, "jobs_per_s": jobs / took,
                      "dispatcher_ms_per_job": 1000 * dispatchers / jobs, "postgres_ms_per_job": 1000 * postgres / jobs,
                      "messages": broker.llen("celery")}))
    broker.delete("celery")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--second-url", help="the second database's server (default: DATABASE_URL's)")
    parser.add_argument("--child", choices=["one", "two"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.jobs)
    url = os.environ["DATABASE_URL"]
    import psycopg2

    for base, name in ((url, DBS[0]), (args.second_url or url, DBS[1])):
        conn = psycopg2.connect(with_db(base, "postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if not cur.fetchone():
                cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
    env = {**os.environ, "DATABASE_URL": with_db(url, DBS[0]),
           "SECOND_DATABASE_URL": with_db(args.second_url or url, DBS[1]),
           "CRON_AT_SCALE_SETTINGS": json.dumps({"HOLD_UNCONSUMED_QUEUES": False, "MAX_BROKER_DEPTH": 10**7}),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project"), str(ROOT / "tests")])}
    results: dict[str, list[dict]] = {"one": [], "two": []}
    for turn in range(args.turns):
        for mode, module in (("one", "tests.settings"), ("two", "tests.settings_sharded")):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--jobs", str(args.jobs)],
                                 env={**env, "DJANGO_SETTINGS_MODULE": module}, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{mode}: {out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode].append(row)
            print(f"turn {turn + 1} {mode}: {row['jobs_per_s']:,.0f} jobs/s, dispatchers "
                  f"{row['dispatcher_ms_per_job']:.4f} ms/job, PostgreSQL {row['postgres_ms_per_job']:.4f} ms/job, "
                  f"{row['messages']} messages", flush=True)
    print("| databases | jobs/s, each turn | median | dispatchers CPU ms/job (median) | PostgreSQL CPU ms/job (median) |")
    print("|---|---|---|---|---|")
    for mode, rows in results.items():
        rates = [r["jobs_per_s"] for r in rows]
        print(f"| {mode} | {' / '.join(f'{r:,.0f}' for r in rates)} | {statistics.median(rates):,.0f} | "
              f"{statistics.median(r['dispatcher_ms_per_job'] for r in rows):.4f} | "
              f"{statistics.median(r['postgres_ms_per_job'] for r in rows):.4f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
