"""The curator dashboard in a real browser: Debian's chromium (headless) driven by selenium through
chromium-driver. A curator rejects a quarantined file with a note and a click in the served review app (the
decision names the logged-in curator), the next run honours it, every page of the demo run's dashboard renders
its plots with no console error, no overflowing card, no label cut at its chart's edge and a link to the review
page, and the Data Docs render styled with nothing fetched from another origin.

Needs ``chromium`` and ``chromedriver`` on the PATH (apt packages ``chromium chromium-driver``; ``.ci/run``
installs them). Uses the session's demo build (``demo_build`` of conftest.py) on a copy of its zones.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import uvicorn
import yaml

from etl.pipeline.context import BuildContext
from etl.pipeline.ledger import REJECTED_REASON, REVIEW_FILE, finalise
from etl.storage import Storage
from quality.dashboard import PAGES
from quality.gate import quality_stage
from quality.review_app import create_app

pytestmark = pytest.mark.slow
#: pages whose sections are plots (inline SVG); the checks and quarantine pages are tables
PLOT_PAGES = {"index.html": 5, "deid.html": 2, "images.html": 6, "reports.html": 6, "pairs.html": 6, "splits.html": 4}


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
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
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
    yield {
        "url": f"http://curator:{REVIEW_TOKEN}@127.0.0.1:{port}",
        "storage": storage,
        "config": cfg_path,
        "run_id": demo_build["first"]["run_id"],
        "second_run_id": demo_build["second"]["run_id"],
    }
    server.should_exit = True
    thread.join(timeout=10)


REVIEW_TOKEN = "browser-test-review-token-0123456789"


#: layout faults a curator would see at the window size of the fixture (1400 px): the page or a card scrolling
#: sideways, a table cell wider than itself, a chart label cut by its chart's edge (the label's box outside the
#: SVG's box, rotated labels included)
LAYOUT_FAULTS_JS = """
const out = [];
const de = document.documentElement;
if (de.scrollWidth > de.clientWidth + 1) out.push(`page scrolls sideways: ${de.scrollWidth} > ${de.clientWidth}`);
for (const el of document.querySelectorAll('main section, main .row > div, main td')) {
  if (el.scrollWidth > el.clientWidth + 1) {
    const h = el.closest('section')?.querySelector('h2')?.textContent || '';
    out.push(`overflow in ${el.tagName.toLowerCase()} of "${h}": ${el.scrollWidth} > ${el.clientWidth}`);
  }
}
for (const svg of document.querySelectorAll('main svg')) {
  const r = svg.getBoundingClientRect();
  for (const t of svg.querySelectorAll('text')) {
    const b = t.getBoundingClientRect();
    if (!b.width) continue;
    if (b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1 || b.bottom > r.bottom + 1)
      out.push(`label cut by its chart's edge: "${t.firstChild ? t.firstChild.textContent : ''}"`);
  }
}
return out;
"""


def _layout_faults(driver) -> list[str]:
    return driver.execute_script(LAYOUT_FAULTS_JS)


def _resources_off_site(driver) -> list[str]:
    """URLs the page loaded (or tried to) from another origin than its own."""
    return driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(u => !u.startsWith('data:') && new URL(u).origin !== location.origin)"  # credentials in a URL too
    )


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
    assert browser.find_element(By.ID, "curator").text == "curator"  # the login name decisions will carry
    assert _layout_faults(browser) == []
    browser.find_element(By.ID, f"note-{oid}").send_keys("burned in text seen on the image")
    browser.find_element(By.ID, f"reject-{oid}").click()

    def decision(driver):  # the page re-renders the row after the POST: find it afresh on every poll
        try:
            cell = driver.find_element(By.CSS_SELECTOR, f"#item-{oid} td[data-decision]")
            status = driver.find_element(By.CSS_SELECTOR, "p[role=status]").text
            return (cell.get_attribute("data-decision"), status)
        except StaleElementReferenceException:
            return False

    got = WebDriverWait(browser, 10).until(
        lambda d: (lambda v: v if v and v[0] == "reject" and "recorded" in v[1] else False)(decision(d))
    )
    assert got[0] == "reject" and f"{oid}: reject recorded" in got[1]
    row = browser.find_element(By.ID, f"item-{oid}")
    assert row.find_element(By.CSS_SELECTOR, "td[data-curator]").text == "curator"
    assert row.find_element(By.CSS_SELECTOR, "td[data-note]").text == "burned in text seen on the image"
    stored = [d for d in json.loads(st.read_text(REVIEW_FILE))["decisions"] if d["sha256"].startswith(oid)]
    assert [(d["curator"], d["note"]) for d in stored] == [("curator", "burned in text seen on the image")]
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
    assert "curator" in decided.text and "burned in text seen on the image" in decided.text
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
        if page == "training.html":  # the demo build trains nothing: the page says it is waiting for the jobs
            assert browser.find_element(By.ID, "training-pending").is_displayed()
        elif page not in PLOT_PAGES:
            assert browser.find_elements(By.CSS_SELECTOR, "main table tbody tr"), page
        assert _console_errors(browser) == [], page
        assert _layout_faults(browser) == [], page  # no card overflows, no label is cut at 1400 px
        assert _resources_off_site(browser) == [], page
        review = browser.find_element(By.ID, "review-nav").get_attribute("href")
        assert urlsplit(review).path == "/dashboard/quarantine.html", page  # works opened from disk too
        shot = tmp_path / f"{page}.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000, page
    browser.find_element(By.ID, "review-nav").click()  # the quarantine page's record-decisions section
    assert urlsplit(browser.find_element(By.ID, "review-link").get_attribute("href")).path == "/review"
    browser.find_element(By.ID, "review-link").click()  # then the served review app
    assert "Quarantine review" in browser.title


def test_data_docs_render_styled_offline(browser, served, tmp_path):
    """GX's own Data Docs loaded eight CDNs and a logo URL with the data context id; offline they were unstyled
    with an empty index. The project's pages: styled inline, nothing fetched from elsewhere."""
    from selenium.webdriver.common.by import By

    base = served["url"]
    browser.get(f"{base}/dashboard/checks.html")
    href = browser.find_element(By.LINK_TEXT, "Data Docs").get_attribute("href")
    assert href.endswith("/data_docs/index.html")
    browser.get(href)
    assert "Validation results" in browser.title
    header = browser.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("background-color") == "rgba(24, 38, 61, 1)"  # the inline style applies
    runs = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "main section h2")]
    assert runs.index(f"Run {served['second_run_id']}") < runs.index(f"Run {served['run_id']}")  # newest first
    links = browser.find_elements(By.CSS_SELECTOR, "main table a[href*='validations/']")
    assert len(links) >= 20  # one per suite and run: the index is not empty
    assert _resources_off_site(browser) == [] and _layout_faults(browser) == [] and _console_errors(browser) == []
    links[0].click()
    assert browser.find_elements(By.CSS_SELECTOR, "main table tbody tr")
    assert browser.find_elements(By.CSS_SELECTOR, "main .badge.pass, main .badge.fail")  # status badges drawn
    assert _resources_off_site(browser) == [] and _layout_faults(browser) == [] and _console_errors(browser) == []
    browser.save_screenshot(str(tmp_path / "data_docs.png"))
    assert (
        browser.find_element(By.ID, "review-nav")
        .get_attribute("href")
        .endswith("/dashboard/quarantine.html#record-decisions")
    )


@pytest.fixture(scope="module")
def preview_served(tmp_path_factory, key):
    """A root built by the pixel stages from one faint-ID RF frame (quarantined ``burned_in_text_remaining``) and a
    head CT whose header lies about its orientation (``defacing_failed``), served by the review app."""
    import sys

    from helpers import run_pixel_stages

    from etl.demo import heads as H
    from etl.pipeline.ledger import finalise

    sys.path.insert(0, str(Path(__file__).parents[1] / "deid"))
    from test_quarantine_preview import _faint_id_file

    base = tmp_path_factory.mktemp("preview")
    source = base / "source"
    source.mkdir()
    (source / "faint_id.dcm").write_bytes(_faint_id_file())
    head, _ = H.template_head()
    tilted = H.head_series(H.ct_like(head), modality="CT", tilt_deg=180, size=(112, 112, 56), spacing=(2.0, 2.0, 2.5))
    for i, data in enumerate(tilted.files):
        (source / f"head_{i:03d}.dcm").write_bytes(data)
    ctx = run_pixel_stages(base, source, "site-p", key)
    finalise(ctx)
    from quality.review_auth import RequestGuard, TokenAuth, allowed_hosts_from_env

    app = create_app(ctx.storage, authenticate=TokenAuth(REVIEW_TOKEN), guard=RequestGuard(allowed_hosts_from_env()))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield {"url": f"http://curator:{REVIEW_TOKEN}@127.0.0.1:{port}", "storage": ctx.storage}
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("width", [1400, 800])
def test_curator_sees_the_failed_pixels_of_burned_in_text_and_defacing_quarantines(
    browser, preview_served, tmp_path, width
):
    """Issue 40, point 8: the review page shows, for each file quarantined ``burned_in_text_remaining`` or
    ``defacing_failed``, its de-identified pixels with the failed boxes (a thumbnail that opens the full view), at
    1400 and 800 px with no layout fault; the PNG is nowhere under ``reports/``."""
    from selenium.webdriver.common.by import By

    from etl import zones

    base, st = preview_served["url"], preview_served["storage"]
    browser.set_window_size(width, 1000)
    try:
        browser.get(f"{base}/review")
        rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr[id^='item-']")
        reasons = {r.find_element(By.CSS_SELECTOR, "td[data-label=reason]").text for r in rows}
        assert {"burned_in_text_remaining", "defacing_failed"} <= reasons
        thumbs = browser.find_elements(By.CSS_SELECTOR, "td.preview img")
        assert len(thumbs) == len(rows)  # every such file has one
        for img in thumbs:  # loaded (the login applies to the image too), drawn at a thumbnail's width
            assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100
            assert 0 < img.size["width"] <= 160
        assert _layout_faults(browser) == [] and _console_errors(browser) == []
        assert _resources_off_site(browser) == []
        browser.save_screenshot(str(tmp_path / f"review_{width}.png"))
        for reason in ("burned_in_text_remaining", "defacing_failed"):
            browser.get(f"{base}/review")
            row = next(
                r
                for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr[id^='item-']")
                if r.find_element(By.CSS_SELECTOR, "td[data-label=reason]").text == reason
            )
            row.find_element(By.CSS_SELECTOR, "td.preview a").click()
            img = browser.find_element(By.ID, "preview")
            assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100
            assert img.size["width"] <= width  # scaled to the window
            assert reason in browser.find_element(By.TAG_NAME, "header").text
            assert _layout_faults(browser) == [] and _console_errors(browser) == []
            browser.save_screenshot(str(tmp_path / f"preview_{reason}_{width}.png"))
        assert st.list_files(zones.PREVIEWS_DIR)
        assert not [p for p in st.list_files(zones.REPORTS) if p.endswith(".png")]
    finally:
        browser.set_window_size(1400, 1000)
