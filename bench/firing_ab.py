"""The firing path (claim + publish, publisher confirms on RabbitMQ) of two revisions, in turns, to Redis
and to RabbitMQ (a classic and a quorum queue): jobs/s and CPU per job from /proc.

    .venv/bin/python bench/firing_ab.py --rabbitmq amqp://guest:guest@127.0.0.1:5672/myvhost
    .venv/bin/python bench/firing_ab.py --a-dir /path/to/main/checkout --turns 3 --jobs 20000

A is ``--base`` (default ``main``, extracted with ``git archive`` into a temporary directory) or the
checkout ``--a-dir``; B is this working tree. Each measurement is its own process (``--child``) run
with ``PYTHONPATH`` set to its side's code, so each side fires with its own ``cron_at_scale``: the
``ceiling`` workload's in-process dispatcher (``bench/run.py``, ``Bench.fire_in_process``: ``--jobs``
due at one instant, claimed and published, waited for until every batch is sent and, on RabbitMQ,
confirmed). Order per turn: each target, A then B (A B A B ...), so the box's drift hits both alike.

Per measurement: jobs/s; CPU ms per job of the dispatcher process (all its threads), of this
database's PostgreSQL backends, and of the broker (redis-server or RabbitMQ's ``beam.smp``, read
from /proc when it runs on this machine; a broker shared with others counts their work too); and the
messages on the broker afterwards (every job must be there). Prints a table of the medians over the
turns, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("redis", "classic", "quorum")
# RabbitMQ queues besides the default "celery" (a classic queue): their name and x-arguments
QUEUES = {"quorum": ("bench_quorum", {"x-queue-type": "quorum"}),
          "cqv2": ("bench_cqv2", {"x-queue-version": 2})}  # a classic queue's v2 index (RabbitMQ 3.10+)
# targets that are the default classic queue with Celery's transient delivery (delivery_mode 1)
TRANSIENT = ("transient",)


def beam_pids() -> list[int]:
    """RabbitMQ's Erlang VM processes on this machine."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if Path(f"/proc/{entry.name}/comm").read_text().strip().startswith("beam"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def child(args: argparse.Namespace) -> None:
    """One measurement with the ``cron_at_scale`` on ``PYTHONPATH``; prints one JSON line."""
    from bench import run  # the side's own bench/run.py (the same in both sides is not required)

    bench = run.Bench(run.parse_args(["--only", "ceiling", "--jobs", str(args.jobs)]
                                     + (["--batch-size", str(args.batch_size)] if args.batch_size else [])))
    app = None
    queue = "celery"
    if args.target != "redis":
        from celery import Celery
        from kombu import Queue

        app = Celery("bench-firing-ab", set_as_current=False)
        app.config_from_object("django.conf:settings", namespace="CELERY")
        app.conf.broker_write_url = app.conf.broker_read_url = args.rabbitmq
        if args.target in TRANSIENT:
            app.conf.task_default_delivery_mode = "transient"
        if args.target in QUEUES:
            queue, arguments = QUEUES[args.target]
            app.conf.task_queues = (Queue(queue, queue_arguments=arguments),)
            app.conf.task_default_queue = queue
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            app.amqp.queues[queue](conn.default_channel).declare()
            conn.default_channel.queue_purge(queue)
    bench.reset()
    bench.insert_due(args.jobs)
    beams = beam_pids() if app is not None else []
    stat = run.proc_stat
    broker_before = sum(stat(p)[1] for p in beams if stat(p)) if beams else None
    before = bench.cpu_now()
    n, seconds = bench.fire_in_process(args.jobs, app=app)
    after = bench.cpu_now()
    cpu = run.cpu_ms_per(before, after, n)
    if beams:
        cpu["broker"] = round(1000 * (sum(stat(p)[1] for p in beams if stat(p)) - broker_before) / n, 3)
        cpu["total"] = round(sum(v for k, v in cpu.items() if k != "total"), 3)
    if app is None:
        on_broker = bench.redis.llen("celery")
    else:
        with app.connection_for_write() as conn:
            on_broker = conn.default_channel.queue_declare(queue, passive=True).message_count
            conn.default_channel.queue_purge(queue)
    bench.reset()
    print(json.dumps({"jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds, 1),
                      "on_broker": on_broker, "cpu_ms_per_job": cpu}), flush=True)


def extract(base: str) -> Path:
    """``git archive`` of ``base`` in a temporary directory (removed at exit)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", base], check=True, capture_output=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="firing-ab-"))
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp


def measure(code: Path, target: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{code / 'example_project'}"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--target", target, "--jobs", str(args.jobs),
           "--rabbitmq", args.rabbitmq or ""]
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    out = subprocess.run(cmd, cwd=code, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rabbitmq", default=os.environ.get("CELERY_RABBITMQ_URL"),
                    help="RabbitMQ URL (amqp://...; default CELERY_RABBITMQ_URL); without it, Redis only")
    ap.add_argument("--base", default="main", help="git revision of A (default main)")
    ap.add_argument("--a-dir", help="a checkout to run as A instead of --base")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs due at one instant per measurement")
    ap.add_argument("--batch-size", type=int, help="dispatcher batch size (default: the setting)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated among redis,classic,quorum,cqv2 (a classic queue, x-queue-version 2),"
                    " transient (the classic queue, task_default_delivery_mode = 'transient')")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    targets = [t for t in args.targets.split(",") if t == "redis" or args.rabbitmq]
    sides = {"A": Path(args.a_dir) if args.a_dir else extract(args.base), "B": ROOT}
    results: dict = {t: {s: [] for s in sides} for t in targets}
    load = [os.getloadavg()[0]]
    t0 = time.monotonic()
    for turn in range(args.turns):
        for target in targets:
            for side, code in sides.items():
                r = measure(code, target, args)
                results[target][side].append(r)
                print(f"turn {turn + 1} {target:8} {side}: {r['jobs_per_s']:>9,.0f} jobs/s  "
                      f"CPU ms/job {json.dumps(r['cpu_ms_per_job'])}  on broker {r['on_broker']}",
                      file=sys.stderr, flush=True)
        load.append(os.getloadavg()[0])
    summary: dict = {}
    print(f"\n{'target':8} {'side':4} {'jobs/s (median)':>16} {'rounds':>28} {'dispatcher':>10} "
          f"{'postgres':>8} {'broker':>7}  (CPU ms per job, medians)", file=sys.stderr)
    for target in targets:
        for side in sides:
            rs = results[target][side]
            med = {k: round(statistics.median(r["cpu_ms_per_job"].get(k, 0.0) for r in rs), 3)
                   for k in ("dispatcher", "postgres", "broker")}
            rate = statistics.median(r["jobs_per_s"] for r in rs)
            summary.setdefault(target, {})[side] = {"jobs_per_s": rate, "rounds": [r["jobs_per_s"] for r in rs],
                                                    "cpu_ms_per_job": med,
                                                    "all_on_broker": all(r["on_broker"] == r["jobs"] for r in rs)}
            print(f"{target:8} {side:4} {rate:>16,.0f} {', '.join(f'{r:,.0f}' for r in summary[target][side]['rounds']):>28} "
                  f"{med['dispatcher']:>10.3f} {med['postgres']:>8.3f} {med['broker']:>7.3f}", file=sys.stderr)
    for side in sides:
        if "redis" in summary:
            for target in targets[1:] if targets[0] == "redis" else []:
                summary[target][side]["ratio_to_redis"] = round(
                    summary[target][side]["jobs_per_s"] / summary["redis"][side]["jobs_per_s"], 3)
    print(json.dumps({"a": args.a_dir or args.base, "jobs": args.jobs, "turns": args.turns, "load": load,
                      "seconds": round(time.monotonic() - t0, 1), "results": summary}), flush=True)


if __name__ == "__main__":
    main()
