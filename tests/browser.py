"""Debian's Chromium through its chromedriver (the Makefile's SYSTEM_PACKAGES; nothing downloaded at run time),
headless, as the browser tests drive it."""

from __future__ import annotations

import contextlib
import shutil

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
WAIT_S = 120  # a React or Vue page on a loaded two-core machine
needs_chromium = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                    reason="Debian's chromium and chromium-driver are not installed (make setup as root)")


@contextlib.contextmanager
def chromium():
    """A fresh profile each time: nothing remembered of an earlier visit (MLflow keeps its view choice)."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1600,900", "--no-first-run", "--disable-background-networking"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
