"""The Dagster UI in a real browser (headless Chromium, selenium): the asset graph shows every
stage; one source's materialization launched from the UI succeeds; on a built demo instance,
``normalized`` shows its column schema, ``sampling_groups`` its groups as a Dagster table, and a
pin edit marks that source's whole chain stale (Unsynced). Screenshots go to test-artifacts/
(``ui-*.png``), taken whether the test passes or fails."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin_assets_tests.automation.system import REPO, DagsterDev, require

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


def _menu_item(driver, opener: str, item: str, timeout_s: float = 60):
    """Open a menu and click one of its items, opening it again if it closed before the item
    could be clicked (the one-time welcome dialog or a re-render can close it)."""
    from selenium.common.exceptions import TimeoutException

    deadline = time.monotonic() + timeout_s
    while True:
        _click(driver, opener, timeout_s=max(deadline - time.monotonic(), 1))
        try:
            return _click(driver, item, timeout_s=min(10, max(deadline - time.monotonic(), 1)))
        except TimeoutException:
            if time.monotonic() >= deadline:
                raise


def test_asset_graph_shows_every_stage(demo_dagster, browser) -> None:
    from selenium.webdriver.common.by import By

    from marin_assets.core import specs
    from marin_assets.definitions import defs

    assets = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    stages = sorted(s.name for s in specs.ALL)  # the slices' long names are shortened in their nodes
    assert set(stages) <= assets
    browser.get(f"{demo_dagster.url}/asset-groups")
    try:
        # the graph's own settings (next to its zoom controls), not the app's
        _menu_item(
            browser,
            "//button[.//*[@aria-label='zoom_out']]/following::button[.//*[@aria-label='settings']][1]",
            "//*[starts-with(normalize-space(.), 'Expand all groups')][self::a or self::button or @role='menuitem']",
        )
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


# --------------------------------------------------------------------------- on a built demo

EDITED = "cp/peps"  # a demo source whose pin the last test edits


@pytest.fixture(scope="module")
def built_dev(built_demo: Path, tmp_path_factory) -> Iterator[DagsterDev]:
    """``marin-assets dev`` over a copy of the built demo instance (its data read in place), the
    catalog an editable copy (``MARIN_CATALOG``), the demo Hub serving the sample."""
    from marin_assets.demo.run import build_demo_hub, served_note
    from marin_assets.testing.hub_server import LocalHubServer
    from marin_assets_tests.fixtures.pipeline import catalog_with

    root = tmp_path_factory.mktemp("built_dev")
    shutil.copytree(built_demo / "dagster_home_as_built", root / "dagster_home")
    catalog_with(root / "catalog.toml")
    with LocalHubServer(build_demo_hub(str(root / "hub")), served_note=served_note()) as hub:
        dev = DagsterDev(root, hub.endpoint, home=root / "dagster_home", prefix=built_demo / "data", env={"MARIN_CATALOG": str(root / "catalog.toml")})
        try:
            yield dev.start()
        finally:
            dev.stop()


def _texts(driver) -> set[str]:
    from selenium.webdriver.common.by import By

    return {e.text.strip() for e in driver.find_elements(By.XPATH, "//*[normalize-space(text())!='']") if e.is_displayed()}


def test_normalized_shows_its_column_schema(built_dev, browser) -> None:
    browser.get(f"{built_dev.url}/assets/normalized")
    try:
        _wait(browser, 120).until(lambda d: {"Columns", "Column name", "id", "text", "source_id", "large_string"} <= _texts(d),
                                  message="normalized's column schema (id, text, source_id) on its overview")  # fmt: skip
    finally:
        _screenshot(browser, "ui-normalized-columns.png")


def test_sampling_groups_show_a_dagster_table(built_dev, browser) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{built_dev.url}/assets/sampling_groups")
    header = ["group", "topic_label", "documents", "tokens", "weight"]

    def groups_table(d):
        for table in d.find_elements(By.XPATH, "//table[.//*[normalize-space(text())='topic_label']][not(.//table)]"):
            cells = [c.text.strip() for c in table.find_elements(By.XPATH, ".//th")]
            if cells[: len(header)] == header and table.find_elements(By.XPATH, ".//tbody/tr"):
                return table
        return False

    try:
        _wait(browser, 120).until(lambda d: "groups_table" in _texts(d), message="the groups_table metadata entry")
        table = _wait(browser, 60).until(groups_table, message="groups_table rendered as a table with its columns")
        browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", table)
        groups = [cells[0].text.strip() for cells in (row.find_elements(By.XPATH, "./td") for row in table.find_elements(By.XPATH, ".//tr")) if cells]
        assert groups and all(re.fullmatch(r"c\d\dq\d", g) for g in groups), f"one row per group (c00q0 ...): {groups[:5]}"
    finally:
        _screenshot(browser, "ui-sampling-groups-table.png")


def test_a_pin_edit_marks_that_sources_chain_stale(built_dev, browser) -> None:
    """The pin edit is recorded as ``catalog_changes`` records it (one runless observation of
    ``source_pins``); every per-source asset built for that source turns Unsynced, and only for it."""
    import dagster as dg
    from selenium.webdriver.common.by import By

    from marin_assets.catalog.sources import load_catalog
    from marin_assets.core.ingest import raw as ingest
    from marin_assets.defs.automation.sensors import pin_observations
    from marin_assets.demo.sample import DEMO_SOURCES
    from marin_assets_tests.fixtures.pipeline import catalog_with

    catalog_path = Path(built_dev.env["MARIN_CATALOG"])
    catalog_with(catalog_path, edit={EDITED: {"provider": {"revision": "f" * 40}}})
    recipe = ingest.recipe_fingerprint(load_catalog(catalog_path).by_name(EDITED))
    with dg.DagsterInstance.from_config(str(built_dev.home)) as instance:
        for event in pin_observations({EDITED: recipe}, {}):
            instance.report_runless_asset_event(event)
    other = next(n for n in DEMO_SOURCES if n != EDITED)
    chain = sorted(a for a in ("raw_files", "normalized", "minhash_buckets", "embeddings", "contamination", "topics", "quality_scores", "pool")
                   if {EDITED, other} <= built_dev.materialized_partitions(a))  # fmt: skip
    status = {}
    for asset in chain:
        data = built_dev.graphql("query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { ... on AssetNode { staleStatusByPartition(partitions: $p) } } }".replace("$p", f'["{EDITED}", "{other}"]'),
                                 {"k": {"path": [asset]}})  # fmt: skip
        status[asset] = data["assetNodeOrError"]["staleStatusByPartition"]
    print("stale status after the pin edit (edited, other):", status)
    assert len(chain) == 8 and all(v == ["STALE", "FRESH"] for v in status.values()), status

    browser.get(f"{built_dev.url}/assets/pool?view=partitions&partition={EDITED.replace('/', '%2F')}")
    try:
        _click(browser, "//span[starts-with(normalize-space(text()), 'Unsynced')]", timeout_s=120)
        _wait(browser).until(lambda d: d.find_elements(By.XPATH, "//*[normalize-space(text())='has a new data version']") and "source_pins" in _texts(d),
                             message="the Unsynced popover naming source_pins' new data version")  # fmt: skip
    finally:
        _screenshot(browser, "ui-chain-stale-after-pin-edit.png")


def _fits_the_width(driver, name: str) -> None:
    """Nothing on the page is wider than its box: no sideways scrolling at 1600 px."""
    overflow = driver.execute_script("""
        const out = [];
        for (const e of document.querySelectorAll('table, pre, main, [class*="Box"]')) {
            const style = getComputedStyle(e);
            if (e.offsetParent && e.scrollWidth > e.clientWidth + 2 && style.overflowX !== 'hidden' && e.clientWidth > 400)
                out.push(e.tagName + ' ' + e.scrollWidth + '>' + e.clientWidth + ' ' + (e.innerText || '').slice(0, 60));
        }
        if (document.documentElement.scrollWidth > window.innerWidth + 2) out.push('page ' + document.documentElement.scrollWidth);
        return out;""")
    assert overflow == [], f"{name}: wider than the window: {overflow[:5]}"


LINEAGE_ZOOM = 0.62  # from 0.6 up the graph draws each asset in full: latest event, checks, partitions


def _lineage_in_full(built_dev, browser) -> None:
    """pool's lineage (the slices it reads, what reads it) at a zoom that draws every asset's
    state, every node within the 1600 px width: the window grows taller for it, never wider, and
    the navigation folds away (both restored afterwards)."""
    import dagster as dg

    from marin_assets.definitions import defs

    node = defs.resolve_asset_graph().get(dg.AssetKey("pool"))
    neighbours = sorted(k.to_user_string() for k in {node.key, *node.parent_keys, *node.child_keys})
    browser.get(f"{built_dev.url}/assets/pool")
    _click(browser, "//*[normalize-space(text())='Hide navigation']")
    browser.execute_script("localStorage.setItem('lineageGraphZoomLevel', arguments[0])", str(LINEAGE_ZOOM))
    browser.set_window_size(1600, 2400)
    browser.get(f"{built_dev.url}/assets/pool?view=lineage")

    def drawn_in_full(d):
        if "Latest event" not in _texts(d):
            return False  # still the minimal nodes (names only)
        width, height = d.execute_script("return [window.innerWidth, window.innerHeight]")
        spans = {name: d.execute_script("const e = [...document.querySelectorAll('foreignObject *')].find(e => e.textContent.trim() === arguments[0] "
                                        "&& !e.children.length && e.offsetParent); if (!e) return null; const r = e.getBoundingClientRect(); "
                                        "return [r.left, r.right, r.bottom];", name) for name in neighbours}  # fmt: skip
        return all(span and 0 <= span[0] and span[1] <= width and span[2] <= height for span in spans.values()) and spans

    try:
        spans = _wait(browser, 120).until(drawn_in_full, message=f"pool's lineage, every node in full within the width: {neighbours}")
        print("lineage nodes (left, right, bottom px):", spans)
    finally:
        _screenshot(browser, "ui-lineage.png")
        browser.set_window_size(1600, 1000)
        browser.execute_script("localStorage.removeItem('dagster-nav-collapsed')")


def test_operator_views_at_1600px(built_dev, browser) -> None:
    """The views an operator reads, as screenshots at 1600 px: the lineage with each asset's
    state, a pool partition's page, sampling_groups (pictures first) and the table of sources
    (the source_status check on source_pins), each readable without scrolling sideways."""
    from selenium.webdriver.common.by import By

    assert browser.execute_script("return window.innerWidth") >= 1580
    _lineage_in_full(built_dev, browser)

    browser.get(f"{built_dev.url}/assets/pool?view=partitions&partition={EDITED.replace('/', '%2F')}")
    try:
        _wait(browser, 120).until(lambda d: "Latest materialization" in " ".join(_texts(d)) or "Materialized" in " ".join(_texts(d)),
                                  message="the pool partition's page")  # fmt: skip
        _fits_the_width(browser, "pool partition")
    finally:
        _screenshot(browser, "ui-pool-partition.png")

    browser.get(f"{built_dev.url}/assets/sampling_groups")
    try:
        _wait(browser, 120).until(lambda d: "tokens_heatmap" in _texts(d), message="sampling_groups' pictures")
        names = [e.text.strip() for e in browser.find_elements(By.XPATH, "//td[1]") if e.text.strip()]
        assert names.index("tokens_heatmap") < names.index("rebuild_report") < names.index("groups_table"), names
        _fits_the_width(browser, "sampling_groups")
    finally:
        _screenshot(browser, "ui-sampling-groups.png")

    browser.get(f"{built_dev.url}/assets/source_pins?view=checks")
    try:
        search = _wait(browser).until(lambda d: next(iter(d.find_elements(By.XPATH, "//input[@placeholder='Filter checks']")), False))
        search.send_keys("source_status")  # one of 149 checks on source_pins (a drift check per source)
        _click(browser, "//*[normalize-space(text())='source_status']", timeout_s=180)
        _wait(browser, 180).until(lambda d: {"source", "state", "reason", "last build", "tokens"} <= _texts(d) and "built" in _texts(d),
                                  message="the table of sources (source_status's metadata)")  # fmt: skip
        assert any(t.startswith("146 catalog sources:") for t in _texts(browser))
        _fits_the_width(browser, "source_status")
    finally:
        _screenshot(browser, "ui-status-table.png")
