"""The operator's figures: ``status`` (bounded counts for ``cron_status`` and the dashboard),
``metrics`` (Prometheus), ``identity`` (how a process names itself: ``host:pid``), ``fire_order`` (lists in fire time
order, a merge of each status's index range).
"""
