"""Headless Chromium for the console's tests: Debian's ``chromium`` driven by Selenium through
Debian's ``chromedriver`` (both paths given: Selenium downloads nothing). Without them the
tests skip, unless ``REPLOG_REQUIRE_BROWSER=1`` (``.ci/run``) makes that a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PASSWORD = "console admin password"  # the consoles the tests start


def browser_missing() -> str:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        return f"{CHROMIUM} and {DRIVER} are needed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the dev extra)"
    return ""


@pytest.fixture
def browser() -> Iterator[Any]:
    why = browser_missing()
    if why:
        if os.environ.get("REPLOG_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: Any, css: str) -> str:
    """The text of the first element ``css`` selects, read in one script call: the pages
    redraw their tables at every refresh, so an element found in one call may be gone in
    the next (a stale reference)."""
    return str(driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css))


def click(driver: Any, css: str) -> bool:
    """Click the element ``css`` selects; False when it was redrawn between the find and the
    click (call it under a wait)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        driver.find_element("css selector", css).click()
    except (StaleElementReferenceException, NoSuchElementException):
        return False
    return True
