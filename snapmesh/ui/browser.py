"""Headless Chromium for the page's screenshots and its browser test.

Debian's `chromium` and `chromium-driver` packages (`make browser` installs them
with apt-get; `install()` does the same from Python, as root), driven by Selenium
through that chromedriver: Selenium never downloads a driver or a browser.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGES = ("chromium", "chromium-driver")


class NoBrowser(RuntimeError):
    """Chromium or its driver is missing (the message says how to get them)."""


def find() -> tuple[str, str] | None:
    """(chromium, chromedriver) when both are installed: Debian's, else a Chrome and
    its driver already on the machine (GitHub's Ubuntu runners: google-chrome and
    $CHROMEWEBDRIVER, where `chromium` is only a snap stub)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if driver is None and os.environ.get("CHROMEWEBDRIVER"):
        driver = shutil.which("chromedriver", path=os.environ["CHROMEWEBDRIVER"])
    return (chromium, driver) if chromium and driver else None


def install() -> tuple[str, str]:
    """Both binaries, installing Debian's packages with apt-get when missing (root only)."""
    found = find()
    if found:
        return found
    if os.geteuid() != 0:
        raise NoBrowser(f"chromium is not installed and this is not root: apt-get install {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                   check=True, env=env, capture_output=True)
    found = find()
    if not found:
        raise NoBrowser(f"apt-get installed {' '.join(PACKAGES)} but chromium or chromedriver is not on PATH")
    return found


def chrome(width: int = 1400, height: int = 1000, *, binaries: tuple[str, str] | None = None):
    """A headless Chromium WebDriver (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = binaries or find()
    if not found:
        raise NoBrowser(f"no chromium/chromedriver: `make browser` (apt-get install {' '.join(PACKAGES)})")
    chromium, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def screenshot(url: str, out: Path, *, wait_for_id: str = "live", full_page: bool = True,
               count: str | None = None) -> tuple[Path, int | None]:
    """Open `url` headless and save a PNG of it to `out`; with `count` (a CSS
    selector), also how many elements of the shown page match it (what the picture holds)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chrome()
    try:
        browser.get(url)
        WebDriverWait(browser, 10).until(EC.presence_of_element_located((By.ID, wait_for_id)))
        WebDriverWait(browser, 20).until(  # the picture is drawn from the logs: it can take a moment
            lambda b: b.execute_script("return Array.from(document.images).every(i => i.complete)"))
        if full_page:  # as tall as the page, so the picture below the tables is in it
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(1400, min(max(int(height) + 140, 600), 8000))
        out.parent.mkdir(parents=True, exist_ok=True)
        shown = None if count is None else browser.execute_script(
            "return document.querySelectorAll(arguments[0]).length", count)
        browser.save_screenshot(str(out))
    finally:
        browser.quit()
    return out, shown
