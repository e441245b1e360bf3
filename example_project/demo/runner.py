"""Start and stop the processes of a local cron_at_scale system (dispatchers, Celery workers).

Used by ``manage.py demo``, the benchmark and the acceptance tests: each child
gets ``DATABASE_URL`` and ``CELERY_BROKER_URL`` so that it connects to the
same services as the parent (embedded ones included) and starts none itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlencode

PROJECT_DIR = Path(__file__).resolve().parent.parent  # example_project/
REPO_DIR = PROJECT_DIR.parent


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for Django's ``DATABASES`` entry (what a child process needs).

    Host and port go in the query (libpq's form), which also carries a unix
    socket directory, several hosts (``h1,h2``) and the string OPTIONS
    (sslmode, target_session_attrs, ...).
    """
    user = quote(settings_dict.get("USER") or "", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    query = [(key.lower(), str(settings_dict[key])) for key in ("HOST", "PORT") if settings_dict.get(key)]
    query += [(k, str(v)) for k, v in (settings_dict.get("OPTIONS") or {}).items() if isinstance(v, str | int)]
    name = quote(settings_dict["NAME"], safe="")
    return f"postgresql://{auth}/{name}" + (f"?{urlencode(query, safe='/,')}" if query else "")


def child_env(db_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=db_url,
        CELERY_BROKER_URL=broker_url,
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONPATH=os.pathsep.join([str(REPO_DIR), str(PROJECT_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    env.update(extra)
    return env


class Processes:
    """The children of one run; ``stop()`` ends them all (SIGTERM, then SIGKILL)."""

    def __init__(self, env: dict[str, str], log_dir: Path | None = None):
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        if self.log_dir is None:
            proc = subprocess.Popen(args, cwd=PROJECT_DIR, env=self.env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        else:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / f"{name}.log", "ab") as out:  # the child has its own copy of the descriptor
                proc = subprocess.Popen(args, cwd=PROJECT_DIR, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def worker(self, name: str, concurrency: int = 1, pool: str = "prefork", extra: list[str] | None = None):
        """Start ``celery -A example_project worker`` named ``name``."""
        args = [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-n", f"{name}@%h",
                "-c", str(concurrency), "-P", pool, "--without-mingle", "--without-gossip", "-l", "warning",
                *(extra or [])]
        return self._spawn(args, name)

    def dispatcher(self, name: str, extra: list[str] | None = None):
        """Start ``manage.py cron_dispatcher`` named ``name``."""
        args = [sys.executable, "manage.py", "cron_dispatcher", "--name", name, "-v", "0", *(extra or [])]
        return self._spawn(args, name)

    def stop(self, timeout: float = 15.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


def wait_for_workers(app, names: list[str], timeout: float = 60.0) -> None:
    """Block until every worker in ``names`` answers a ping; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    want = set(names)
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=0.5) or []
        seen = {next(iter(r)).split("@")[0] for r in replies}
        if want <= seen:
            return
    raise TimeoutError(f"Celery workers {sorted(want)} did not answer within {timeout:.0f}s")
