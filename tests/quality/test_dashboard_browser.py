"""The curator dashboard in a real browser: Debian's chromium (headless) driven by selenium through
chromium-driver. A curator rejects a quarantined file with a click in the served review app, the next run
honours it, and every page of the demo run's dashboard renders its plots with no console error.

Needs ``chromium`` and ``chromedriver`` on the PATH (apt packages ``chromium chromium-driver``; ``.ci/run``
installs them). Uses the session's demo build (``demo_build`` of conftest.py) on a copy of its zones.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
import yaml

from etl.build.context import BuildContext
from etl.build.ledger import REJECTED_REASON, finalise
from etl.storage import Storage
from quality.dashboard import PAGES
from quality.gate import quality_stage
from quality.review_app import create_app

pytestmark = pytest.mark.slow
#: pages whose sections are plots (inline SVG); the checks and quarantine pages are tables
PLOT_PAGES = {"index.html": 5, "deid.html": 2, "images.html": 6, "reports.html": 6, "pairs.html": 6,
              "splits.html": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_bin):
        pytest.fail("chromium and chromedriver are needed: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_bin))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(demo_build, tmp_path_factory):
    """A copy of the demo run's zones (never its sources) served by the review app on a free local port."""
    src = demo_build["root"]
    root = tmp_path_factory.mktemp("browser") / "root"
    for zone in ("ledger", "reports", "curated"):
        shutil.copytree(src / zone, root / zone, ignore=shutil.ignore_patterns("dicom"))
    cfg = yaml.safe_load(Path(demo_build["config"]).read_text())
    cfg["storage"]["root"] = str(root)
    cfg_path = root.parent / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    storage = Storage.open(str(root))
    port = _free_port()
    from quality.review_auth import RequestGuard, TokenAuth, allowed_hosts_from_env

    app = create_app(storage, authenticate=TokenAuth(REVIEW_TOKEN), guard=RequestGuard(allowed_hosts_from_env()))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    # the browser logs in with HTTP Basic (curator name, review token) given in the URL once; it then sends them
    yield {"url": f"http://curator:{REVIEW_TOKEN}@127.0.0.1:{port}", "storage": storage, "config": cfg_path,
           "run_id": demo_build["first"]["run_id"], "second_run_id": demo_build["second"]["run_id"]}
    server.should_exit = True
    thread.join(timeout=10)


REVIEW_TOKEN = "browser-test-review-token-0123456789"


def _console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_curator_rejects_with_a_click_and_the_next_run_honours_it(browser, served, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, st = served["url"], served["storage"]
    browser.get(f"{base}/review")
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr[id^='item-']")
    assert rows, "the demo run quarantines files"
    pending = [r for r in rows if r.find_element(By.CSS_SELECTOR, "td[data-decision]").text == "pending"]
    oid = pending[0].get_attribute("id").removeprefix("item-")
    assert len(oid) == 12
    browser.find_element(By.ID, f"reject-{oid}").click()

    def decision(driver):  # the page re-renders the row after the POST: find it afresh on every poll
        try:
            cell = driver.find_element(By.CSS_SELECTOR, f"#item-{oid} td[data-decision]")
            status = driver.find_element(By.CSS_SELECTOR, "p[role=status]").text
            return (cell.get_attribute("data-decision"), status)
        except StaleElementReferenceException:
            return False

    got = WebDriverWait(browser, 10).until(
        lambda d: (lambda v: v if v and v[0] == "reject" and "recorded" in v[1] else False)(decision(d)))
    assert got[0] == "reject" and f"{oid}: reject recorded" in got[1]
    browser.save_screenshot(str(tmp_path / "review.png"))
    assert (tmp_path / "review.png").stat().st_size > 10_000
    assert _console_errors(browser) == []
    # the next run: the ledger honours the decision, and the rebuilt dashboard shows it (read-only)
    last = BuildContext.from_config_file(served["config"], run_id=served["second_run_id"])
    nxt = BuildContext.from_config_file(served["config"], run_id="browser-rerun")
    for rel in (last.plan_path(), *st.list_files(f"{last.run_dir}/events"), *st.list_files(f"{last.run_dir}/audit")):
        st.write_bytes(rel.replace(last.run_dir, nxt.run_dir, 1), st.read_bytes(rel))
    result = finalise(nxt)
    assert result["review"]["rejected"] == 1 and result["balanced"]
    row = [r for r in st.read_table(nxt.ledger_path).to_pylist() if r["sha256"].startswith(oid)]
    assert [(r["status"], r["reason"]) for r in row] == [("quarantined", REJECTED_REASON)]
    quality_stage(nxt)
    browser.get(f"{base}/dashboard/quarantine.html")
    decided = browser.find_element(By.XPATH, f"//tr[td/span[@id='q-{oid}']]")
    assert "reject" in decided.text and REJECTED_REASON in decided.text
    assert not browser.find_elements(By.TAG_NAME, "button")  # the static export is read-only
    assert _console_errors(browser) == []


def test_every_dashboard_page_renders_its_plots(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    base = served["url"]
    for page, title in PAGES:
        browser.get(f"{base}/dashboard/{page}")
        assert title in browser.title
        svgs = browser.find_elements(By.CSS_SELECTOR, "main svg")
        assert len(svgs) >= PLOT_PAGES.get(page, 0), (page, len(svgs))
        for svg in svgs:  # drawn, with something in it
            assert svg.size["width"] > 0 and svg.size["height"] > 0, page
            assert svg.find_elements(By.CSS_SELECTOR, "rect, text"), page
        if page not in PLOT_PAGES:
            assert browser.find_elements(By.CSS_SELECTOR, "main table tbody tr"), page
        assert _console_errors(browser) == [], page
        shot = tmp_path / f"{page}.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000, page
    # the dashboard links to the Data Docs the quality stage built, served from the reports zone
    browser.get(f"{base}/dashboard/checks.html")
    href = browser.find_element(By.LINK_TEXT, "Data Docs").get_attribute("href")
    assert href.endswith("/data_docs/index.html")
    browser.get(href)
    assert "Data Docs" in browser.page_source or "Validation" in browser.page_source
