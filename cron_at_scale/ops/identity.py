"""How a process names itself in the database: ``host:pid``.

Dispatchers write it in ``locked_by`` and shard leases, workers in the
attempt log and their health rows; an operator reading either finds the
process on its host.
"""

from __future__ import annotations

import os
import socket


def process_name() -> str:
    """This process's name, ``"<hostname>:<pid>"``."""
    return f"{socket.gethostname()}:{os.getpid()}"
