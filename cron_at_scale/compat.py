"""The modules' old paths, from before the code moved into rooms, still import.

``import cron_at_scale.publish`` gives the very module ``cron_at_scale.broker.publish``
(one module object under two names, so a patch through either name holds), with a
:class:`MovedWarning` where the old path goes away in 0.3. Paths that users write in settings
or that ``shared/DESIGN.md`` names (``cron_at_scale.scheduling``) stay, without a warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

# old path (under cron_at_scale) -> (new path, whether the old one stays)
MOVED: dict[str, tuple[str, bool]] = {
    "scheduling": ("api.schedule", True),
    "bulk": ("api.bulk", False),
    "control": ("api.control", False),
    "validation": ("api.validation", False),
    "shards": ("dispatcher.shards", False),
    "floors": ("dispatcher.floors", False),
    "queues": ("dispatcher.backpressure", False),
    "timers": ("dispatcher.timers", False),
    "wakeup": ("dispatcher.wakeup", False),
    "advance": ("dispatcher.advance", False),
    "preload": ("dispatcher.preload", False),
    "failpoints": ("dispatcher.failpoints", False),
    "expiry": ("policy.expiry", False),
    "recurrence": ("policy.recurrence", False),
    "retry": ("policy.retry", False),
    "completer": ("worker.attempts", False),
    "worker_clock": ("worker.clock", False),
    "worker_health": ("worker.health", False),
    "worker_lost": ("worker.lost", False),
    "middleware": ("worker.middleware", False),
    "publish": ("broker.publish", False),
    "publish_amqp": ("broker.amqp", False),
    "dlq": ("broker.dlq", False),
    "reaper": ("maintenance.reaper", False),
    "retention": ("maintenance.retention", False),
    "history": ("maintenance.history", False),
    "overdue": ("maintenance.overdue", False),
    "dst": ("beat.dst", False),
    "db": ("sql", False),
    "status": ("ops.status", False),
    "metrics": ("ops.metrics", False),
    "identity": ("ops.identity", False),
    "app": ("celery_app", False),
}


class MovedWarning(DeprecationWarning):
    """An import through a module's old path."""


def _new_name(fullname: str) -> str | None:
    head, _, rest = fullname.removeprefix("cron_at_scale.").partition(".")
    if not fullname.startswith("cron_at_scale.") or head not in MOVED:
        return None
    new, _stays = MOVED[head]
    return f"cron_at_scale.{new}" + (f".{rest}" if rest else "")


def load(old: str) -> ModuleType:
    """The module at the old path ``cron_at_scale.<old>``, warning where that path goes away."""
    new, stays = MOVED[old]
    if not stays:
        warnings.warn(f"cron_at_scale.{old} is now cron_at_scale.{new}; the old path goes away in 0.3",
                      MovedWarning, stacklevel=3)
    return importlib.import_module(f"cron_at_scale.{new}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        new = _new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        head, _, rest = spec.name.removeprefix("cron_at_scale.").partition(".")
        module = load(head)
        return importlib.import_module(f"{module.__name__}.{rest}") if rest else module

    def exec_module(self, module):
        pass  # the module is the new one, already run


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
