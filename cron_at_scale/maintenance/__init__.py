"""The maintenance loops a dispatcher runs between claims.

``reaper`` (lost leases), ``retention`` (finished jobs purged), ``history`` (a recurring
job's run history bounded), ``overdue`` (a recurring job that has not succeeded in its grace).
Each is a :class:`~cron_at_scale.maintenance.loop.Loop` (``loop``: the interval, the pass,
the error policy), one instance per dispatcher.
"""
