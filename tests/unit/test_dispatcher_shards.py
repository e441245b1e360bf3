"""The claim's share per shard (ShardHeads): even spread, a skewed backlog, back to even."""

from __future__ import annotations

from cron_at_scale.dispatcher.shards import ShardHeads


def test_the_share_starts_even_grows_for_a_backlogged_shard_and_comes_back():
    heads = ShardHeads(1000)
    assert heads.params(list(range(32))) == {"per_shard": 32}  # ceil(1000 / 32)
    assert heads.learn([s for s in range(32) for _ in range(32)][:1000])  # full batch: claim again
    assert heads.per_shard == 32
    # One shard holds the backlog: 32 of it came back, the batch was short: double, claim again.
    assert heads.learn([7] * 32) and heads.per_shard == 64
    assert heads.learn([7] * 64) and heads.per_shard == 128
    for _ in range(5):
        heads.learn([7] * heads.per_shard)
    assert heads.per_shard == 1000  # never more than a batch
    assert heads.learn([7] * 1000) and heads.per_shard == 1000  # a full batch from one shard: keep
    assert not heads.learn([7] * 10)  # drained: nothing more due, back to the even share
    assert heads.per_shard == 32
    assert not heads.learn([])


def test_the_share_follows_the_shards_held():
    heads = ShardHeads(1000)
    assert heads.params([3]) == {"per_shard": 1000}
    assert heads.params(list(range(64))) == {"per_shard": 16}
    heads.learn([1] * 16)
    assert heads.params(list(range(64))) == {"per_shard": 32}  # kept while the shards stay
    assert heads.params(list(range(10))) == {"per_shard": 100}
