"""``manage.py cron_dispatcher``: run a dispatcher until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import math
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from cron_at_scale.dispatcher import Dispatcher


def _positive(kind, maximum):
    def parse(text):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
        if not math.isfinite(value) or not 0 < value <= maximum:
            raise argparse.ArgumentTypeError(f"must be greater than 0 and at most {maximum}, got {text[:40]!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _seconds(text, maximum=60):
    try:
        value = float(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise argparse.ArgumentTypeError(f"must be from 0 to {maximum} seconds, got {text[:40]!r}")
    return value


def _preload(text):
    return _seconds(text, 600)


def _name(text):
    if not text or len(text) > 200 or "\x00" in text:
        raise argparse.ArgumentTypeError("must be 1 to 200 characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("must be valid UTF-8") from None
    return text


class Command(BaseCommand):
    help = (
        "Run a dispatcher: claim due jobs from the database in batches and publish them to the "
        "Celery broker; also return expired leases to their jobs (the reaper). Run one or more "
        "(they never claim the same job twice). Stops cleanly on SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=_positive(int, 100_000),
                            help="jobs claimed per statement (default: CRON_AT_SCALE['BATCH_SIZE'], 1000)")
        parser.add_argument("--poll-interval", type=_positive(float, 3600),
                            help="seconds to sleep when nothing is due (default: CRON_AT_SCALE['POLL_INTERVAL'], 0.1)")
        parser.add_argument("--lease", type=_positive(float, 86_400),
                            help="dispatch lease in seconds (default: CRON_AT_SCALE['DISPATCH_LEASE'], 30)")
        parser.add_argument("--eta-lead", type=_seconds,
                            help="seconds before its fire_at a held run is published, with Celery's eta "
                                 "(default: CRON_AT_SCALE['ETA_LEAD']; 0: at its fire_at, no eta)")
        parser.add_argument("--preload", type=_preload,
                            help="seconds ahead it looks for bursts to claim early (default: "
                                 "CRON_AT_SCALE['PRELOAD'], 60; 0: off)")
        parser.add_argument("--name", type=_name, help="this dispatcher's name in locked_by (default host:pid)")
        parser.add_argument("--shards", default="auto", choices=["auto", "all"],
                            help="auto: share the 64 shards with the other dispatchers through leases "
                                 "(default); all: claim from every shard, taking no lease")
        parser.add_argument("--database", metavar="ALIAS",
                            help="with CRON_AT_SCALE['SHARD_DATABASES']: the database (an alias of it) whose "
                                 "shards this dispatcher claims; run one or more per database (default: the "
                                 "only one, else required)")
        parser.add_argument("--max-seconds", type=_positive(float, 10**9), help="exit after this many seconds (for tests)")
        parser.add_argument("--metrics-port", type=_positive(int, 65535),
                            help="serve Prometheus metrics on this port (http://BIND:PORT/metrics)")
        parser.add_argument("--metrics-bind", default=None, metavar="ADDRESS",
                            help="address the metrics server listens on (default 127.0.0.1, this host only; "
                                 "0.0.0.0 or :: for a scraper elsewhere, with CRON_AT_SCALE['METRICS_TOKEN'])")

    def handle(self, *args, **opts):
        from cron_at_scale import conf

        alias = self._database(opts["database"])
        if alias is None:
            return self._run(opts)
        conf.pin_alias(alias)  # every statement of this process (its threads too) on that database
        try:
            return self._run(opts)
        finally:
            conf.pin_alias(None)  # an in-process call (a test, call_command) leaves nothing behind

    def _run(self, opts):
        if opts["metrics_bind"] is not None and not opts["metrics_port"]:
            raise CommandError("--metrics-bind needs --metrics-port")
        level = logging.INFO if opts["verbosity"] >= 2 else logging.WARNING
        logger = logging.getLogger("cron_at_scale")
        logger.setLevel(level)
        if level == logging.INFO and not _shows(logger, logging.INFO):
            # A project without LOGGING has only Python's last-resort handler (warnings and up):
            # -v 2 would print nothing more.
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
        try:
            dispatcher = Dispatcher(name=opts["name"], batch_size=opts["batch_size"],
                                    poll_interval=opts["poll_interval"], lease=opts["lease"], shards=opts["shards"],
                                    eta_lead=opts["eta_lead"], preload=opts["preload"])
        except Exception as e:  # a broken configuration, said plainly
            text = str(e)
            if opts["lease"] is not None and "DISPATCH_LEASE" in text:  # the value came from this flag
                text = text.replace("CRON_AT_SCALE['DISPATCH_LEASE']", "--lease")
            raise CommandError(f"cannot start the dispatcher: {text}") from e
        if opts["metrics_port"]:
            from cron_at_scale.ops import metrics

            try:
                metrics.serve(opts["metrics_port"], opts["metrics_bind"] or metrics.DEFAULT_BIND)
            except OSError as e:
                raise CommandError(f"--metrics-port {opts['metrics_port']} / --metrics-bind "
                                   f"{opts['metrics_bind'] or metrics.DEFAULT_BIND}: cannot listen there: {e}") from None
        dispatcher.install_signal_handlers()
        if opts["verbosity"] >= 1:
            self.stdout.write(f"dispatcher {dispatcher.name} running (Ctrl-C to stop)")
        try:
            dispatcher.run(max_seconds=opts["max_seconds"])
        except DatabaseError as e:
            raise CommandError(f"the dispatcher stopped on a database error: {e}") from e
        if opts["verbosity"] >= 1:
            self.stdout.write(f"dispatcher {dispatcher.name} stopped: {dispatcher.published_total} jobs published")

    def _database(self, alias: str | None) -> str | None:
        """The database this dispatcher serves: ``--database``, or the only one of
        ``SHARD_DATABASES``; None when that setting is unset (``DATABASE``, as always)."""
        from cron_at_scale import conf

        try:
            sharded = conf.shard_map() is not None
            homes = conf.shard_aliases()
        except Exception as e:  # a bad SHARD_DATABASES, said plainly
            raise CommandError(f"cannot start the dispatcher: {e}") from e
        if alias is None:
            if len(homes) > 1:
                raise CommandError(f"CRON_AT_SCALE['SHARD_DATABASES'] spreads the shards over {', '.join(homes)}: "
                                   "give --database ALIAS, and run a dispatcher for each of them")
            return homes[0] if sharded else None
        if alias not in homes:
            raise CommandError(f"--database {alias!r} holds no shards (the databases that do: {', '.join(homes)})")
        return alias if sharded else None


def _shows(logger: logging.Logger, level: int) -> bool:
    """True if a handler on ``logger``'s way up would emit a record of ``level``."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(h.level <= level for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False
