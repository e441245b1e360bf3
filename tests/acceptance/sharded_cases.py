"""The 64 shards on two databases: ``CRON_AT_SCALE["SHARD_DATABASES"]`` (docs/sharding.md).

Runs under ``tests.settings_sharded`` (``default`` holds shards 0-31, ``second`` 32-63, the router in
``DATABASE_ROUTERS``): pytest-django configures Django once per run, so ``test_sharded.py`` runs
this file in a pytest of its own::

    python -m pytest tests/acceptance/sharded_cases.py --ds tests.settings_sharded

Every job is written on its shard's database and nowhere else, by the API and by a real
``celery worker``; a dispatcher per database (``cron_dispatcher --database``) fires that
database's jobs; executions are counted in a ledger file that neither database holds.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections import Counter
from datetime import datetime, timezone

import pytest
from demo.runner import Processes, child_env, database_url, wait_for_workers
from demo.tasks import noop
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from helpers import wait_until

import cron_at_scale
from cron_at_scale import conf
from cron_at_scale.ids import shard_of_key

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True, databases=["default", "second"])]

FAR = datetime(2090, 1, 1, tzinfo=timezone.utc)  # a fire time no dispatcher reaches in a test
HOME = {"default": range(0, 32), "second": range(32, 64)}


@pytest.fixture(autouse=True, scope="module")
def _sharded_settings():
    if not settings.CRON_AT_SCALE.get("SHARD_DATABASES"):
        pytest.fail("run this file with --ds tests.settings_sharded (tests/acceptance/test_sharded.py does)")


def query(alias: str, text: str, params=()):
    with connections[alias].cursor() as cur:
        cur.execute(text, params)
        return cur.fetchall() if cur.description else None


def jobs_on(alias: str) -> dict:
    """{id: (shard, status, key)} of every job on ``alias``."""
    return {r[0]: r[1:] for r in query(alias, "SELECT id, shard, status, key FROM cron_at_scale_job")}


def test_migrate_makes_the_tables_and_the_wakeup_trigger_on_both():
    for alias in ("default", "second"):
        assert query(alias, "SELECT to_regclass('cron_at_scale_job') IS NOT NULL") == [(True,)]
        assert query(alias, "SELECT count(*) FROM pg_trigger WHERE tgname = 'cron_at_scale_notify_due_v1'") == [(1,)]


def test_each_job_is_written_on_its_shards_database_only():
    many = cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(400)]
                                       + [{"task": "demo.tasks.noop", "key": f"bulk-{i}", "at": FAR} for i in range(40)]
                                       + [{"task": noop, "cron": "0 3 * * *"} for _ in range(40)])
    one = [cron_at_scale.schedule(noop, at=FAR, args=[i]) for i in range(40)]
    keyed = [cron_at_scale.schedule(noop, at=FAR, key=f"one-{i}") for i in range(40)]
    placed = {alias: jobs_on(alias) for alias in HOME}
    for alias, shards in HOME.items():
        assert placed[alias], f"no job on {alias}: the shards were not spread"
        assert all(shard in shards for shard, _, _ in placed[alias].values()), alias
    assert set(placed["default"]).isdisjoint(placed["second"])
    assert {j.id for j in many + one + keyed} == set(placed["default"]) | set(placed["second"])
    for job in many + keyed:
        if job.key:  # a key's shard is the key's, so a key is unique across both databases
            assert job.id.int % 64 == shard_of_key(job.key)
            assert cron_at_scale.schedule(noop, at=FAR, key=job.key).id == job.id
    assert len(jobs_on("default")) + len(jobs_on("second")) == 560  # none written twice


def test_cancel_pause_resume_reschedule_and_requeue_reach_the_jobs_database():
    jobs = [cron_at_scale.schedule(noop, at=FAR, args=[i]) for i in range(24)]
    crons = [cron_at_scale.schedule(noop, cron="0 4 * * *", key=f"c-{i}") for i in range(12)]
    assert {conf.alias_of_job(j.id) for j in jobs} == {"default", "second"}
    assert all(cron_at_scale.cancel(j.id) for j in jobs)
    assert all(cron_at_scale.pause(c.id) for c in crons)
    assert all(cron_at_scale.resume(c.id, missed="skip") for c in crons)
    for c in crons:
        assert cron_at_scale.reschedule(c.key, cron="0 5 * * *").cron_expr == "0 5 * * *"
    placed = {**jobs_on("default"), **jobs_on("second")}
    assert [placed[j.id][1] for j in jobs] == ["cancelled"] * 24
    assert [placed[c.id][1] for c in crons] == ["pending"] * 12
    for alias in HOME:
        query(alias, "UPDATE cron_at_scale_job SET status = 'failed' WHERE status = 'cancelled'")
    assert cron_at_scale.requeue(all_failed=True) == 24  # from both databases


def test_a_dispatcher_needs_database_when_the_shards_are_spread():
    with pytest.raises(CommandError, match="give --database"):
        call_command("cron_dispatcher", "--max-seconds", "0.1", stdout=io.StringIO())
    with pytest.raises(CommandError, match="holds no shards"):
        call_command("cron_dispatcher", "--database", "nope", "--max-seconds", "0.1", stdout=io.StringIO())


@pytest.fixture
def processes(broker, tmp_path):
    """Real dispatcher and worker processes on the test databases, under these settings."""
    env = child_env(database_url(connections["default"].settings_dict), settings.CELERY_BROKER_URL,
                    DJANGO_SETTINGS_MODULE="tests.settings_sharded",
                    SECOND_DATABASE_URL=database_url(connections["second"].settings_dict))
    procs = Processes(env, log_dir=tmp_path / "logs")
    procs.app = broker
    yield procs
    procs.stop()


def test_a_dispatcher_per_database_fires_every_job_once(processes, tmp_path):
    ledger = tmp_path / "ledger"
    processes.worker("w1", concurrency=2)
    wait_for_workers(processes.app, ["w1"])
    processes.dispatcher("d-default", ["--database", "default"])
    processes.dispatcher("d-second", ["--database", "second"])
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.ledger", "args": [str(ledger)]} for _ in range(200)])
    jobs += [cron_at_scale.schedule("demo.tasks.ledger", args=[str(ledger)], countdown=1, key=f"k{i}")
             for i in range(20)]
    ids = {str(j.id) for j in jobs}
    on = {alias: {str(i) for i in jobs_on(alias)} for alias in HOME}
    assert on["default"] and on["second"] and on["default"] | on["second"] == ids

    def completed() -> int:
        return sum(query(a, "SELECT count(*) FROM cron_at_scale_job WHERE status = 'completed'")[0][0] for a in HOME)

    wait_until(lambda: completed() == len(ids), timeout=120, what="every job completed on its database")
    runs = Counter(line.split()[0] for line in ledger.read_text().splitlines())
    assert set(runs) == ids and set(runs.values()) == {1}, "a job ran twice or never"
    for alias in HOME:  # each attempt on its job's database; each dispatcher leased its own shards only
        attempts = query(alias, "SELECT job_id::text, attempt, outcome FROM cron_at_scale_jobattempt")
        assert sorted(attempts) == sorted((i, 1, "succeeded") for i in on[alias])
        leased = query(alias, "SELECT shard, owner FROM cron_at_scale_shardlease WHERE owner <> ''")
        assert leased and {s for s, _ in leased} <= set(HOME[alias])
        assert {o.split(":")[0] for _, o in leased} <= {f"d-{alias}"}


def test_cron_status_adds_up_both_databases_and_shows_each():
    cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(64)])
    cron_at_scale.schedule_many([{"task": noop, "args": [i]} for i in range(30)])  # due now: late, no dispatcher
    on = {alias: len(jobs_on(alias)) for alias in HOME}
    out = io.StringIO()
    call_command("cron_status", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert sum(report["pending"].values()) - report["pending"]["late"] == 94
    assert report["pending"]["late"] == 30
    shown = {d["database"]: d for d in report["databases"]}
    assert set(shown) == set(HOME) and {a: shown[a]["pending"] for a in HOME} == on
    assert shown["default"]["shards"] == "0-31" and shown["second"]["shards"] == "32-63"
    text = io.StringIO()
    call_command("cron_status", stdout=text)
    assert "database second (shards 32-63): pending" in text.getvalue()
    from cron_at_scale.ops import metrics

    scrape = metrics.render().decode()
    assert 'cron_jobs_pending{bucket="later"} 64.0' in scrape


@pytest.fixture
def second_cluster():
    """The private cluster ``second`` is on, to stop and start (test_sharded.py makes it)."""
    directory, port = os.environ.get("SECOND_PG_DIR"), os.environ.get("SECOND_PG_PORT")
    if not directory:
        pytest.skip("second is on DATABASE_URL's server (no SECOND_PG_DIR): no cluster of its own to stop")
    from faults import faultkit

    pg = faultkit.PrivatePostgres.attach(directory, int(port))
    yield pg
    if not (pg.data / "postmaster.pid").exists():
        pg.start()


def test_a_cluster_stopped_leaves_the_other_firing_and_loses_nothing(processes, second_cluster, tmp_path):
    processes.env["CRON_AT_SCALE_SETTINGS"] = json.dumps(
        {"DISPATCH_LEASE": 6.0, "RUN_LEASE": 4.0, "HEARTBEAT_INTERVAL": 1.0, "REAPER_INTERVAL": 0.5,
         "SHARD_LEASE": 3.0, "POLL_INTERVAL": 0.05})
    ledger = tmp_path / "ledger"
    processes.worker("w1", concurrency=4)
    wait_for_workers(processes.app, ["w1"])
    processes.dispatcher("d-default", ["--database", "default"])
    processes.dispatcher("d-second", ["--database", "second"])
    # a stream over 24 s, 8 jobs a second, on both databases
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.ledger", "args": [str(ledger)], "countdown": 3 + i / 8}
                                        for i in range(192)])
    due = {str(j.id): j.fire_at.timestamp() for j in jobs}
    home = {str(j.id): conf.alias_of_job(j.id) for j in jobs}
    assert set(home.values()) == {"default", "second"}
    time.sleep(8)
    stopped = time.time()
    second_cluster.halt("immediate")
    time.sleep(10)
    second_cluster.start()
    back = time.time()
    connections["second"].close()  # this process's session there died with the cluster

    def completed() -> int:
        return sum(query(a, "SELECT count(*) FROM cron_at_scale_job WHERE status = 'completed'")[0][0] for a in HOME)

    wait_until(lambda: completed() == len(jobs), timeout=150, what="every job completed after the restart")
    starts: dict[str, list[float]] = {}
    for line in ledger.read_text().splitlines():
        job_id, _, _, at = line.split()[:4]
        starts.setdefault(job_id, []).append(float(at))
    assert set(starts) == set(due), "a job never ran"
    twice = {j: s for j, s in starts.items() if len(s) > 1}
    assert not twice, f"ran twice: {twice}"
    during = sorted(starts[j][0] - due[j] for j in due if home[j] == "default" and stopped <= due[j] <= back)
    after = sorted(starts[j][0] - due[j] for j in due if home[j] == "second" and stopped <= due[j] <= back)
    assert during and after
    print(f"[sharded] second stopped {back - stopped:.1f} s: {len(during)} jobs of default due meanwhile started "
          f"{during[len(during) // 2]:.3f} s late (median), {during[-1]:.3f} s at most; {len(after)} of second "
          f"ran after its restart, at most {after[-1]:.1f} s late; none twice, none missed")
    assert during[-1] < 5.0, f"default's jobs waited for second's outage: {during[-5:]}"


def test_a_heartbeat_renews_one_databases_leases_while_another_is_down(second_cluster):
    from cron_at_scale.models import JobAttempt
    from cron_at_scale.worker.attempts import BatchCompleter
    from cron_at_scale.worker.middleware.context import JobContext
    from cron_at_scale.worker.middleware.lease import Heartbeat

    jobs = cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(40)])
    one = {alias: next(j for j in jobs if conf.alias_of_job(j.id) == alias) for alias in ("second", "default")}
    hb = Heartbeat()
    for alias, job in one.items():  # second's run first: its failure must not skip default's
        JobAttempt.objects.using(alias).create(job_id=job.id, attempt=1, scheduled_at=job.fire_at,
                                               outcome="running", locked_until=job.fire_at)
        hb.add(JobContext(job_id=job.id, attempt=1, fire_at=job.fire_at, schedule_type="once", retries=0,
                          max_retries=None))
    second_cluster.halt("immediate")
    try:
        with pytest.raises(Exception):  # noqa: B017, PT011 - whichever error the dead connection gives
            hb.beat()
        renewed = JobAttempt.objects.using("default").get(job_id=one["default"].id).locked_until
        assert renewed < FAR, "the heartbeat did not renew the run on the database that is up"
        completer = BatchCompleter()
        for alias, job in one.items():  # and the completions: second's first again
            with conf.using(alias):
                completer.write_later(str(job.id), 1)
        with pytest.raises(Exception):  # noqa: B017, PT011
            completer.flush()
        outcome = JobAttempt.objects.using("default").get(job_id=one["default"].id).outcome
        assert outcome == "succeeded", "the completion on the database that is up was not written"
        assert [d[2] for d in completer.done] == ["second"], completer.done
    finally:
        second_cluster.start()
        connections["second"].close()


def test_the_admin_lists_each_databases_jobs_and_acts_on_a_job_where_it_lives():
    from django.contrib.auth.models import User
    from django.test import Client

    jobs = cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(40)])
    on = {alias: set(jobs_on(alias)) for alias in HOME}
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "x"))
    for alias, query_string in (("default", ""), ("default", "?database=default"), ("second", "?database=second")):
        r = client.get(f"/admin/cron_at_scale/job/{query_string}")
        assert r.status_code == 200
        assert {j.id for j in r.context["cl"].result_list} == on[alias], query_string
    assert "second (shards 32-63)" in r.content.decode()
    far = next(j for j in jobs if conf.alias_of_job(j.id) == "second")
    page = client.get(f"/admin/cron_at_scale/job/{far.id}/change/")
    assert page.status_code == 200 and str(far.id) in page.content.decode()
    form = {"action": "cancel_jobs", "_selected_action": [str(far.id)], "post": "yes"}
    client.post("/admin/cron_at_scale/job/?database=second", form, follow=True)
    assert jobs_on("second")[far.id][1] == "cancelled"
    client.post(f"/admin/cron_at_scale/job/{next(j.id for j in jobs if j.id in on['default'])}/act/cancel_jobs/")
    assert sorted(s for _, s, _ in jobs_on("default").values()).count("cancelled") == 1


def test_the_beat_sync_keeps_each_entry_on_its_keys_database():
    from celery.schedules import crontab

    from cron_at_scale.beat.sync import sync_beat_schedule

    schedule = {f"entry-{i}": {"task": "demo.tasks.noop", "schedule": crontab(minute=i % 60)} for i in range(24)}
    report = sync_beat_schedule(schedule)
    assert sorted(report.created) == sorted(schedule)
    placed = {alias: {key: shard for shard, _, key in jobs_on(alias).values()} for alias in HOME}
    assert placed["default"] and placed["second"]
    for alias, keys in placed.items():
        assert all(shard in HOME[alias] and shard == shard_of_key(key) for key, shard in keys.items())
    again = sync_beat_schedule({name: schedule[name] for name in list(schedule)[:12]})
    assert sorted(again.unchanged) == sorted(list(schedule)[:12])
    assert sorted(again.disabled) == sorted(list(schedule)[12:])  # paused on whichever database holds them
    paused = [key for alias in HOME for _, status, key in jobs_on(alias).values() if status == "paused"]
    assert sorted(paused) == sorted(f"beat:{name}" for name in list(schedule)[12:])
    assert sorted(sync_beat_schedule(schedule).updated) == sorted(list(schedule)[12:])  # back: resumed


def test_the_commands_reach_every_database():
    crons = [cron_at_scale.schedule(noop, cron="0 6 * * *", key=f"cmd-{i}") for i in range(16)]
    far = next(c for c in crons if conf.alias_of_job(c.id) == "second")
    out = io.StringIO()
    call_command("cron_jobs", "--json", "--limit", "100", stdout=out)
    assert {row["id"] for row in json.loads(out.getvalue())} == {str(c.id) for c in crons}
    call_command("cron_pause", far.key, stdout=io.StringIO())
    assert jobs_on("second")[far.id][1] == "paused"
    call_command("cron_resume", str(far.id), stdout=io.StringIO())
    assert jobs_on("second")[far.id][1] == "pending"
    call_command("cron_pause", "--all", "--yes", stdout=io.StringIO())  # every recurring job, both databases
    assert {s for alias in HOME for _, s, _ in jobs_on(alias).values()} == {"paused"}
    call_command("cron_cancel", str(far.id), stdout=io.StringIO())
    assert jobs_on("second")[far.id][1] == "cancelled"
    for alias in HOME:
        query(alias, "UPDATE cron_at_scale_job SET status = 'completed', updated_at = now() - interval '2 days'")
    purged = io.StringIO()
    call_command("cron_purge", "--older-than", "1d", stdout=purged)
    assert "database default: deleted" in purged.getvalue() and "database second: deleted" in purged.getvalue()
    assert jobs_on("default") == {} and jobs_on("second") == {}
