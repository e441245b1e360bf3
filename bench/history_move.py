"""What a finished job costs to leave the job table: moved to the history, or purged row by row.

    DATABASE_URL=postgres://postgres@127.0.0.1:5499/soak python bench/history_move.py --jobs 200000 --turns 2

Per turn and per way (in turns: purge, move, purge, move): ``--jobs`` completed jobs with one
finished attempt each are loaded (``INSERT ... SELECT generate_series``), vacuumed, a CHECKPOINT
taken (each way starts with the same full-page images to write), then either moved with
``archive.move()`` (``HISTORY_AFTER``'s statement: one per 1,000 jobs, into the partitioned
history) or deleted with ``retention.purge()`` (``RETENTION``'s row purge without the history).
Prints jobs/s, the CPU of this connection's PostgreSQL backend per job (from /proc: run it on the
database's host) and the WAL per job (``pg_current_wal_lsn()``; a private cluster, or the other
databases' writes count too). TRUNCATEs the job and history tables: never point it at a database
you care about.

``--pinned``: the move only, under a vacuum horizon pinned by a REPEATABLE READ transaction held
open on a second connection, in passes of ``--pass-size`` jobs (the dispatcher's loop at that many
finished jobs a second), in turns: each pass walking from the start of the finished jobs' index
(``archive.move``) or from the floor the loop keeps (``archive.move_from``, newest moved less
``FLOOR_MARGIN``). Prints each way's backend CPU per job and the first and last tenth's ms per pass.

    DATABASE_URL=... python bench/history_move.py --pinned --jobs 60000 --pass-size 200 --turns 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")


def load(cur, n: int) -> None:
    cur.execute("TRUNCATE cron_at_scale_job, cron_at_scale_jobattempt, cron_at_scale_jobhistory, "
                "cron_at_scale_attempthistory")
    cur.execute("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, status, updated_at, attempts)
                   SELECT gen_random_uuid(), now() - interval '1 hour', 'demo.tasks.noop',
                          '{"args": [], "kwargs": {"n": 1}}', '{}', 'completed',
                          now() - interval '1 hour' + make_interval(secs => g / 1000.0), 1
                   FROM generate_series(1, %s) AS g""", [n])
    cur.execute("""INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, started_at, finished_at,
                                                         outcome, worker)
                   SELECT id, 1, fire_at, fire_at, fire_at, 'succeeded', 'w1' FROM cron_at_scale_job""")
    cur.execute("VACUUM ANALYZE cron_at_scale_job")
    cur.execute("VACUUM ANALYZE cron_at_scale_jobattempt")
    cur.execute("CHECKPOINT")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200_000, help="finished jobs per turn (200000)")
    p.add_argument("--turns", type=int, default=2, help="turns of each way (2)")
    p.add_argument("--pinned", action="store_true", help="the move from the start against from a floor, pinned")
    p.add_argument("--pass-size", type=int, default=200, help="jobs per pass with --pinned (200)")
    args = p.parse_args(argv)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from cron_at_scale.maintenance import archive, retention

    call_command("migrate", verbosity=0)
    archive.keep_partitions(86400, None)
    if args.pinned:
        return pinned(args, connection, archive)
    for turn in range(args.turns):
        for way in ("purge", "move"):
            with connection.cursor() as cur:
                load(cur, args.jobs)
                cur.execute("SELECT pg_backend_pid(), pg_current_wal_lsn()")
                pid, lsn = cur.fetchone()
            cpu, t0 = backend_cpu(pid), time.monotonic()
            if way == "move":
                done = 0
                while n := archive.move(600)[0]:
                    done += n
            else:
                done = retention.purge(600)[0]
            seconds, cpu = time.monotonic() - t0, backend_cpu(pid) - cpu
            with connection.cursor() as cur:
                cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn])
                (wal,) = cur.fetchone()
            print(f"turn {turn + 1} {way:5}: {done:,} jobs (1 attempt each) in {seconds:.1f}s = {done / seconds:,.0f} "
                  f"jobs/s; PostgreSQL backend CPU {cpu * 1000 / done:.3f} ms/job; WAL {float(wal) / done:,.0f} B/job")
    return 0


def pinned(args, connection, archive) -> int:
    """The move in passes under a pinned horizon: from the start of the index, or from a floor."""
    from datetime import timedelta

    import psycopg2

    s = connection.settings_dict
    for turn in range(args.turns):
        for way in ("start", "floor"):
            with connection.cursor() as cur:
                load(cur, args.jobs)
                cur.execute("SELECT pg_backend_pid()")
                (pid,) = cur.fetchone()
            pin = psycopg2.connect(host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"] or None,
                                   password=s["PASSWORD"] or None, dbname=s["NAME"])
            pin.set_session(isolation_level="REPEATABLE READ")
            with pin.cursor() as pc:
                pc.execute("SELECT count(*) FROM cron_at_scale_shardlease")  # the snapshot: held from here
            passes: list[float] = []
            done, floor = 0, None
            cpu = backend_cpu(pid)
            while True:
                t0 = time.monotonic()
                if way == "start":
                    n, _ = archive.move(600, batch_size=args.pass_size, budget_seconds=0)
                else:
                    n, _, newest = archive.move_from(floor, 600, batch_size=args.pass_size, budget_seconds=0)
                    if newest is not None:  # as the dispatcher's loop keeps it (archive.Archive)
                        lower = newest - timedelta(seconds=archive.FLOOR_MARGIN)
                        floor = lower if floor is None else max(floor, lower)
                passes.append(time.monotonic() - t0)
                done += n
                if n < args.pass_size:
                    break
            cpu = backend_cpu(pid) - cpu
            pin.rollback()
            pin.close()
            tenth = max(1, len(passes) // 10)
            first, last = sum(passes[:tenth]) / tenth, sum(passes[-tenth - 1:-1]) / tenth
            print(f"turn {turn + 1} pinned, from the {way:5}: {done:,} jobs in {len(passes)} passes of "
                  f"{args.pass_size}; PostgreSQL backend CPU {cpu * 1000 / done:.3f} ms/job; ms per pass: "
                  f"first tenth {first * 1000:.1f}, last tenth {last * 1000:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
