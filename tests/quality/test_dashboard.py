"""Curator dashboard: self-contained HTML with the run's counts, SVG charts, and no source paths or names."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import xml.etree.ElementTree as ET
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest

from quality.checks import run_checks
from quality.dashboard import (
    PAGES,
    DashboardInputError,
    build_dashboard,
    safe_ledger,
    svg_bar_chart,
    svg_heatmap,
    svg_histogram,
    svg_stacked_bars,
)
from schemas.base import table_from_rows
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

RUN_ID = "run-20250601T0200Z-demo"
PLANTED = ("SMITH", "JANE", "BLOGGS", "FRED", "IM0001", "sources/", "617-555-0123", "pleural effusion.")
QUARANTINED_URI = "sources/us-bos/SMITH^JANE_1961/CT_CHEST/IM0001.dcm"
DEID_AUDIT = {
    "actions": {"removed": 1234, "replaced": 321, "shifted": 77, "remapped": 456},
    "verification_failures": 3,
    "burned_in_quarantined": 2,
    "deface:defaced": 4,
    "deface:not_a_volume": 2,
    "deface:quarantined": 1,
    "deface:quarantined:defacing_failed": 1,
    "deface:faces_before": 4,
    "deface:faces_after": 0,
}
HISTORY = [
    {
        "run_id": "run-20250525T0200Z-demo",
        "ingested": 40,
        "quarantined": 2,
        "duplicate": 0,
        "skipped": 1,
        "critical_failures": 0,
    },
    {
        "run_id": "run-20250530T0200Z-demo",
        "ingested": 52,
        "quarantined": 5,
        "duplicate": 3,
        "skipped": 0,
        "critical_failures": 1,
    },
]


def _sha(i: int) -> str:
    return hashlib.sha256(b"file %d" % i).hexdigest()


def make_tables() -> dict:
    insts = ["us-bos", "gb-lon"]
    studies, series, images, reports, mentions, splits, pairs, vqa = [], [], [], [], [], [], [], []
    for p in range(4):
        inst = insts[p % 2]
        splits.append(dict(patient_key=f"p{p}", institution=inst, split=["train", "train", "val", "test"][p], shard=0))
        for s in range(2):
            sk = f"s{p}{s}"
            studies.append(
                dict(
                    study_key=sk,
                    patient_key=f"p{p}",
                    institution=inst,
                    country="US",
                    modality="CR",
                    body_part="CHEST",
                    family="2D-CXR",
                    study_datetime=dt.datetime(2020, 1 + 3 * s, 1),
                    study_date_shifted=dt.date(2020, 1 + 3 * s, 1),
                    n_series=1,
                    n_images=1,
                    report_id=f"r{p}{s}",
                    shard=0,
                )
            )
            series.append(
                dict(
                    series_key=f"se{p}{s}",
                    study_key=sk,
                    patient_key=f"p{p}",
                    institution=inst,
                    modality="CR",
                    view_position="PA" if s == 0 else "AP",
                    spacing_mm=[0.14 + 0.01 * p] * 2,
                    n_instances=1,
                    shard=0,
                )
            )
            payload = b"png %d %d" % (p, s)
            images.append(
                dict(
                    image_key=f"im{p}{s}",
                    series_key=f"se{p}{s}",
                    study_key=sk,
                    patient_key=f"p{p}",
                    institution=inst,
                    modality="CR",
                    view="PA" if s == 0 else "AP",
                    kind="2d",
                    rows=256,
                    cols=256,
                    n_slices=1,
                    spacing_mm=[0.14 + 0.01 * p] * 2,
                    payload_format="png",
                    payload=payload,
                    payload_sha256=hashlib.sha256(payload).hexdigest(),
                    recipe="{}",
                    transfer_syntax="1.2.840.10008.1.2.1",
                    shard=0,
                )
            )
            reports.append(
                dict(
                    report_id=f"r{p}{s}",
                    study_key=sk,
                    patient_key=f"p{p}",
                    institution=inst,
                    language="en",
                    link_status="linked",
                    findings="Left pleural effusion.",
                    text="FINDINGS: Left pleural effusion." + (" Call 617-555-0123." if sk == "s31" else ""),
                    redactions=0,
                    redaction_counts="{}",
                    shard=0,
                )
            )
            # effusion present in all us-bos reports and in half of gb-lon's; cardiomegaly negated everywhere
            present = inst == "us-bos" or s == 1
            mentions.append(
                dict(
                    mention_id=f"m{p}{s}a",
                    report_id=f"r{p}{s}",
                    entity_id="F029",
                    category="finding",
                    span_start=10,
                    span_end=26,
                    text="pleural effusion",
                    assertion="present" if present else "uncertain",
                    temporality="current",
                    change="none",
                    shard=0,
                )
            )
            mentions.append(
                dict(
                    mention_id=f"m{p}{s}b",
                    report_id=f"r{p}{s}",
                    entity_id="A009",
                    category="anatomy",
                    span_start=15,
                    span_end=22,
                    text="pleura",
                    assertion="absent",
                    temporality="current",
                    change="none",
                    shard=0,
                )
            )
        pairs.append(
            dict(
                pair_id=f"pa{p}",
                patient_key=f"p{p}",
                prior_study_key=f"s{p}0",
                current_study_key=f"s{p}1",
                family="2D-CXR",
                modality="CR",
                view="PA",
                gap_days=91,
                change_labels=[{"entity_id": "F029", "change": "increased", "source": "stated"}],
                n_conflicts=0,
                shard=0,
            )
        )
        opts = ["Increased", "Decreased", "Unchanged", "New"]
        vqa.append(
            dict(
                item_id=f"q{p}",
                pair_id=f"pa{p}",
                patient_key=f"p{p}",
                question_type="change",
                question="How has the effusion changed?",
                options=opts,
                answer="ABCD"[p],
                answer_text=opts[p],
                entity_ids=["F029"],
                split=splits[-1]["split"],
                shard=0,
            )
        )
    statuses = ["ingested"] * 5 + ["quarantined", "quarantined", "duplicate", "skipped"]
    ledger = []
    for i, st in enumerate(statuses):
        uri = f"sources/us-bos/DOE^JOHN/IM{i:04d}.dcm"
        row = dict(
            run_id=RUN_ID,
            source_uri=uri,
            sha256=_sha(i),
            bytes=1000,
            institution="us-bos",
            kind="dicom",
            shard=0,
            status=st,
            stage="normalise",
        )
        if st == "quarantined":
            row.update(
                stage="deidentify",
                reason="burned_in_annotation" if i == 5 else "unverifiable_phi",
                detail="pixel text detected in the annotation band",
            )
        if i == 6:  # a leaky detail: the pipeline must not be trusted to keep paths out of it
            row.update(source_uri=QUARANTINED_URI, detail=f"OCR hit in {QUARANTINED_URI} (SMITH^JANE)")
        if st == "duplicate":
            row.update(stage="discover", reason="same_sha256", duplicate_of="sources/gb-lon/BLOGGS^FRED/x.dcm")
        ledger.append(row)
    rows = dict(
        studies=studies,
        series=series,
        images=images,
        reports=reports,
        entity_mentions=mentions,
        pairs=pairs,
        vqa=vqa,
        splits=splits,
        ledger=ledger,
        study_labels=[],
    )
    return {name: table_from_rows(r, SCHEMAS[name]) for name, r in rows.items()}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    run_info = {
        "run_id": RUN_ID,
        "config": "medreco-demo",
        "operator_note": "<script>alert(1)</script>",
        "source_root": "/mnt/pacs/sources",
        "deid_audit": DEID_AUDIT,
    }
    review = [{"sha256": _sha(5), "decision": "reject", "note": "text in the pixel data confirmed"}]
    out = tmp_path_factory.mktemp("dash")
    index = build_dashboard(
        tables, quality, run_info, out, history=HISTORY, review=review, data_docs_href="../data_docs/index.html"
    )
    pages = {p: (out / p).read_text(encoding="utf-8") for p, _ in PAGES}
    return index, pages


def test_pages_written_and_index_returned(site):
    index, pages = site
    assert index.name == "index.html" and index.is_file()
    assert set(pages) == {p for p, _ in PAGES}
    for name, html in pages.items():
        assert RUN_ID in html, name
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
        for p, _ in PAGES:  # every page links every page (relative links only)
            assert f'href="{p}"' in html


def test_self_contained_no_scripts_no_external_resources(site):
    _, pages = site
    for name, html in pages.items():
        # the only link is an empty inline favicon (no request for /favicon.ico, no console error)
        low = html.lower().replace('<link rel="icon" href="data:,">', "", 1)
        assert "http://" not in low and "https://" not in low and "//cdn" not in low, name
        assert "<script" not in low and "<link" not in low and " src=" not in low, name
        assert "<style>" in low
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages["index.html"]  # run_info text is escaped
    assert "/mnt/pacs" not in pages["index.html"]  # location keys of run_info are not rendered


def test_never_shows_source_paths_or_planted_names(site):
    _, pages = site
    for name, html in pages.items():
        for planted in PLANTED + ("DOE^JOHN", "DOE", "JOHN"):
            assert planted.lower() not in html.lower(), (name, planted)


def test_overview_counts_svg_and_trend(site):
    _, pages = site
    html = pages["index.html"]
    assert "<svg" in html
    run_part = html[html.index("<h2>This run</h2>") : html.index("<h2>The dataset after this run")]
    data_part = html[html.index("<h2>The dataset after this run") :]
    for k, v in [("files seen by this run", 9), ("ingested", 5), ("quarantined", 2), ("duplicate", 1), ("skipped", 1)]:
        assert f'<div class="v">{v}</div><div class="k">{k}</div>' in run_part, k
    for k, v in [("studies", 8), ("images", 8), ("pairs", 4), ("VQA items", 4), ("files in all runs' ledgers", 9)]:
        assert f'<div class="v">{v}</div><div class="k">{html_escape(k)}</div>' in data_part, k
    # ledger balance row of this run: rows, four statuses, sum, PASS
    assert re.search(
        rf"<td>{RUN_ID}</td>" + r'<td class="num">9</td><td class="num">5</td><td class="num">2</td>'
        r'<td class="num">1</td><td class="num">1</td><td class="num">9</td><td><span class="badge pass">',
        html,
    )
    for h in HISTORY:  # trend: both earlier runs and the current one
        assert h["run_id"] in html
    assert "burned_in_annotation" in html and "unverifiable_phi" in html
    assert "Studies per institution and modality" in html


def test_deid_audit_renders_every_count(site):
    _, pages = site
    html = pages["deid.html"]
    for key, value in [
        ("actions / removed", "1,234"),
        ("actions / replaced", "321"),
        ("actions / shifted", "77"),
        ("actions / remapped", "456"),
        ("verification_failures", "3"),
        ("burned_in_quarantined", "2"),
    ]:
        assert f'<td>{key}</td><td class="num">{value}</td>' in html, key
    assert "<svg" in html
    # residual PHI scan (GE, counts only): the report text columns flag the planted phone number once
    assert re.search(
        r'<span class="badge fail">FAIL</span></td><td>critical</td><td>reports</td>'
        r'<td class="wrap">text, indication, comparison, findings, impression</td><td class="num">16</td>'
        r'<td class="num">1</td>',
        html,
    )
    assert "617-555-0123" not in html


def test_deid_page_counts_head_series_defaced(site):
    html = site[1]["deid.html"]
    section = html[html.index("Head CT/MR defacing") :]
    section = section[: section.index("</section>")]
    for label in ("defaced", "not_a_volume", "defacing_failed", "before defacing", "after defacing"):
        assert f">{label}<" in section, label


def test_reports_heatmap_and_rates(site):
    _, pages = site
    html = pages["reports.html"]
    assert "F029 Pleural effusion" in html
    # effusion present in 4/4 us-bos reports and 2/4 gb-lon reports
    assert "F029 Pleural effusion · us-bos: 100%" in html and "F029 Pleural effusion · gb-lon: 50%" in html
    # gb-lon: 8 mentions, 4 absent (50 %), 2 uncertain (25 %)
    assert '<td>gb-lon</td><td class="num">8</td><td class="num">50</td><td class="num">25</td>' in html


def test_images_pairs_splits_pages(site):
    _, pages = site
    assert "Row pixel spacing (n=8)" in pages["images.html"]
    assert "Gap between prior and current (n=4)" in pages["pairs.html"]
    assert "A (expected 25%)" in pages["pairs.html"]
    assert '<td>us-bos</td><td class="num">1</td><td class="num">1</td><td class="num">0</td>' in pages["splits.html"]
    for p in ("images.html", "pairs.html", "splits.html", "reports.html"):
        assert "<svg" in pages[p]


def test_checks_and_quarantine_pages(site):
    _, pages = site
    checks = pages["checks.html"]
    assert "expect_column_values_to_be_unique:study_key" in checks and "ledger_balance" in checks
    assert re.search(
        r'<span class="badge fail">FAIL</span></td><td>critical</td><td>reports</td>'
        r'<td class="wrap">expect_column_values_to_not_match_regex_list:text\|',
        checks,
    )  # the planted phone, first
    assert checks.count('class="badge fail"') == 1
    assert '<a href="../data_docs/index.html">Data Docs</a>' in checks
    # failures first, the passes folded away; observed figures as key: value lines, not raw JSON
    assert checks.index('id="failed-checks"') < checks.index('class="badge fail"') < checks.index('id="passed-checks"')
    assert '<details id="passed-checks"><summary>' in checks and "unexpected_count: 1" in checks
    q = pages["quarantine.html"]
    assert _sha(5)[:12] in q and _sha(6)[:12] in q and _sha(0)[:12] not in q  # only quarantined rows
    assert _sha(5) not in q  # the full digest is not needed
    assert 'data-decision="reject">reject</span>' in q and "text in the pixel data confirmed" in q
    assert q.count('data-decision="pending"') == 1  # the other quarantined file
    assert "<form" not in q and "<button" not in q  # the static export is read-only
    assert "OCR hit in [source path]" in q  # leaky detail scrubbed, the rest kept


def test_deterministic_output(site, tmp_path):
    index, pages = site
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    run_info = {
        "run_id": RUN_ID,
        "config": "medreco-demo",
        "operator_note": "<script>alert(1)</script>",
        "source_root": "/mnt/pacs/sources",
        "deid_audit": DEID_AUDIT,
    }
    review = [{"sha256": _sha(5), "decision": "reject", "note": "text in the pixel data confirmed"}]
    build_dashboard(
        tables, quality, run_info, tmp_path, history=HISTORY, review=review, data_docs_href="../data_docs/index.html"
    )
    for p, _ in PAGES:
        assert (tmp_path / p).read_text(encoding="utf-8") == pages[p], p


def test_bad_inputs(tmp_path):
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    with pytest.raises(DashboardInputError) as e:
        build_dashboard(tables, quality, {}, tmp_path)
    assert e.value.reason == "missing_run_id"
    with pytest.raises(DashboardInputError) as e:
        build_dashboard(tables, quality, {"run_id": RUN_ID}, tmp_path, review=[{"sha256": _sha(5), "decision": "ok"}])
    assert e.value.reason == "bad_review"
    with pytest.raises(DashboardInputError) as e:
        build_dashboard(tables, quality, {"run_id": RUN_ID}, tmp_path, history=[{"ingested": 3}])
    assert e.value.reason == "bad_history"
    assert not (tmp_path / "index.html").exists()  # nothing written on bad input


def test_overview_counts_withheld_report_records_per_reason(site, tmp_path):
    """Report records the run withheld (a language without a pack) are counted per reason on the overview."""
    _, pages = site
    assert "No report record withheld." in pages["index.html"]
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    info = {"run_id": RUN_ID, "withheld_reports": {"unsupported_language": 3, "empty_report": 1}}
    html = build_dashboard(tables, quality, info, tmp_path).read_text(encoding="utf-8")
    part = html[html.index("<h2>Report records withheld by this run</h2>") :]
    assert '<div class="v">4</div><div class="k">report records withheld</div>' in part
    assert re.search(r'<td>unsupported_language</td><td class="num">3</td>', part)
    assert re.search(r'<td>empty_report</td><td class="num">1</td>', part)


def test_empty_run_renders(tmp_path):
    quality = run_checks({}, load_ontology(), today=dt.date(2025, 6, 1))
    index = build_dashboard({}, quality, {"run_id": "empty-run"}, tmp_path)
    html = index.read_text()
    assert "empty-run" in html and '<div class="v">0</div><div class="k">files seen by this run</div>' in html
    assert "no de-identification audit" in (tmp_path / "deid.html").read_text()


def test_safe_ledger_drops_paths():
    led = safe_ledger(make_tables()["ledger"])
    assert "source_uri" not in led.column_names and "duplicate_of" not in led.column_names
    assert led.column("opaque_id").to_pylist()[0] == _sha(0)[:12]
    assert "SMITH" not in json.dumps(led.to_pylist()) and "us-bos" in led.column("institution").to_pylist()


def test_svg_helpers():
    h = svg_histogram([1, 1, 2, 3, None], integer=True, title="t", unit="x")
    assert h.count("<rect") == 3 and "t (n=4, 1 missing)" in h and "<title>1 x: 2</title>" in h
    b = svg_bar_chart([("<a>", 3), ("b", 1)], title="T&")
    assert "&lt;a&gt;" in b and "<a>" not in b and "T&amp;" in b and b.count("<rect") == 2
    m = svg_heatmap(["r1", "r2"], ["c1"], [[0.25], [float("nan")]], title="hm")
    assert "r1 · c1: 25%" in m and "#eeeeee" in m
    with pytest.raises(ValueError):
        svg_heatmap(["r1"], ["c1", "c2"], [[1.0]])
    with pytest.raises(ValueError):
        svg_stacked_bars(["a", "b"], {"s": [1]})
    assert "no data" in svg_histogram([], title="empty")


def test_histograms_bin_whole_numbers_whole_and_label_the_axis():
    """Integer data over a wide range: bins of whole numbers (no bin edge splits a value at .5 in a label),
    several axis labels, not only min and max; a one-cell heatmap keeps its whole title (issue 40, point 9)."""
    import re as _re

    h = svg_histogram(list(range(1, 101)) + [100] * 5, integer=True, title="slices per series", unit="slices")
    tips = _re.findall(r"<title>([^<]*) slices: (\d+)</title>", h)
    assert len(tips) <= 20 and all("." not in rng for rng, _ in tips)
    assert sum(int(n) for _, n in tips) == 105 and tips[0][0] == "1–5"
    labels = _re.findall(
        r'<text x="[\d.]+" y="\d+" font-size="11" text-anchor="(?:start|middle|end)">([^<]+)</text>', h
    )
    assert len(labels) >= 5 and all(x.isdigit() for x in labels[:5])
    f = svg_histogram([0.1, 0.5, 2.5, 3.0], title="spacing", unit="mm")
    assert len(_re.findall(r"<line x1", f)) >= 5  # the axis and its ticks
    title = "Studies per institution and modality"
    m = svg_heatmap(["us-a"], ["CR"], np.ones((1, 1)), title=title, percent=False)
    width = int(_re.search(r'width="(\d+)"', m).group(1))
    from quality.dashboard import text_width

    assert width >= text_width(title, 13)


def test_every_inline_svg_is_well_formed(site):

    _, pages = site
    n = 0
    for name, html in pages.items():
        for svg in re.findall(r"<svg\b.*?</svg>", html, flags=re.DOTALL):
            root = ET.fromstring(svg)  # raises on malformed markup
            assert root.tag == "svg" and int(root.get("width")) > 0 and int(root.get("height")) > 0, name
            n += 1
    assert n >= 15


def test_path_scrubber_replaces_whole_tokens_only():
    """Found by a new-user trial: the folder 'data' mangled 'pixel_data_length_mismatch'."""
    from quality.dashboard import _path_fragments, _scrub

    fr = _path_fragments("/work/shared/data/edge/DOE_JOHN_1.dcm")
    assert _scrub("pixel_data_length_mismatch", fr) == "pixel_data_length_mismatch"
    assert _scrub("PixelData holds 0 bytes", fr) == "PixelData holds 0 bytes"
    assert _scrub("file DOE_JOHN_1.dcm; patient DOE", fr) == "file [source path]; patient [source path]"


def test_path_scrubber_removes_paths_not_words():
    """Found by a new-user trial: the stage name 'reports' and the word 'data' became '[source path]'."""
    from quality.dashboard import _path_fragments, _scrub

    fr = _path_fragments("/work/shared/data/reports/us-bos/SMITH^JANE_1961/IM0001.dcm")
    assert _scrub("reports", fr) == "reports"
    assert _scrub("no data in the reports stage", fr) == "no data in the reports stage"
    assert (
        _scrub("read /work/shared/data/reports/us-bos/SMITH^JANE_1961/IM0001.dcm: bad", fr) == "read [source path]: bad"
    )
    assert _scrub("in data/reports/us-bos", fr) == "in [source path]"  # a piece of the path is still a path
    assert (
        _scrub("IM0001.dcm line 3; SMITH^JANE_1961; patient SMITH", fr)
        == "[source path] line 3; [source path]; patient [source path]"
    )  # name-shaped folders and their parts
    led = table_from_rows(
        [
            dict(
                run_id=RUN_ID,
                source_uri="/srv/data/reports/r.jsonl",
                sha256=_sha(1),
                bytes=1,
                institution="us-bos",
                kind="report",
                shard=0,
                status="quarantined",
                stage="reports",
                reason="malformed_report_record",
                detail="no record could be read (1 error): r.jsonl line 1: no data",
            )
        ],
        SCHEMAS["ledger"],
    )
    row = safe_ledger(led).to_pylist()[0]
    assert (
        row["stage"] == "reports"
        and row["detail"] == "no record could be read (1 error): [source path] line 1: no data"
    )


def test_labels_get_the_room_they_need():
    """Found by a new-user trial: 'pixel_data_length_mismatch' was drawn as 'ixel_data_length_mismatch'."""
    from quality.dashboard import _short_category, text_width

    label = "quarantined:pixel_data_length_mismatch"
    svg = svg_bar_chart([(label, 3), ("ok", 1)], title="t")
    x = float(re.search(r'<text x="([0-9.]+)" y="[0-9.]+" font-size="12" text-anchor="end">quarantined', svg).group(1))
    assert x >= text_width(label, 12)  # the right-aligned label starts inside the chart
    heat = svg_heatmap(["F045 Other non-mass brain parenchymal abnormality"], ["us-sea-university"], np.ones((1, 1)))
    root = ET.fromstring(heat)
    row_label = [t for t in root.iter("text") if t.get("text-anchor") == "end"][0]
    assert float(row_label.get("x")) >= text_width(row_label.text, 11)
    assert _short_category("manual__2026-12-01T23_46_54.008100_00_00") == "manual 2026-12-01 23:46:54"
    assert _short_category("scheduled__2026-12-02T02:00:00+00:00") == "scheduled 2026-12-02 02:00:00"
    bars = ET.fromstring(svg_stacked_bars(["manual__2026-12-01T23_46_54.008100_00_00"] * 3, {"a": [1, 2, 3]}))
    assert int(bars.get("height")) >= 24 + text_width("manual 2026-12-01 23:46:54", 10) / 2


def test_every_page_links_the_review_app_and_names_the_curator(tmp_path):
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    review = [{"sha256": _sha(5), "decision": "reject", "note": "text in the pixel data confirmed", "curator": "carol"}]
    build_dashboard(tables, quality, {"run_id": RUN_ID}, tmp_path, review=review)
    for page, _ in PAGES:  # a link that works opened from disk too: the quarantine page's record-decisions section
        assert (
            '<a class="review" href="quarantine.html#record-decisions" id="review-nav">'
            in (tmp_path / page).read_text()
        ), page
    q = (tmp_path / "quarantine.html").read_text()
    assert 'id="record-decisions"' in q and '<a class="review" href="../review" id="review-link">' in q
    assert "<th>curator</th><th>note</th>" in q and "<td>carol</td>" in q


def test_every_link_of_the_dashboard_opened_from_disk_resolves(tmp_path):
    """Opened as files (no app behind it), every relative link of every page names a page that exists, but the one
    link to the served review app on the quarantine page (issue 40, point 7)."""
    from html.parser import HTMLParser
    from urllib.parse import urlsplit

    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    (tmp_path / "data_docs").mkdir()
    (tmp_path / "data_docs" / "index.html").write_text("<html></html>")
    build_dashboard(
        tables, quality, {"run_id": RUN_ID}, tmp_path / "dashboard", data_docs_href="../data_docs/index.html"
    )

    class Links(HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs = []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "a" and a.get("href"):
                self.hrefs.append((a["href"], a.get("id")))

    dead = []
    for page, _ in PAGES:
        parser = Links()
        parser.feed((tmp_path / "dashboard" / page).read_text())
        for href, ident in parser.hrefs:
            target = urlsplit(href)
            if target.scheme or not target.path or ident == "review-link":
                continue
            if not (tmp_path / "dashboard" / target.path).resolve().is_file():
                dead.append((page, href))
    assert dead == []


def test_pages_name_the_release_once_it_is_published(tmp_path):
    """The pages are built before the release exists; the snapshot task stamps its version and content hash into
    every page's header (issue 40, point 9), and stamping again replaces it."""
    from etl import zones
    from etl.storage import Storage
    from quality.dashboard import stamp_release

    st = Storage.open(str(tmp_path / "root"))
    tables = make_tables()
    quality = run_checks(tables, load_ontology(), today=dt.date(2025, 6, 1))
    out = build_dashboard(tables, quality, {"run_id": RUN_ID}, tmp_path / "pages")
    for page in out.parent.glob("*.html"):
        assert "release: not yet published by this run" in page.read_text()
        st.write_bytes(f"{zones.DASHBOARD_DIR}/{page.name}", page.read_bytes())
    assert stamp_release(st, "0.3.0", "ab" * 32) == len(PAGES)
    assert stamp_release(st, "0.4.0", "cd" * 32) == len(PAGES)
    for page, _ in PAGES:
        text = st.read_text(f"{zones.DASHBOARD_DIR}/{page}")
        assert 'release <span class="mono">0.4.0</span> (content hash <span class="mono">' + "cd" * 8 in text
        assert "0.3.0" not in text and text.count('id="release"') == 1
