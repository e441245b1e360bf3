"""Pure policies: functions of their arguments, no database, no clock of their own.

``recurrence`` (which occurrences fire: catch-up, overlap, jitter), ``retry`` (the next
attempt's delay, or none), ``expiry`` (Celery's ``expires``).
"""
