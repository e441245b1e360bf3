"""Settings checks (cron_at_scale.conf.problems): a bad value is named by its key."""

from __future__ import annotations

import pytest

from cron_at_scale import conf


@pytest.mark.parametrize("value", [-1, "60", True, None, float("nan")])
def test_a_bad_trace_child_max_delay_is_named(settings, value):
    settings.CRON_AT_SCALE = {"TRACE_CHILD_MAX_DELAY": value}
    assert any("TRACE_CHILD_MAX_DELAY" in p for p in conf.problems())


@pytest.mark.parametrize("value", [0, 0.5, 60, 86400.0])
def test_a_trace_child_max_delay_of_zero_or_more_seconds_is_fine(settings, value):
    settings.CRON_AT_SCALE = {"TRACE_CHILD_MAX_DELAY": value}
    assert not [p for p in conf.problems() if "TRACE_CHILD_MAX_DELAY" in p]


NUMERIC = sorted(k for k, v in conf.DEFAULTS.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
# settings whose default is None but that take a number of seconds
NUMERIC_OR_NONE = ["HISTORY_AFTER", "RETENTION", "HISTORY_MAX_AGE", "WORKER_STUCK_AFTER", "MAX_QUEUE_WAIT", "ETA_LEAD"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("key", sorted(set(NUMERIC + NUMERIC_OR_NONE)))
def test_a_number_that_is_not_finite_is_refused_once_by_its_key(settings, key, value):
    # NaN fails every comparison and infinity passes every lower bound: a check written as
    # "not value < 0" or "value >= 1" alone would let them through, and the dispatcher would fail later.
    settings.CRON_AT_SCALE = {key: value}
    named = [p for p in conf.problems() if repr(key) in p]
    assert named == [f"CRON_AT_SCALE[{key!r}] must be a finite number, got {value!r}"]


# -- SHARD_DATABASES --------------------------------------------------------------------------------

ALIASES = {"default": {}, "east": {}, "west": {}}


def test_shard_databases_reads_numbers_and_ranges_into_a_map_of_all_64():
    owner, found = conf.parse_shard_databases({"default": ["0-31"], "east": [32, "33 - 62", 63]}, ALIASES)
    assert found == [] and len(owner) == 64
    assert {owner[s] for s in range(32)} == {"default"} and {owner[s] for s in range(32, 64)} == {"east"}
    assert conf.parse_shard_databases({"west": "0-63"}, ALIASES)[0][17] == "west"  # one range as a string


@pytest.mark.parametrize("spec, words", [
    ({"default": ["0-31"], "east": ["31-63"]}, ["shard 31 is on 'east' and on 'default'"]),
    ({"default": ["0-40"], "east": ["20-63"]}, ["shards 20-40 are on 'east' and on 'default'"]),
    ({"default": ["0-31", 5], "east": ["32-63"]}, ["shard 5 is on 'default' twice"]),
    ({"default": ["0-30"], "east": ["32-62"]}, ["shards 31, 63", "on no alias"]),
    ({"default": ["0-9"], "east": ["20-29"]}, ["shards 10-19, 30-63"]),
    ({"nowhere": ["0-63"]}, ["'nowhere'", "not an alias of settings.DATABASES"]),
    ({"default": ["0-64"]}, ["'0-64' goes beyond shard 63"]),
    ({"default": ["40-70"]}, ["'40-70' goes beyond shard 63"]),
    ({"default": ["9-3"]}, ["'9-3' is backwards"]),
    ({"default": [-5, "0-63"]}, ["-5 is below shard 0"]),
    ({"default": ["all"]}, ["'all'", "neither a shard number nor an 'a-b' range"]),
    ({"default": [True]}, ["True", "neither"]),
    ({"default": []}, ["must be a non-empty list"]),
    ({}, ["must be a dict"]),
    (["default"], ["must be a dict"]),
])
def test_shard_databases_names_the_overlap_the_gap_and_the_bad_entry(spec, words):
    owner, found = conf.parse_shard_databases(spec, ALIASES)
    assert owner == {} and found, spec
    assert len(found) <= 2, found  # an overlap or a gap said once, as ranges, not shard by shard
    text = "; ".join(found)
    assert "CRON_AT_SCALE['SHARD_DATABASES']" in text
    for word in words:
        assert word in text, (word, text)


def test_a_bad_shard_databases_is_a_settings_problem(settings):
    settings.CRON_AT_SCALE = {"SHARD_DATABASES": {"default": ["0-62"]}}
    assert any("shard 63 is on no alias" in p for p in conf.problems())
    settings.CRON_AT_SCALE = {"SHARD_DATABASES": {"default": ["0-63"]}}
    assert conf.problems() == [] and conf.shard_aliases() == ["default"]


def test_a_job_belongs_to_its_ids_shard_and_a_keyed_job_to_its_keys(settings, monkeypatch):
    import uuid

    from cron_at_scale.ids import new_job_id, shard_of_key

    spec = {"default": ["0-31"], "east": ["32-63"]}
    settings.CRON_AT_SCALE = {"SHARD_DATABASES": spec}
    owner = conf.parse_shard_databases(spec, ALIASES)[0]
    monkeypatch.setattr(conf, "shard_map", lambda: owner)  # "east" is not an alias of these settings
    assert conf.alias_of_job(uuid.UUID(int=(1 << 100) | 33)) == "east"
    assert conf.alias_of_job(str(uuid.UUID(int=(1 << 100) | 31))) == "default"
    assert {new_job_id(shard=s).int % 64 for s in range(64)} == set(range(64))
    assert shard_of_key("daily-report") == shard_of_key("daily-report")
    assert len({shard_of_key(f"k{i}") for i in range(2000)}) == 64  # keys spread over every shard
    assert conf.shards_of("east") == list(range(32, 64)) and conf.shard_aliases() == ["default", "east"]
    with conf.using("east"):
        assert conf.db_alias() == "east"
    assert conf.db_alias() == "default"
