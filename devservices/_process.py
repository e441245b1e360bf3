"""Process bookkeeping shared by the embedded servers: owners, locks, socket paths."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

# sockaddr_un.sun_path is 108 bytes on Linux and 104 on macOS, with its NUL.
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    import psutil  # the embedded extra's; imported late so that settings with both URLs set need none of it

    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


class Owner:
    """``<file>`` names the process that started a server and must stop it.

    A process that finds a server running and its owner alive only uses it.
    When the owner died without stopping it (SIGKILL, crash), the next
    process to start the service takes the server over.
    """

    def __init__(self, path: Path):
        self.path = path

    def claim(self) -> None:
        pid = os.getpid()
        self.path.write_text(json.dumps({"pid": pid, "create_time": _create_time(pid)}))

    def alive_owner(self) -> int | None:
        """Pid of the recorded owner if that very process still runs (pid reuse is detected)."""
        try:
            data = json.loads(self.path.read_text())
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not process_alive(pid):
            return None
        created, recorded = _create_time(pid), data.get("create_time")
        if created is not None and recorded is not None and abs(created - float(recorded)) > 1.0:
            return None
        return pid

    def is_me(self) -> bool:
        return self.alive_owner() == os.getpid()

    def release(self) -> None:
        if self.is_me():
            with contextlib.suppress(OSError):
                self.path.unlink()


@contextlib.contextmanager
def dir_lock(data_dir: Path):
    """Serialise start and stop between processes sharing ``data_dir``."""
    with open(data_dir / ".devservices.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def short_dir(preferred: Path, key: str, longest_name: str) -> Path:
    """``preferred`` if ``<preferred>/<longest_name>`` fits a unix socket path and has no
    whitespace, else ``/tmp/cron-at-scale-<uid>/<key>-<hash of preferred>`` (created, mode 700)."""
    candidate = str(preferred / longest_name)
    if len(os.fsencode(candidate)) <= MAX_SOCKET_PATH and not any(c.isspace() for c in candidate):
        return preferred
    digest = hashlib.sha256(os.fsencode(str(preferred))).hexdigest()[:12]
    base = Path("/tmp") / f"cron-at-scale-{os.getuid()}"
    base.mkdir(mode=0o711, exist_ok=True)  # traversable by the server account when root runs it
    path = base / f"{key}-{digest}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
