"""Django signals of cron_at_scale, for a project's own alerting (connect a receiver in ``AppConfig.ready``).

Both are sent by a dispatcher (:mod:`cron_at_scale.maintenance.overdue`), from its process, with
``sender`` the :class:`~cron_at_scale.models.Job` model, after the database recorded the
change: once per overdue episode, whatever the number of dispatchers. A receiver that raises
is logged and does not stop the dispatcher (``send_robust``); a slow one delays its loop.

* ``job_overdue(sender, job, expected_at, late_seconds, grace)``: ``job`` (a ``Job``) has not
  succeeded for the occurrence it was due at ``expected_at`` (aware UTC) within ``grace``
  seconds; ``late_seconds``: seconds since ``expected_at`` when the dispatcher saw it.
* ``job_recovered(sender, job, overdue_since, reason, last_success_at)``: the episode that
  began at ``overdue_since`` ended; ``reason``: ``"succeeded"`` (a run succeeded),
  ``"paused"``, ``"ended"`` (cancelled; a deleted job sends nothing), or
  ``"not due"`` (its due occurrences were skipped by its catch-up policy, or it was rescheduled).
"""

from __future__ import annotations

from django.dispatch import Signal

job_overdue = Signal()
job_recovered = Signal()
