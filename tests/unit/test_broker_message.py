"""The parts of Celery's protocol 2 the fast paths write themselves (cron_at_scale.broker.message):
``argrepr`` is what ``send_task`` writes as ``argsrepr``/``kwargsrepr`` (Celery's saferepr)."""

from __future__ import annotations

import random

import pytest
from celery.utils.saferepr import saferepr

from cron_at_scale.broker.message import REPR_MAX, argrepr

STRINGS = ["", "x", "ü😀", "q'", 'q"', "a\\b", "q'\"", "\n\t", "\x00", "b" * 600, "b" * 1100, "\udcff"]
SCALARS = [None, True, False, 0, -5, 2**70, 1.5, 1e300, float("inf"), float("nan"), *STRINGS]


def json_like(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 6 and r < 0.3:
        return [json_like(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 6 and r < 0.5:
        return {rng.choice(STRINGS[:6]) + str(i): json_like(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return rng.choice(SCALARS)


@pytest.mark.parametrize("maxlevels", [1, 3, 5])
def test_argrepr_is_celerys_saferepr_of_json_like_arguments(maxlevels):
    rng = random.Random(maxlevels)
    for _ in range(3000):
        v = json_like(rng)
        v = v if isinstance(v, (list, dict)) else [v]
        assert argrepr(v, maxlevels) == saferepr(v, REPR_MAX, maxlevels=maxlevels), v


@pytest.mark.parametrize("value", [[1, "two", None], {"x": [1.5, {"y": True}]}, (), {}])
def test_argrepr_of_short_plain_arguments_is_their_repr(value):
    assert argrepr(value, 3) == repr(value)
