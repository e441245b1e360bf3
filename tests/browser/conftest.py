"""The browser kind: the admin served by pytest-django's ``live_server`` (a thread of the test's
process, on the suite's PostgreSQL and Redis), driven in Debian's headless ``chromium`` through its
``chromedriver`` with Selenium. Never a browser a tool downloads: both paths are given to Selenium.
Where either binary (or Selenium) is missing, every test here skips and says which."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

# Debian's binaries (CHROMIUM / CHROMEDRIVER name others, e.g. to see the skip)
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,1000")
# Set to a directory (docs/) to save the screenshots the docs show: ADMIN_SCREENSHOTS=docs
SCREENSHOTS = os.environ.get("ADMIN_SCREENSHOTS")


@pytest.fixture(scope="session")
def chrome(tmp_path_factory, django_db_setup, live_server):
    """One headless Chromium for the session, with a fresh profile directory. Set up after (so torn
    down before) the live server and the test database: quitting closes its keep-alive connections,
    whose server threads then close their database sessions before the database is dropped."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    # CAS_REQUIRE_BROWSER=1 (.ci/run, once it has installed them): a missing browser fails, not skips
    if missing and os.environ.get("CAS_REQUIRE_BROWSER"):
        pytest.fail(f"CAS_REQUIRE_BROWSER is set but {', '.join(missing)} is missing")
    if missing:
        pytest.skip(f"the browser tests need Debian's chromium and chromium-driver ({', '.join(missing)} "
                    "missing): apt-get install chromium chromium-driver (.ci/run does, as root)")
    try:
        from selenium import webdriver
    except ImportError:
        pytest.skip("the browser tests need selenium (pip install -e '.[dev]')")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(5)
    yield driver
    driver.quit()
    time.sleep(0.5)  # the live server's request threads see their sockets close and end


@pytest.fixture
def admin(chrome, live_server, settings):
    """The browser logged in to the live server's admin as a superuser (through the login form)."""
    from django.contrib.auth.models import User
    from selenium.webdriver.common.by import By

    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "HOLD_UNCONSUMED_QUEUES": True}  # as in production
    User.objects.create_superuser("operator", "op@example.com", "secret-pass")
    chrome.delete_all_cookies()
    chrome.get(live_server.url + "/admin/login/")
    chrome.find_element(By.NAME, "username").send_keys("operator")
    chrome.find_element(By.NAME, "password").send_keys("secret-pass")
    chrome.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    chrome.find_element(By.ID, "user-tools")  # logged in
    chrome.base = live_server.url
    return chrome


def screenshot(driver, name: str) -> None:
    """Save the page as ``$ADMIN_SCREENSHOTS/<name>.png`` (whole page height) when asked to."""
    if not SCREENSHOTS:
        return
    driver.set_window_size(1920, 1000)  # wide enough for every column of the list
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1920, min(max(height + 150, 700), 2400))  # the window is taller than its viewport
    Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))
    driver.set_window_size(1500, 1000)
