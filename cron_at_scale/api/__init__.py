"""The producer's API behind ``cron_at_scale.schedule()`` and its kin.

``schedule`` (one job, ``reschedule``), ``bulk`` (``schedule_many``), ``control``
(cancel, requeue, pause, resume, a change in place), ``validation`` (every argument's check).
"""
