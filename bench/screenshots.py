"""Take the docs' screenshots: ``python bench/screenshots.py --db cron_admin_bench`` (a database
filled by ``bench/admin_10m.py``). Starts ``runserver`` with ``bench/screenshot_settings.py``
(auto-login from localhost: screenshots only) and headless Chromium (Debian's ``chromium``): the admin
as it looks at 10M rows. The docs' screenshots are the browser tests' (a small scene with late,
failed, held and beat jobs): ``ADMIN_SCREENSHOTS=docs make test PYTEST_ARGS=tests/browser``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="cron_admin_bench")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    base = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres").rsplit("/", 1)[0]
    env = {**os.environ, "DATABASE_URL": f"{base}/{args.db}", "PYTHONPATH": str(ROOT / "bench"),
           "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")}
    py = [sys.executable, "manage.py"]
    job_id = subprocess.run(py + ["shell", "--settings", "screenshot_settings", "-c",
                                  "from cron_at_scale.models import Job;"
                                  "print(Job.objects.filter(status='failed').order_by('-fire_at').values_list('id', flat=True)[0])"],
                            cwd=ROOT / "example_project", env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    server = subprocess.Popen(py + ["runserver", f"127.0.0.1:{args.port}", "--noreload", "--settings",
                                    "screenshot_settings"], cwd=ROOT / "example_project", env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/admin/login/", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        shots = {"admin_changelist.png": "/admin/cron_at_scale/job/",
                 "admin_job.png": f"/admin/cron_at_scale/job/{job_id}/change/",
                 "admin_dashboard.png": "/admin/cron_at_scale/job/dashboard/"}
        sizes = {"admin_job.png": "1400,1300"}
        for name, path in shots.items():
            with tempfile.TemporaryDirectory() as profile:
                subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                "--no-first-run", f"--user-data-dir={profile}", "--hide-scrollbars",
                                f"--screenshot={ROOT / 'docs' / name}", f"--window-size={sizes.get(name, '1400,900')}", url + path],
                               check=True, capture_output=True, timeout=120)
            print(f"docs/{name}: {path}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
