"""Failpoints: named places where a process can be made to die or stall, for the fault-injection suite.

``CRON_AT_SCALE_FAILPOINTS`` is comma-separated: ``name`` makes the process
``os._exit(137)`` (what ``kill -9`` looks like) when it reaches that point;
``name=stop:PATH`` makes it SIGSTOP itself there (every thread, as a VM pause
would) when the file PATH exists, removing it first, so a test stalls it at
that very point once per file it creates. Unset in production: ``hit()`` is
then one dict lookup.

Points: ``dispatcher.after_claim`` (claim committed, nothing published yet);
``dispatcher.in_claim`` (claim statement done, its rows locked, not committed).
"""

from __future__ import annotations

import os
import signal


def _parse(spec: str) -> dict[str, str]:
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, action = item.partition("=")
        out[name] = action
    return out


_ACTIVE = _parse(os.environ.get("CRON_AT_SCALE_FAILPOINTS", ""))


def hit(name: str) -> None:
    action = _ACTIVE.get(name)
    if action is None:
        return
    if action.startswith("stop:"):
        try:
            os.unlink(action[5:])
        except FileNotFoundError:
            return
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    os._exit(137)
