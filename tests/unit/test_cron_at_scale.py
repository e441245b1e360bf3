"""The lazy wrappers in cron_at_scale keep the signatures (and so the type hints) of what they wrap."""

from __future__ import annotations

import inspect

import pytest

import cron_at_scale
from cron_at_scale import worker
from cron_at_scale.api import schedule as scheduling


@pytest.mark.parametrize("name", ["schedule", "reschedule", "schedule_many", "cancel", "requeue", "pause",
                                  "resume"])
def test_wrapper_has_the_signature_of_the_scheduling_function(name):
    wrapper, wrapped = getattr(cron_at_scale, name), getattr(scheduling, name)
    assert wrapper is not wrapped  # a wrapper, so importing cron_at_scale needs no app registry
    assert inspect.signature(wrapper) == inspect.signature(wrapped)


def test_the_rest_of_the_public_api_is_the_thing_itself():
    assert cron_at_scale.JobTask is worker.JobTask and cron_at_scale.current_job is worker.current_job
    assert set(cron_at_scale.__all__) >= {"schedule", "schedule_many", "cancel", "requeue", "pause", "resume",
                                          "JobTask", "RetryableError", "ValidationError", "current_job"}
    with pytest.raises(AttributeError):
        cron_at_scale.no_such_name  # noqa: B018
