"""The job store's shape on PostgreSQL: partial index, UUID keys, timestamptz, and the claim's plan."""

from __future__ import annotations

import json

import pytest
from helpers import RecordingPublisher, claim_plan, is_claim, sql

import cron_at_scale
from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db

NOTHING_HELD = {"held_queues": [], "held_blank": False, "blank_tasks": []}


def test_the_claims_index_is_partial_on_shard_and_fire_at():
    (indexdef,), = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'cron_job_pending_shard'")
    assert "(shard, fire_at)" in indexdef
    assert "WHERE ((status)::text = 'pending'::text)" in indexdef


def test_autovacuum_visits_the_job_table_once_one_percent_of_its_rows_are_dead():
    (options,), = sql("SELECT reloptions FROM pg_class WHERE relname = 'cron_at_scale_job'")
    assert "autovacuum_vacuum_scale_factor=0.01" in (options or []), options


def test_ids_are_uuid_and_times_are_timestamptz():
    cols = dict(sql("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'cron_at_scale_job'"))
    assert cols["id"] == "uuid"
    for name in ("fire_at", "locked_until", "created_at", "updated_at"):
        assert cols[name] == "timestamp with time zone", name
    cols = dict(sql("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'cron_at_scale_jobattempt'"))
    for name in ("scheduled_at", "dispatched_at", "started_at", "finished_at", "locked_until"):
        assert cols[name] == "timestamp with time zone", name


def test_attempt_log_is_unique_per_job_and_attempt():
    (indexdef,), = sql("SELECT indexdef FROM pg_indexes WHERE indexname = 'cron_attempt_job_attempt'")
    assert "UNIQUE" in indexdef and "(job_id, attempt)" in indexdef


def test_claim_walks_the_shard_index_beside_many_future_jobs():
    # 50,000 future jobs and 200 due ones: the claim must not scan the table.
    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status)
        SELECT gen_random_uuid(), 'once', now() + (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending'
        FROM generate_series(1, 50000) g
    """)
    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status)
        SELECT gen_random_uuid(), 'once', now() - (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending'
        FROM generate_series(1, 200) g
    """)
    sql("ANALYZE cron_at_scale_job")
    params = {"limit": 1000, "dispatcher": "t", "lease": 30.0, "lookahead": 1.0, **NOTHING_HELD}
    for shards in (list(range(64)), [3, 7]):  # every shard, or a few
        # with the claim's settings and its generic plan, as it runs
        plan = "\n".join(claim_plan({**params, "shards": shards, "floors": [None] * len(shards),
                                     "per_shard": 1000 // len(shards)}))
        assert "Index Scan using cron_job_pending_shard on cron_at_scale_job" in plan, plan
        assert "Seq Scan on cron_at_scale_job" not in plan, plan


def _claim_plans(plans: list[dict]):
    """A Django execute wrapper that appends to ``plans`` the plan of each claim it sees (``EXPLAIN
    (ANALYZE, BUFFERS, FORMAT JSON)``, its effects undone), then runs the claim."""
    def explain(execute, query, params, many, context):
        if is_claim(query):
            cur = context["cursor"]
            execute("SAVEPOINT explained", None, False, context)
            execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, many, context)
            plans.append(cur.fetchone()[0][0]["Plan"])
            execute("ROLLBACK TO SAVEPOINT explained", None, False, context)
        return execute(query, params, many, context)
    return explain


@pytest.mark.django_db(transaction=True)
def test_the_claim_keeps_one_generic_plan_that_stays_on_the_indexes_as_the_table_grows():
    # The claim is a prepared statement, planned once for many claims (its generic plan), never per
    # claim. That plan is made at the dispatcher's first claim, here while the table is empty; 50,000
    # future and 200 due jobs later (no ANALYZE since, which would make PostgreSQL plan it again) the
    # same plan still reaches the rows by index: reading about the due ones, no scan of the table.
    from django.db import connection

    from cron_at_scale.dispatcher import Dispatcher

    d = Dispatcher(name="t", shards="all", publisher=RecordingPublisher())
    plans: list[dict] = []
    explain = _claim_plans(plans)

    try:
        assert d.claim() == []
        sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
               SELECT gen_random_uuid(), statement_timestamp() + interval '1 hour' + g * interval '1 second', 'demo.tasks.noop',
                      '{}', '{}'
               FROM generate_series(1, 50000) AS g""")
        _due_in_shards(200, 0, 63)
        with connection.execute_wrapper(explain):
            assert len(d.claim()) == 200
        (generic, custom), = sql("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                 "WHERE name = 'cas_claim'")
    finally:
        d.close()
    assert (generic >= 2, custom) == (True, 0)  # the first claim's plan, used again: never one per claim
    scans = json.dumps(plans[-1])
    assert '"Seq Scan"' not in scans and '"Bitmap Heap Scan"' not in scans, plans[-1]
    assert _scan_rows(plans[-1]) <= 200 + 64, plans[-1]


def _due_in_shards(n: int, first: int, last: int, ago: str = "10 minutes") -> None:
    """``n`` due one-off jobs spread over shards ``first``..``last`` (a job's shard is the low 6 bits
    of its id's last byte: that byte is set here)."""
    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
           SELECT overlay(gen_random_uuid()::text placing lpad(to_hex(%s + g %% %s), 2, '0') from 35 for 2)::uuid,
                  statement_timestamp() - random() * %s::interval, 'demo.tasks.noop', '{}', '{}'
           FROM generate_series(1, %s) AS g""", [first, last - first + 1, ago, n])


def _scan_rows(node: dict) -> int:
    """Rows the claim's search for due jobs read from the job table (its scans: rows returned plus rows
    filtered out, over all loops); the update that follows reads the claimed rows by primary key."""
    if node.get("Subplan Name") == "CTE claimed":
        return 0
    own = 0
    if node.get("Relation Name") == "cron_at_scale_job" and "Scan" in node["Node Type"]:
        own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
    return own + sum(_scan_rows(child) for child in node.get("Plans", []))


@pytest.mark.django_db(transaction=True)
def test_the_claim_reads_no_backlog_of_shards_it_does_not_hold(monkeypatch):
    # A stalled peer holds shards 32-63 and 87,000 jobs of theirs are due; this dispatcher holds
    # 0-31. Its claim, as it sends it (its transaction, its settings, its parameters), EXPLAINed
    # with ANALYZE: what it reads must not grow with the peer's backlog (it read all of it, 87,000
    # index entries and rows, per poll, when the shards' due rows were filtered out of a fire_at walk).
    from django.db import connection

    from cron_at_scale import sql as db
    from cron_at_scale.dispatcher import Dispatcher

    _due_in_shards(87_000, 32, 63)
    sql("ANALYZE cron_at_scale_job")
    db.run("ensure_shards", {"shards": list(range(64))}, fetch="count")
    sql("UPDATE cron_at_scale_shardlease SET owner = 'stalled', expires_at = now() + interval '1 hour' WHERE shard >= 32")
    sql("INSERT INTO cron_at_scale_dispatcherheartbeat (name, last_seen, shards) VALUES ('stalled', now(), '[]')")
    d = Dispatcher(name="mine", batch_size=1000, publisher=RecordingPublisher())
    d.shards.refresh()
    assert d.shards.owned == set(range(32))
    plans: list[dict] = []

    def explain(execute, query, params, many, context):
        if is_claim(query):
            cur = context["cursor"]
            execute("SHOW enable_sort", None, False, context)
            assert cur.fetchone()[0] == "off"  # inside the claim's transaction, after claim_settings
            execute("SAVEPOINT explained", None, False, context)  # what ANALYZE ran is undone
            execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, many, context)
            plans.append(cur.fetchone()[0][0])
            execute("ROLLBACK TO SAVEPOINT explained", None, False, context)
        return execute(query, params, many, context)

    try:
        with connection.execute_wrapper(explain):
            assert d.claim() == []
            plan = plans[-1]["Plan"]
            assert _scan_rows(plan) == 0, plans[-1]
            assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < 500, plans[-1]  # 87,236 before

            # With its own backlog too: it reads about a batch, not every due row of its shards.
            _due_in_shards(20_000, 0, 31)
            got = d.claim()
            assert len(got) == 1000 and d.more_due
            assert _scan_rows(plans[-1]["Plan"]) <= 1000 + 32, plans[-1]
    finally:
        d.close()
    assert not Job.objects.filter(status="in_progress", shard__gte=32).exists()


def test_the_claim_does_not_reread_the_jobs_it_claimed_behind_an_old_transaction(monkeypatch):
    # 30 batches of 1,000 due jobs claimed inside one transaction older than every claim (this
    # test's own, as an idle session in a transaction would hold the horizon): the pending versions
    # they leave in the (shard, fire_at) index can be neither removed nor marked dead. The next
    # claim starts each shard at its floor (ShardFloors): it reads about a batch, not the 30,000
    # claimed before it (which it read, a heap page per entry, at every claim).
    from django.db import connection

    from cron_at_scale.dispatcher import Dispatcher

    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
           SELECT gen_random_uuid(), statement_timestamp() - interval '100 seconds' + g * interval '2 ms',
                  'demo.tasks.noop', '{}', '{}'
           FROM generate_series(1, 40000) AS g""")
    sql("ANALYZE cron_at_scale_job")
    d = Dispatcher(name="mine", batch_size=1000, shards="all", publisher=RecordingPublisher())
    d.shards.floors.sweep = 3600.0  # no sweep during the test (the first claim has no floor)
    plans: list[dict] = []
    explain = _claim_plans(plans)

    def buffers(node: dict) -> int:  # of the search for due rows (its scans of the job table)
        if node.get("Subplan Name") == "CTE claimed":
            return 0
        if node.get("Relation Name") == "cron_at_scale_job" and "Scan" in node["Node Type"]:
            return node["Shared Hit Blocks"] + node["Shared Read Blocks"]
        return sum(buffers(child) for child in node.get("Plans", []))

    try:
        for _ in range(30):
            assert len(d.claim()) == 1000
        with connection.execute_wrapper(explain):
            assert len(d.claim()) == 1000
            with_floors = buffers(plans[-1])
            d.shards.floors.reset()  # the sweep: one claim from the start of each shard
            assert len(d.claim()) == 1000
            without = buffers(plans[-1])
    finally:
        d.close()
    assert with_floors < 2000, plans[-2]  # 955 here; the claims before it: 24,018
    assert without > 10 * with_floors, (with_floors, without)


@pytest.mark.parametrize("held", [
    {"held_queues": ["dead"], "held_blank": False, "blank_tasks": []},
    {"held_queues": ["dead", "celery"], "held_blank": True, "blank_tasks": ["demo.tasks.noop"]},
    {"held_queues": [], "held_blank": False, "blank_tasks": ["demo.tasks.record", "demo.tasks.noop"]},
])
def test_the_claim_with_held_queues_still_walks_the_shard_index(held):
    # 20,000 due jobs, half for a held queue, 50,000 future ones; statistics taken. Read with the
    # claim's own settings (claim_settings: SET LOCAL in the claim's transaction), as it runs.
    sql("""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status, queue)
        SELECT gen_random_uuid(), 'once', now() + (g || ' seconds')::interval, 'demo.tasks.noop',
               '{"args": [], "kwargs": {}}', '{}', 'pending', CASE WHEN mod(g, 2) = 0 THEN 'dead' ELSE '' END
        FROM generate_series(-20000, 50000) g
    """)
    sql("ANALYZE cron_at_scale_job")
    params = {"limit": 1000, "dispatcher": "t", "lease": 30.0, "lookahead": 1.0, "shards": list(range(64)),
              "floors": [None] * 64, "per_shard": 16, **held}
    plan = "\n".join(claim_plan(params))
    assert "Index Scan using cron_job_pending_shard on cron_at_scale_job" in plan, plan
    assert "Seq Scan on cron_at_scale_job" not in plan, plan
    # one sort: of the shards' heads (a batch and a few rows), never of a shard's due rows
    assert [ln.strip() for ln in plan.splitlines() if "Sort Key" in ln] == ["Sort Key: h.fire_at"], plan


def _indexed_columns(table: str) -> set[str]:
    """Every column an index of ``table`` depends on: its keys, expressions and predicate (what
    decides whether PostgreSQL can make an update HOT)."""
    return {name for (name,) in sql("""
        WITH cols AS (
            SELECT i.indrelid, k.attnum FROM pg_index AS i, unnest(i.indkey) AS k(attnum)  -- keys
            WHERE i.indrelid = %(t)s::regclass
            UNION
            SELECT i.indrelid, d.refobjsubid FROM pg_index AS i  -- expressions and predicates
            JOIN pg_depend AS d ON d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
                               AND d.refobjid = i.indrelid AND d.refobjsubid > 0
            WHERE i.indrelid = %(t)s::regclass)
        SELECT DISTINCT a.attname FROM cols JOIN pg_attribute AS a ON a.attrelid = cols.indrelid
                                                                  AND a.attnum = cols.attnum""", {"t": table})}


def _attempt_rows(job_ids) -> dict:
    rows = sql("SELECT to_jsonb(a) FROM cron_at_scale_jobattempt AS a WHERE job_id = ANY(%s::uuid[])",
               [[str(j) for j in job_ids]])
    rows = [json.loads(r) if isinstance(r, str) else r for (r,) in rows]
    return {(r["job_id"], r["attempt"]): r for r in rows}


def test_an_attempts_start_and_its_heartbeats_change_no_indexed_column():
    # No index of the attempt table depends on a column a start or a heartbeat changes (the lease's
    # end, locked_until, above all), so PostgreSQL can make both HOT updates: no index entry, when
    # the row's page has room. An index on any of them makes every start and every heartbeat
    # write an entry in each index of the table. The columns are those the real statements change.
    from cron_at_scale import conf
    from cron_at_scale import sql as db
    from cron_at_scale.dispatcher import Dispatcher
    from cron_at_scale.worker import attempts

    jobs = [cron_at_scale.schedule("demo.tasks.noop") for _ in range(3)]
    Dispatcher(name="t", publisher=RecordingPublisher()).claim()
    ids = [j.id for j in jobs]
    before = _attempt_rows(ids)
    attempts.write(str(jobs[0].id), 1, "w1", "00000000-0000-0000-0000-000000000001", [])
    rows = attempts.write_many([(str(jobs[1].id), 1, "00000000-0000-0000-0000-000000000002"),
                                (str(jobs[2].id), 1, "00000000-0000-0000-0000-000000000003")], "w2")
    assert [r.outcome for r in rows] == ["running", "running"]
    started = _attempt_rows(ids)
    sql("SELECT pg_sleep(0.002)")  # the heartbeat's lease then ends later than the start's
    db.run("heartbeat", {"lease": float(conf.get("RUN_LEASE")), "job_ids": [str(j) for j in ids],
                         "attempts": [1, 1, 1]})
    renewed = _attempt_rows(ids)
    changed = {c for k in before for c in before[k] if before[k][c] != started[k][c]}
    assert {"outcome", "started_at", "locked_until", "worker", "run_token"} <= changed, changed
    renewing = {c for k in started for c in started[k] if started[k][c] != renewed[k][c]}
    assert renewing == {"locked_until"}, renewing
    indexed = _indexed_columns("cron_at_scale_jobattempt")
    assert {"id", "job_id", "attempt", "finished_at"} <= indexed, indexed  # the reading is sound
    assert not (changed | renewing) & indexed, f"indexed columns a start or a heartbeat changes: {(changed | renewing) & indexed}"


@pytest.mark.django_db(transaction=True)
def test_the_starts_of_a_claimed_batch_stay_on_their_rows_pages():
    # The claim inserts a batch's attempt rows together, page after page; the starts come after, in
    # the worker's batches, each its own transaction. The table's fillfactor leaves each page room
    # for its rows' started versions, so every start is a HOT update: the new version stays on the
    # row's page (a start changes no indexed column, above, so a version that moved to another page
    # was written with an entry in every index). At the default fillfactor of 100, 54 of the 240
    # moved.
    from cron_at_scale.dispatcher import Dispatcher
    from cron_at_scale.worker import attempts

    (options,), = sql("SELECT reloptions FROM pg_class WHERE relname = 'cron_at_scale_jobattempt'")
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.noop"} for _ in range(240)])
    ids = [str(j.id) for j in jobs]
    d = Dispatcher(name="t", publisher=RecordingPublisher())
    while d.claim():
        pass

    def pages() -> dict:
        rows = sql("SELECT job_id::text, (ctid::text::point)[0] FROM cron_at_scale_jobattempt "
                   "WHERE job_id = ANY(%s::uuid[])", [ids])
        return dict(rows)

    before = pages()
    assert len(before) == len(ids) and len(set(before.values())) >= 4, (options, before)  # several pages filled
    for i in range(0, len(ids), 8):
        rows = attempts.write_many([(j, 1, f"00000000-0000-0000-0000-{n:012d}") for n, j in
                                    enumerate(ids[i:i + 8], start=i)], "w1")
        assert [r.outcome for r in rows] == ["running"] * len(rows) and rows, rows
    after = pages()
    moved = sorted(j for j in ids if after[j] != before[j])
    # none moved in quiet runs; a page is pruned of the earlier starts' dead versions only if no other
    # session's snapshot still sees them, so a busy server may move a few
    assert len(moved) <= len(ids) // 20, f"{len(moved)} of {len(ids)} starts left their row's page (reloptions {options})"


def test_an_attempts_start_is_a_hot_update_when_its_page_has_room():
    # The same, as PostgreSQL counts it, on a page of its own with room (a table filled by earlier
    # tests may leave the new rows on a full page, where no update is HOT).
    sql("CREATE TEMPORARY TABLE hot_probe (LIKE cron_at_scale_jobattempt INCLUDING ALL) ON COMMIT DROP")
    sql("""INSERT INTO hot_probe (job_id, attempt, scheduled_at, dispatched_at, locked_until, outcome)
           SELECT gen_random_uuid(), 1, now(), now(), now() + interval '30 seconds', 'dispatched'""")
    sql("""UPDATE hot_probe SET started_at = now(), outcome = 'running', worker = 'w', run_token = gen_random_uuid(),
                  locked_until = now() + interval '60 seconds'""")
    sql("UPDATE hot_probe SET locked_until = now() + interval '61 seconds'")
    ((upd, hot),) = sql("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_all_tables WHERE relid = 'hot_probe'::regclass")
    assert (upd, hot) == (2, 2)
