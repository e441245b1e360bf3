"""What one scrape of ``/metrics`` costs the database, for 1 and for 40 concurrent scrapes.

Usage (PostgreSQL from ``BENCH_DATABASE_URL``, default a local server; the database is
created and filled here, never your own)::

    python bench/metrics_scrape.py                    # 100,000 jobs into cas_metrics_bench, then scrape
    python bench/metrics_scrape.py --reuse --json     # scrape again without regenerating

Fills ``--db`` with ``--rows`` jobs (``bench/admin_10m.py``'s mix: pending, finished, failed,
keyed and cron jobs, one attempt per fired job), serves the metrics as ``cron_dispatcher
--metrics-port`` does (:func:`cron_at_scale.ops.metrics.serve`, in this process) and scrapes it
over HTTP, ``--rounds`` times each: one scrape, then ``--concurrent`` at once. Two configurations:
``uncached`` (``METRICS_CACHE_SECONDS`` 0, ``METRICS_JOB_KEYS`` on: what every scrape cost before
the cache) and ``cached`` (the defaults: 10 s, no per-key series); each round of ``cached`` starts
with the cache expired, so the figure is a computation shared by the round's scrapes.

The database's cost is read from ``pg_stat_database`` for the bench database only (transactions
committed or rolled back, buffer hits + reads), from a connection to another database so that
the reading itself is not counted; the scraper's connections close after each scrape, which
flushes their statistics. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from admin_10m import BASE_URL, create_database, generate, setup_django  # noqa: E402


def db_stats(conn, db: str) -> tuple[int, int]:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit + xact_rollback, blks_hit + blks_read FROM pg_stat_database "
                    "WHERE datname = %s", [db])
        xacts, blocks = cur.fetchone()
    return int(xacts), int(blocks)


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as r:
        return len(r.read())


def measure(conn, db: str, port: int, n: int) -> dict:
    """``n`` scrapes at once; the database's transactions and buffers (per scrape), wall seconds."""
    from cron_at_scale.ops import metrics

    metrics._db_collector.forget()  # each round starts with the cache expired
    time.sleep(1.2)  # statistics of earlier work flushed (PostgreSQL flushes them at most once a second)
    x0, b0 = db_stats(conn, db)
    t = time.monotonic()
    sizes: list[int] = []
    threads = [threading.Thread(target=lambda: sizes.append(scrape(port))) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.monotonic() - t
    assert len(sizes) == n and min(sizes) > 0
    time.sleep(1.2)
    x1, b1 = db_stats(conn, db)
    return {"xacts": x1 - x0, "blocks": b1 - b0, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="cas_metrics_bench")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--reuse", action="store_true", help="keep the jobs already in --db")
    p.add_argument("--concurrent", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = p.parse_args()
    create_database(args.db, fresh=not args.reuse)
    setup_django(args.db)
    import psycopg2
    from django.conf import settings

    from cron_at_scale.ops import metrics

    if not args.reuse:
        generate(args.rows)
    conn = psycopg2.connect(BASE_URL)  # another database: this connection's own work is not counted
    conn.autocommit = True
    base = dict(getattr(settings, "CRON_AT_SCALE", {}) or {})
    results = {}
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(port)
    try:
        for name, conf in (("uncached", {"METRICS_CACHE_SECONDS": 0, "METRICS_JOB_KEYS": True}),
                           ("cached", {})):
            settings.CRON_AT_SCALE = {**base, **conf}
            for n in (1, args.concurrent):
                runs = [measure(conn, args.db, port, n) for _ in range(args.rounds)]
                results[f"{name}_{n}"] = {
                    "scrapes": n,
                    "xacts_per_scrape": statistics.median(r["xacts"] for r in runs) / n,
                    "blocks_per_scrape": statistics.median(r["blocks"] for r in runs) / n,
                    "blocks_total": statistics.median(r["blocks"] for r in runs),
                    "seconds": round(statistics.median(r["seconds"] for r in runs), 3),
                }
    finally:
        server.shutdown()
        settings.CRON_AT_SCALE = base
    out = sys.stderr if args.json else sys.stdout
    print(f"{'configuration':<14} {'scrapes':>7} {'xacts/scrape':>12} {'buffers/scrape':>14} {'buffers':>9} {'wall s':>7}",
          file=out)
    for name, r in results.items():
        print(f"{name.rsplit('_', 1)[0]:<14} {r['scrapes']:>7} {r['xacts_per_scrape']:>12.2f} "
              f"{r['blocks_per_scrape']:>14.1f} {r['blocks_total']:>9.0f} {r['seconds']:>7.3f}", file=out)
    print(json.dumps({"rows": args.rows, **results}))


if __name__ == "__main__":
    main()
