"""Bursts: recurring jobs falling due at one instant, against one-off jobs, measured from outside.

    python bench/burst.py                                  # rate, preload and starvation at the issue's sizes
    python bench/burst.py --only rate --sizes 10000 --turns 1   # a quick look
    python bench/burst.py --only midnight --jobs 1000000   # 1M recurring jobs at one instant, 1 then 2 dispatchers

One ``cron_dispatcher`` process (or two), no workers; the messages are read off the
broker (Redis: the length of each destination list, sampled every ~2 ms by this
process), never off the jobs' database. Recurring jobs: ``schedule_many`` with
``cron=`` in 20 IANA zones, six-field expressions built from each zone's wall time
of the instant (daily, hourly, on a weekday, a day of the month, two hours a day...:
at least 100 distinct), so their next occurrence is that instant. One-off jobs:
``schedule_many`` with ``at=`` the instant.

rate      per size (``--sizes``), one-off and recurring in turns (``--turns`` rounds, A B A B):
          the burst's rate from its first message to its last, the ratio, and the CPU ms per fired
          job of the dispatcher process and PostgreSQL's backends (from /proc). The dispatcher
          runs without pre-loading (``--preload 0``): this is the claim path's own rate.
preload   ``--jobs`` (100,000) recurring jobs at one instant, the dispatcher pre-loading
          (``--preload``, the setting's 60 s by default) with ``--eta-lead``: when the first
          and the last message reached the broker against the instant (the first must not be
          before the instant minus the ETA lead), and the dispatcher's resident memory before and
          at its peak. Meanwhile an unrelated every-second job on its own queue: each of its
          messages' arrival against its fire_at, and the occurrences it missed.
midnight  ``--jobs`` recurring jobs at one instant with one dispatcher, then two sharing the
          shards: time until all are on the broker, lateness p50/p99/max (the i-th message's
          arrival minus the instant), memory.
w3        ``--future`` (10M) pending recurring jobs (daily and hourly expressions in the 20 zones,
          due within 30 days, loaded by ``INSERT ... SELECT``), and ``--due`` (10,000) recurring
          jobs due at one instant fired beside them by the in-process firing path (claim +
          publish) against an empty table, best of 3 each.

Services: ``DATABASE_URL`` / ``CELERY_BROKER_URL`` (Redis) when set, embedded ones otherwise. It
TRUNCATEs the job tables of that database. Prints a table on stderr and one JSON line on stdout
(``--out`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, UUID7_SQL, Bench, cpu_ms_per, cpu_text, say  # noqa: E402

ZONES = ["UTC", "Europe/London", "Europe/Paris", "Europe/Berlin", "Europe/Moscow", "Asia/Kolkata", "Asia/Tokyo",
         "Asia/Shanghai", "Australia/Sydney", "America/New_York", "America/Chicago", "America/Denver",
         "America/Los_Angeles", "America/Sao_Paulo", "Africa/Cairo", "Asia/Dubai", "Asia/Singapore",
         "Pacific/Auckland", "America/Halifax", "Asia/Kathmandu"]
TASK = "demo.tasks.noop"
SIDE_QUEUE = "burst_side"


def expressions(at: datetime) -> list[tuple[str, str]]:
    """(six-field expression, zone) pairs whose next occurrence after a moment before ``at`` is
    ``at``: per zone, several shapes of schedule on that zone's wall time of ``at``."""
    out = []
    for z in ZONES:
        w = at.astimezone(ZoneInfo(z))
        s, m, h, dow = w.second, w.minute, w.hour, (w.weekday() + 1) % 7
        out += [(f"{s} {m} {h} * * *", z), (f"{s} {m} * * * *", z), (f"{s} {m} {h} {w.day} * *", z),
                (f"{s} {m} {h} * {w.month} *", z), (f"{s} {m} {h} * * {dow}", z),
                (f"{s} {m} {h},{(h + 12) % 24} * * *", z), (f"{s} {m} */1 * * *", z)]
    return out


def cron_specs(n: int, at: datetime) -> list[dict]:
    pairs = expressions(at)
    return [{"task": TASK, "cron": pairs[i % len(pairs)][0], "tz": pairs[i % len(pairs)][1], "args": [i]}
            for i in range(n)]


def once_specs(n: int, at: datetime) -> list[dict]:
    return [{"task": TASK, "at": at, "args": [i]} for i in range(n)]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Burst(Bench):
    def __init__(self, args):
        super().__init__(args)
        import cron_at_scale

        self.cron_at_scale = cron_at_scale
        self.dispatchers: list = []
        self.schedule_rate: dict[str, float] = {}  # jobs/s schedule_many managed, per kind

    def reset(self) -> None:
        super().reset()
        self.redis.delete(SIDE_QUEUE)

    def start(self, n: int = 1, preload: float = 0.0, eta_lead: float | None = None) -> None:
        """``n`` cron_dispatcher processes (no workers: every queue is fired into)."""
        from demo.runner import Processes, child_env, database_url

        self.stop()
        # no workers start anything: a dispatch lease longer than the run, or the reaper fires every
        # run again after 30 s (and measures itself, not the burst)
        settings = {"HOLD_UNCONSUMED_QUEUES": False, "PRELOAD_MAX_RUNS": self.args.max_held, "DISPATCH_LEASE": 3600,
                    "MAX_BROKER_DEPTH": 10_000_000}  # nor is a queue of a million messages held back as full
        if eta_lead is not None and eta_lead > 1.0:
            settings["LOOKAHEAD"] = eta_lead
        env = child_env(database_url(self.connection.settings_dict), self.broker_url,
                        CRON_AT_SCALE_SETTINGS=json.dumps(settings))
        self.procs = Processes(env, log_dir=ROOT / "bench" / "results" / "logs")
        extra = ["--preload", str(preload)] + (["--eta-lead", str(eta_lead)] if eta_lead is not None else [])
        self.dispatchers = [self.procs.dispatcher(f"burst-d{i}", extra=extra) for i in range(n)]
        time.sleep(3.0)  # imported, shards leased
        for p in self.dispatchers:
            assert p.poll() is None, "the dispatcher exited: see bench/results/logs"

    def stop(self) -> None:
        super().stop()
        self.dispatchers = []

    def schedule(self, specs: list[dict], kind: str) -> list:
        t0 = time.monotonic()
        jobs = []
        for i in range(0, len(specs), 50_000):
            jobs += self.cron_at_scale.schedule_many(specs[i:i + 50_000])
        self.schedule_rate[kind] = len(specs) / (time.monotonic() - t0)  # the next instant's margin
        return jobs

    def instant(self, n: int, kind: str) -> datetime:
        """An instant far enough ahead that ``n`` jobs of ``kind`` are scheduled before it."""
        if kind not in self.schedule_rate and n > 50_000:  # measured on 20,000 first (then deleted)
            probe = self.db_now() + timedelta(days=2)
            ids = [str(j.id) for j in self.schedule((cron_specs if kind == "cron" else once_specs)(20_000, probe), kind)]
            self.q("DELETE FROM cron_at_scale_job WHERE id = ANY(%s::uuid[])", [ids])
        per_s = self.schedule_rate.get(kind, 2_000 if kind == "cron" else 8_000)
        return (self.db_now() + timedelta(seconds=8 + 1.8 * n / per_s)).replace(microsecond=0)

    def watch(self, n: int, at: datetime, timeout: float, side: bool = False, peak_of=()) -> dict:
        """Sample the broker until ``n`` messages are on the ``celery`` list (or ``timeout`` s after
        ``at``): when each count was first seen, on this process's clock (the database's, here)."""
        seen: list[tuple[float, int]] = []
        side_seen: dict[str, float] = {}
        peak = {p.pid: rss_kib(p.pid) for p in peak_of}
        start = {**peak}
        end = at.timestamp() + timeout
        last = -1
        i = 0
        while time.time() < end:
            got = self.redis.llen("celery")
            now = time.time()
            if got != last:
                seen.append((now, got))
                last = got
            if side and i % 10 == 0:
                for raw in self.redis.lrange(SIDE_QUEUE, 0, -1):
                    msg = json.loads(raw)
                    fire_at = msg["headers"]["cron_at_scale"]["fire_at"]
                    side_seen.setdefault(fire_at, now)
            if i % 50 == 0:
                for p in peak_of:
                    peak[p.pid] = max(peak[p.pid], rss_kib(p.pid))
            i += 1
            if got >= n and (not side or now > at.timestamp() + 5):
                break
            time.sleep(0.002)
        first = next((t for t, c in seen if c > 0), None)
        last_t = next((t for t, c in seen if c >= n), None)
        out = {"jobs": n, "on_broker": last, "first_vs_instant_s": None if first is None else round(first - at.timestamp(), 3),
               "last_vs_instant_s": None if last_t is None else round(last_t - at.timestamp(), 3),
               "seconds": None if first is None or last_t is None else round(last_t - first, 3)}
        out["jobs_per_s"] = round(n / out["seconds"], 1) if out["seconds"] else None
        if seen and last_t is not None:  # the i-th message's lateness: when the count first reached i
            late, j = [], 0
            marks = sorted({max(1, int(n * q)) for q in (0.5, 0.99, 1.0)})
            for t, c in seen:
                while j < len(marks) and c >= marks[j]:
                    late.append(t - at.timestamp())
                    j += 1
            out["lateness_s"] = dict(zip(("p50", "p99", "max"), (round(x, 3) for x in late), strict=False))
        if peak_of:
            out["rss_mib"] = {"before": round(sum(start.values()) / 1024, 1), "peak": round(sum(peak.values()) / 1024, 1)}
        if side:
            out["side_arrivals"] = side_seen
        return out

    # -- workloads -----------------------------------------------------------------------

    def one(self, n: int, kind: str, preload: float = 0.0, eta_lead: float | None = None, side: bool = False,
            timeout: float = 60.0) -> dict:
        self.reset()
        at = self.instant(n, kind)
        self.schedule((cron_specs if kind == "cron" else once_specs)(n, at), kind)
        if side:
            self.cron_at_scale.schedule(TASK, every=1, queue=SIDE_QUEUE, overlap="allow")  # no workers: none finishes
        if time.time() > at.timestamp() - 4:
            raise RuntimeError("scheduling took longer than planned: raise the margin in instant()")
        while time.time() < at.timestamp() - 4 - (preload or 0):  # idle before the burst comes into view
            time.sleep(0.05)
        before = self.cpu_now()
        out = self.watch(n, at, timeout, side=side, peak_of=self.dispatchers)
        out["cpu_ms_per_job"] = cpu_ms_per(before, self.cpu_now(), out["on_broker"] or 0, ("dispatcher", "postgres"))
        if side:
            out["side"] = self.side_report(at, out.pop("side_arrivals"))
        return out

    def side_report(self, at: datetime, arrivals: dict[str, float]) -> dict:
        """The every-second job's messages from 3 s before the instant to 4 s after: arrival minus
        fire_at, and the occurrences with no message."""
        (missed,), = self.q("SELECT missed_occurrences FROM cron_at_scale_job WHERE queue = %s", [SIDE_QUEUE])
        lo, hi = at.timestamp() - 3, at.timestamp() + 4
        late = []
        for fire_at, seen in arrivals.items():
            f = datetime.fromisoformat(fire_at).timestamp()
            if lo <= f <= hi:
                late.append(seen - f)
        expected = int(hi - lo)
        return {"window_s": [-3, 4], "messages": len(late), "expected": expected,
                "arrival_minus_fire_at_s": {"max": round(max(late), 3) if late else None,
                                            "p50": round(statistics.median(late), 3) if late else None},
                "missed_occurrences": missed}

    def rate(self) -> dict:
        out: dict = {}
        self.start(preload=0.0)
        for n in self.args.sizes:
            turns: dict[str, list] = {"once": [], "cron": []}
            for t in range(self.args.turns):
                for kind in ("once", "cron"):
                    r = self.one(n, kind, timeout=30 + n / 1000)
                    turns[kind].append(r)
                    say(f"rate n={n} turn {t + 1} {kind:5}: {r['jobs_per_s'] or 0:>9,.0f} jobs/s "
                        f"({r['seconds']} s first->last, last {r['last_vs_instant_s']} s after the instant); "
                        f"{cpu_text(r['cpu_ms_per_job'])}")
            med = {k: statistics.median(r["jobs_per_s"] or 0 for r in v) for k, v in turns.items()}
            cpu = {k: statistics.median(r["cpu_ms_per_job"].get("total", 0) for r in v) for k, v in turns.items()}
            out[str(n)] = {"turns": turns, "once_jobs_per_s": med["once"], "cron_jobs_per_s": med["cron"],
                           "ratio": round(med["cron"] / med["once"], 3) if med["once"] else None,
                           "cpu_ms_per_job": cpu, "cpu_ratio": round(cpu["cron"] / cpu["once"], 3) if cpu["once"] else None}
            say(f"rate n={n}: recurring/one-off = {out[str(n)]['ratio']} (medians), CPU per fire ratio "
                f"{out[str(n)]['cpu_ratio']}")
        self.stop()
        return out

    def preload(self) -> dict:
        a = self.args
        self.start(preload=a.preload, eta_lead=a.eta_lead)
        r = self.one(a.jobs, "cron", preload=a.preload, eta_lead=a.eta_lead, side=True, timeout=60 + a.jobs / 2000)
        lead = 1.0 if a.eta_lead is None else a.eta_lead
        r["eta_lead"] = lead
        r["none_before_fire_at_minus_eta_lead"] = r["first_vs_instant_s"] is not None and r["first_vs_instant_s"] >= -lead - 0.01
        say(f"preload n={a.jobs}: first message {r['first_vs_instant_s']} s, last {r['last_vs_instant_s']} s from the "
            f"instant (ETA lead {lead} s); memory {r.get('rss_mib')}; side job {r['side']}")
        self.stop()
        return r

    def w3(self) -> dict:
        a = self.args
        out: dict = {"future": a.future, "due": a.due}

        def fire_due() -> float:
            at = self.instant(a.due, "cron")
            ids = [str(j.id) for j in self.schedule(cron_specs(a.due, at), "cron")]
            while time.time() < at.timestamp() + 0.05:
                time.sleep(0.02)
            n, secs = self.fire_in_process(a.due)
            self.redis.delete("celery")
            self.q("DELETE FROM cron_at_scale_jobattempt WHERE job_id = ANY(%s::uuid[])", [ids])
            self.q("DELETE FROM cron_at_scale_job WHERE id = ANY(%s::uuid[])", [ids])
            return n / secs

        self.reset()
        empty = [fire_due() for _ in range(3)]
        out["empty_jobs_per_s"] = round(max(empty), 1)
        say(f"w3: {a.due} recurring due, empty table   {max(empty):,.0f} jobs/s (best of 3: "
            f"{', '.join(f'{x:,.0f}' for x in empty)})")
        t0 = time.perf_counter()
        zones = "ARRAY[" + ",".join(f"'{z}'" for z in ZONES) + "]"
        for start in range(0, a.future, 1_000_000):
            chunk = min(1_000_000, a.future - start)
            self.q(f"""INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, occurrence_at, cron_expr, timezone,
                                                     task, payload, options)
                       SELECT {UUID7_SQL}, 'cron', f, f,
                              CASE WHEN i %% 2 = 0 THEN format('%%s %%s * * *', i %% 60, (i / 60) %% 24)
                                   ELSE format('%%s * * * *', i %% 60) END,
                              ({zones})[1 + i %% 20], %s, jsonb_build_object('args', jsonb_build_array(i),
                              'kwargs', '{{}}'::jsonb), '{{}}'
                       FROM generate_series(%s, %s) AS i,
                            LATERAL (SELECT statement_timestamp() + interval '1 day'
                                            + make_interval(secs => (i %% 2592000))) AS t(f)""",
                   [TASK, start, start + chunk - 1])
            say(f"  {start + chunk:,} future recurring jobs ({time.perf_counter() - t0:.0f}s)")
        self.q("VACUUM ANALYZE cron_at_scale_job")
        (total,), = self.q("SELECT count(*) FROM cron_at_scale_job WHERE schedule_type <> 'once'")
        out["rows"] = total
        out["load_seconds"] = round(time.perf_counter() - t0, 1)
        full = [fire_due() for _ in range(3)]
        out["full_jobs_per_s"] = round(max(full), 1)
        out["ratio"] = round(max(full) / max(empty), 3)
        say(f"w3: {a.due} recurring due beside {total:,} recurring   {max(full):,.0f} jobs/s (best of 3: "
            f"{', '.join(f'{x:,.0f}' for x in full)}) = {out['ratio']:.2f} x empty")
        self.reset()
        return out

    def midnight(self) -> dict:
        a = self.args
        out = {}
        for n_disp in a.dispatchers:
            self.start(n=n_disp, preload=a.preload, eta_lead=a.eta_lead)
            r = self.one(a.jobs, "cron", preload=a.preload, eta_lead=a.eta_lead, timeout=120 + a.jobs / 1000)
            out[f"{n_disp}_dispatchers"] = r
            say(f"midnight n={a.jobs}, {n_disp} dispatcher(s): all on the broker {r['last_vs_instant_s']} s after the "
                f"instant (first {r['first_vs_instant_s']} s); lateness {r.get('lateness_s')}; memory {r.get('rss_mib')}; "
                f"{cpu_text(r['cpu_ms_per_job'])}")
            self.stop()
        return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="rate,preload", help="comma-separated among rate,preload,midnight,w3")
    p.add_argument("--sizes", default="10000,100000", help="rate: burst sizes, comma-separated")
    p.add_argument("--turns", type=int, default=2, help="rate: rounds of one-off and recurring in turn")
    p.add_argument("--jobs", type=int, default=100_000, help="preload and midnight: recurring jobs at the instant")
    p.add_argument("--preload", type=float, default=60.0, help="preload and midnight: the dispatcher's --preload")
    p.add_argument("--eta-lead", type=float, default=None, help="the dispatcher's --eta-lead (default the setting's, 1 s)")
    p.add_argument("--dispatchers", default="1,2", help="midnight: dispatcher counts to run, comma-separated")
    p.add_argument("--max-held", type=int, default=200_000, help="PRELOAD_MAX_RUNS of the dispatchers")
    p.add_argument("--future", type=int, default=10_000_000, help="w3: pending recurring jobs beside the due ones")
    p.add_argument("--due", type=int, default=10_000, help="w3: recurring jobs due at one instant, fired beside them")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--out", help="also write the JSON line to this file")
    args = p.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    args.dispatchers = [int(x) for x in args.dispatchers.split(",") if x]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    b = Burst(args)
    result: dict = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        for name in args.only.split(","):
            result[name] = getattr(b, name)()
    finally:
        b.stop()
    line = json.dumps(result, default=str)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
