"""PostgreSQL's CPU per started task: one ``start_attempt`` per task (the pool process's own start,
carrying the previous task's completion) against ``start_attempts`` for batches of n (the worker's
main process, ``BATCH_STARTS``) plus the completions a pool process then writes on its own.

No Celery: this process runs the workers' statements itself, on claimed (unpublished) jobs, and
reads its PostgreSQL backend's CPU from ``/proc`` before and after (this host's PostgreSQL only).
Turns alternate single and batched. Prints ms of backend CPU per task, then what each way writes
per task: WAL bytes (``pg_current_wal_insert_lsn()`` before and after; nothing else should write
to the server meanwhile) and row versions per table, inserted / updated in place (HOT, no index
entry) / updated with new index entries (in every index of the table whose predicate the row
matches), from ``pg_stat_user_tables``.

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… python bench/start_batch.py --jobs 2400 --turns 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from uuid import uuid4

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project"), str(ROOT / "tests")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

CLK_TCK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2400, help="tasks per measurement (2400)")
    p.add_argument("--turns", type=int, default=2, help="rounds of every measurement, in turn (2)")
    p.add_argument("--batches", default="1,2,3,4,8", help="batch sizes of start_attempts (1,2,3,4,8)")
    p.add_argument("--completions", type=int, default=15,
                   help="completions per statement a pool process writes on its own (15: ~300 tasks/s in 50 ms)")
    a = p.parse_args(argv)

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from helpers import RecordingPublisher

    import cron_at_scale
    from cron_at_scale.dispatcher import Dispatcher
    from cron_at_scale.worker import attempts

    call_command("migrate", verbosity=0)

    def claimed(n: int) -> list[tuple[str, int]]:
        with connection.cursor() as c:
            c.execute("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
        cron_at_scale.schedule_many([{"task": "demo.tasks.noop", "args": [i]} for i in range(n)])
        d = Dispatcher(name="bench", shards="all", publisher=RecordingPublisher(), hold_unconsumed=False)
        runs: list = []
        while len(runs) < n:
            got = d.claim()
            if not got:
                break
            runs += got
        return [(str(r.job_id), r.attempt) for r in runs]

    def pid() -> int:
        with connection.cursor() as c:
            c.execute("SELECT pg_backend_pid()")
            return c.fetchone()[0]

    tables = ("cron_at_scale_job", "cron_at_scale_jobattempt")

    def writes() -> tuple[int, dict[str, tuple[int, int, int]]]:
        if connection.pg_version >= 150000:
            with connection.cursor() as c:  # flushed as the backend goes idle after this statement
                c.execute("SELECT pg_stat_force_next_flush()")
        else:
            time.sleep(1.0)  # the statistics collector's delay before PostgreSQL 15
        with connection.cursor() as c:
            c.execute("SELECT pg_stat_clear_snapshot()")
            c.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            (lsn,), = c.fetchall()
            c.execute("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                      "WHERE relname = ANY(%s)", [list(tables)])
            return int(lsn), {r[0]: (r[1], r[2] - r[3], r[3]) for r in c.fetchall()}

    written: dict[str, list[str]] = {}

    def note(how: str, before, after, n: int) -> None:
        wal = (after[0] - before[0]) / n
        rows = "  ".join(
            f"{t.removeprefix('cron_at_scale_')} " + "/".join(
                f"{(after[1][t][i] - before[1][t][i]) / n:.2f}" for i in (0, 2, 1)) for t in tables)
        written.setdefault(how, []).append(f"{wal:7.0f} B  {rows}")

    sizes = [int(x) for x in a.batches.split(",")]
    print(f"{'how':42s} {'start':>8s} {'complete':>9s} {'total':>8s}  ms of PostgreSQL CPU per task")
    for turn in range(a.turns):
        runs = claimed(a.jobs)
        backend = pid()
        w0 = writes()
        c0 = backend_cpu(backend)
        prev = None
        for job_id, attempt in runs:
            attempts.write(job_id, attempt, "w", str(uuid4()), [prev] if prev else [])
            prev = (job_id, attempt)
        total = 1000 * (backend_cpu(backend) - c0) / len(runs)
        attempts.write(None, 0, "", None, [prev])  # the last completion, as the next start would carry it
        note("start_attempt, one per task", w0, writes(), len(runs))
        print(f"{f'turn {turn + 1}: start_attempt, one per task':42s} {'':>8s} {'':>9s} {total:8.3f}", flush=True)
        for k in sizes:
            runs = claimed(a.jobs)
            backend = pid()
            w0 = writes()
            c0 = backend_cpu(backend)
            for i in range(0, len(runs), k):
                attempts.write_many([(j, n, str(uuid4())) for j, n in runs[i:i + k]], "w")
            c1 = backend_cpu(backend)
            for i in range(0, len(runs), a.completions):
                attempts.write(None, 0, "", None, runs[i:i + a.completions])
            c2 = backend_cpu(backend)
            note(f"start_attempts, batches of {k}", w0, writes(), len(runs))
            start, done = 1000 * (c1 - c0) / len(runs), 1000 * (c2 - c1) / len(runs)
            print(f"{f'turn {turn + 1}: start_attempts, batches of {k}':42s} {start:8.3f} {done:9.3f} "
                  f"{start + done:8.3f}", flush=True)
    print(f"\n{'written per task (start and completion)':42s} {'WAL':>9s}  row versions per table: "
          "inserted/HOT updates/updates with index entries, one line per turn")
    for how, lines in written.items():
        for line in lines:
            print(f"{how:42s} {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
