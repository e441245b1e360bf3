"""cron_dispatcher -v 2 in a project without LOGGING: it adds a handler so the batch lines show."""

from __future__ import annotations

import logging

from cron_at_scale.management.commands.cron_dispatcher import _shows


def test_a_logger_whose_only_way_out_is_the_last_resort_handler_shows_no_info():
    root = logging.Logger("root-under-test", logging.WARNING)  # a root of its own: no handlers
    child = logging.Logger("cron_at_scale", logging.INFO)
    child.parent = root
    assert not _shows(child, logging.INFO)
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    root.addHandler(handler)
    assert not _shows(child, logging.INFO)  # a handler that drops INFO does not count
    handler.setLevel(logging.NOTSET)
    assert _shows(child, logging.INFO)
    child.propagate = False
    assert not _shows(child, logging.INFO)


def test_metrics_bind_without_a_port_is_refused_before_anything_starts():
    import pytest
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--metrics-bind needs --metrics-port"):
        call_command("cron_dispatcher", "--metrics-bind", "0.0.0.0")
