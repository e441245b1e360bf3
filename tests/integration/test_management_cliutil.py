"""Management commands name their own flags in their errors, never the Python argument names."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command

from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db

PYTHON_NAMES = re.compile(r"\b(all_failed|job_id|max_retries|failed_after|failed_before)\b")


def error_of(*argv) -> str:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as e:
        call_command(*argv, stdout=out, stderr=err)
    return f"{e.value} {err.getvalue()}"


def test_cron_requeue_without_arguments_names_its_flags():
    text = error_of("cron_requeue")
    assert "--all-failed" in text and "JOB_ID" in text and "--task" in text
    assert not PYTHON_NAMES.search(text), text
    out = io.StringIO()
    call_command("cron_requeue", "--all-failed", stdout=out)  # and the flag it names works (as does --all)
    call_command("cron_requeue", "--all", stdout=out)
    assert out.getvalue() == "requeued 0 jobs\nrequeued 0 jobs\n"


@pytest.mark.parametrize(("argv", "flag"), [
    (["cron_requeue", "not-a-uuid"], "JOB_ID: "),
    (["cron_requeue", "--task", ""], "--task: "),
    (["cron_schedule", "demo.tasks.noop", "--max-retries", "5000"], "--max-retries: "),
    (["cron_schedule", "demo.tasks.noop", "--tz", "Mars/Olympus"], "--tz: "),
    (["cron_schedule", "demo.tasks.noop", "--cron", "61 * * * *"], "--cron: "),
    (["cron_schedule", "demo.tasks.noop", "--key", ""], "--key: "),
    (["cron_schedule", "demo.tasks.noop", "--expires", "0"], "--expires: "),
    (["cron_schedule", "no.such.task"], "TASK: "),
    (["cron_cancel", "not-a-uuid"], "JOB_ID: "),
    (["cron_purge", "--older-than", "99999999999d", "--dry-run"], "--older-than: out of range, longer than a century"),
    (["cron_jobs", "--late", "9999999999w"], "--late: out of range, longer than a century"),
])
def test_errors_name_the_commands_flag(argv, flag):
    text = error_of(*argv)
    assert flag in text and not PYTHON_NAMES.search(text), text
    assert Job.objects.count() == 0


def test_cron_schedule_expires():
    out = io.StringIO()
    call_command("cron_schedule", "demo.tasks.noop", "--countdown", "60", "--expires", "30", stdout=out)
    assert Job.objects.get(id=out.getvalue().strip()).options == {"expires": 30}


def test_cron_dispatcher_names_lease_as_its_flag():
    text = error_of("cron_dispatcher", "--lease", "0.5", "--max-seconds", "1")  # LOOKAHEAD is 1 s by default
    assert "--lease (0.5s)" in text and "DISPATCH_LEASE" not in text, text
