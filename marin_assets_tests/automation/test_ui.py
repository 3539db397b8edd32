"""The Dagster UI in a real browser (headless Chromium): the asset graph shows every stage, and
one source's materialization launched from the UI succeeds. Screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from marin_assets_tests.automation.system import REPO, require

ARTIFACTS = REPO / "test-artifacts"
SOURCE = "eai-taxonomy-code-w-dclm"  # a demo source no other test of this session builds
CHROME_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1600,1000",
)  # fmt: skip

pytestmark = pytest.mark.system  # browser and daemon: `make test` runs it, `make test-fast` does not


@pytest.fixture
def browser() -> Iterator[object]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    require("Chromium and chromedriver", bool(chromium and driver_path))
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="marin-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, timeout_s: float = 60):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,))


def _click(driver, xpath: str, timeout_s: float = 60):
    """Wait until ``xpath`` can be clicked (dismissing the UI's one-time welcome dialog, waiting
    out animations that cover it) and click it."""
    from selenium.common.exceptions import ElementClickInterceptedException, ElementNotInteractableException
    from selenium.webdriver.common.by import By

    def clicked(d):
        for skip in d.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
            if skip.is_displayed():
                skip.click()
                return False
        for element in d.find_elements(By.XPATH, xpath):
            if element.is_displayed() and element.is_enabled():
                try:
                    element.click()
                    return element
                except (ElementClickInterceptedException, ElementNotInteractableException):
                    return False
        return False

    return _wait(driver, timeout_s).until(clicked, message=f"nothing clickable at {xpath}")


def _screenshot(driver, name: str) -> None:
    from selenium.webdriver.common.by import By

    for skip in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):  # the welcome dialog, if it came up
        if skip.is_displayed():
            skip.click()
            _wait(driver, 10).until(lambda d: not any(e.is_displayed() for e in d.find_elements(By.XPATH, "//button[normalize-space()='Skip']")))
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))


def test_asset_graph_shows_every_stage(demo_dagster, browser) -> None:
    from selenium.webdriver.common.by import By

    from marin_assets.definitions import defs

    stages = sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())
    browser.get(f"{demo_dagster.url}/asset-groups")
    try:
        # the graph's own settings (next to its zoom controls), not the app's
        _click(browser, "//button[.//*[@aria-label='zoom_out']]/following::button[.//*[@aria-label='settings']][1]")
        _click(browser, "//*[starts-with(normalize-space(.), 'Expand all groups')][self::a or self::button or @role='menuitem']")
        labels = lambda d: {e.text.strip() for e in d.find_elements(By.XPATH, "//*[normalize-space(text())!='']")}  # noqa: E731
        _wait(browser).until(lambda d: set(stages) <= labels(d), message=f"asset graph nodes for {stages}")
    finally:
        _screenshot(browser, "ui-asset-graph.png")


def test_materialize_one_source_from_the_ui(demo_dagster, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(f"{demo_dagster.url}/assets/raw_files")
    try:
        _click(browser, "//button[starts-with(normalize-space(.), 'Materialize')]")
        _click(browser, "//div[normalize-space(text())='Select a partition or create one']")
        search = _wait(browser).until(lambda d: next(iter(d.find_elements(By.XPATH, "//input[@placeholder='Filter partitions']")), False))
        search.send_keys(SOURCE)
        _click(browser, f"//span[normalize-space(text())='{SOURCE}']")
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)  # close the picker, keep the dialog
        _click(browser, "//div[@role='dialog']//button[normalize-space(.)='Launch 1 run']")
        _click(browser, "//a[contains(@href, '/runs/')][normalize-space(.)='View']")
        _wait(browser, 240).until(
            lambda d: d.find_elements(By.XPATH, "//*[normalize-space(text())='Success']") or d.find_elements(By.XPATH, "//*[normalize-space(text())='Failure']"),
            message="the run to finish",
        )
        assert browser.find_elements(By.XPATH, "//*[normalize-space(text())='Success']"), demo_dagster.tail()
        assert browser.find_elements(By.XPATH, f"//*[contains(normalize-space(.), 'partition: {SOURCE}')]")
    finally:
        _screenshot(browser, "ui-materialize-run.png")
    assert SOURCE in demo_dagster.materialized_partitions("raw_files")
