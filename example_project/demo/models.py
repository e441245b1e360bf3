from django.db import models
from django.db.models.functions import Now


class Execution(models.Model):
    """One row per execution of ``demo.tasks.record``: the demo's own count,
    independent of the scheduler's bookkeeping."""

    job_id = models.UUIDField(null=True)
    attempt = models.IntegerField(null=True)
    executed_at = models.DateTimeField(db_default=Now())  # database clock
    pid = models.IntegerField()
    occurrence = models.DateTimeField(null=True)  # the run's nominal occurrence, from current_job()

    class Meta:
        db_table = "demo_execution"
        indexes = [models.Index(fields=["job_id", "attempt"], name="demo_exec_job_attempt")]
