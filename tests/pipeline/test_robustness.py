"""Issue 19, items 1, 3 and 4 through the build stages: one bad value never stops the build, a header value never
writes outside its zone, a long input never stalls it. The slow test runs the seeded fuzzer's files through the
whole build DAG (``dag.test()``)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pydicom
import pytest
from conftest import SHARED_DATA, config_for
from fuzz_dicom import PLANTED_BYTES, fuzz_corpus
from pydicom.dataelem import RawDataElement
from pydicom.tag import Tag
from test_incremental import build

INST = "ie-cork-mercy"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    from helpers import demo_sources

    return demo_sources(tmp_path_factory.mktemp("robust"))


def _root(template: Path, name: str) -> Path:
    from helpers import fresh_root

    return fresh_root(template, name)


def _attack_file(src: Path, dst: Path, **raw: bytes) -> None:
    ds = pydicom.dcmread(src)
    ds.SOPInstanceUID = ds.SOPInstanceUID + ".19"  # a new instance of the same series
    for keyword, value in raw.items():
        tag = Tag(pydicom.datadict.tag_for_keyword(keyword))
        ds[tag] = RawDataElement(tag, pydicom.datadict.dictionary_VR(tag), len(value), value, 0, False, True)
    buf = io.BytesIO()
    ds.save_as(buf)
    dst.write_bytes(buf.getvalue())


def _files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_bad_header_values_are_quarantined_and_the_build_goes_on(template, monkeypatch):
    """Item 3's attack (InstanceNumber ``0!``), item 1's (a Modality that climbs to the source zone and out of the
    root) and item 4's (a 40 KB SeriesDescription, a 2 MB report, a report whose de-identification raises)."""
    import entity_extraction.text_deid as text_deid

    root = _root(template, "attacks")
    dicom = sorted((root / "sources" / INST / "dicom").rglob("*.dcm"))
    attacks = root / "sources" / INST / "dicom" / "attacks"
    attacks.mkdir()
    _attack_file(dicom[0], attacks / "instance_number.dcm", InstanceNumber=b"0!")
    _attack_file(dicom[1], attacks / "modality_in.dcm", Modality=b"/../../../../sources/ie-cork-mercy/PWNED ")
    _attack_file(dicom[2], attacks / "modality_out.dcm", Modality=b"/../../../../../ESCAPED_ROOT")
    _attack_file(dicom[3], attacks / "long_description.dcm", SeriesDescription=b"ab" * 20_000)
    reports = root / "sources" / INST / "reports" / "reports.jsonl"
    lines = reports.read_text().splitlines()
    first = json.loads(lines[0])
    lines.append(json.dumps({**first, "report_id": "LONG-1", "text": "x" * 2_000_000}))
    lines.append(json.dumps({**first, "report_id": "BOOM-1", "text": "BOOM marker report"}))
    reports.write_text("\n".join(lines) + "\n")
    real = text_deid.deidentify_text

    def flaky(text, *a, **k):
        if "BOOM marker" in text:
            raise RuntimeError("secret text BOOM marker")  # an exception whose text quotes the report
        return real(text, *a, **k)

    monkeypatch.setattr(text_deid, "deidentify_text", flaky)
    t0 = time.monotonic()
    out = build(config_for(root, shard_count=2), "attacks")
    assert time.monotonic() - t0 < 600
    ledger = out["ledger"]
    assert ledger["balanced"]
    events = out["ctx"].storage.read_table(out["ctx"].ledger_path).to_pylist()
    outcome = {e["source_uri"].rsplit("/", 1)[-1]: (e["status"], e["reason"]) for e in events}
    assert outcome["instance_number.dcm"] == ("quarantined", "invalid_value")
    assert outcome["long_description.dcm"] == ("quarantined", "value_too_long")
    assert outcome["modality_in.dcm"] == outcome["modality_out.dcm"] == ("quarantined", "invalid_value")
    # the traversal Modality is no table value (and would only be an encoded folder name: tests/core)
    assert not (root / "sources" / INST / "PWNED").exists() and not (template / "ESCAPED_ROOT").exists()
    assert {p.relative_to(root).parts[0] for p in _files_under(root)} <= {
        "sources",
        "ledger",
        "quarantine",
        "curated",
        "snapshots",
        "reports",
    }
    assert {
        p.relative_to(template).parts[0] for p in _files_under(template) if len(p.relative_to(template).parts) > 1
    } == {"template", "attacks"}  # nothing escaped the root
    for p in _files_under(root / "sources"):
        assert "PWNED" not in p.name
    for p in _files_under(root / "curated" / "images"):
        assert ".." not in p.relative_to(root).parts
    withheld = json.loads((root / "ledger" / "runs" / "attacks" / "withheld_reports.json").read_text())
    reasons = {w["record"]: w["reason"] for w in withheld}
    assert reasons["LONG-1"] == "report_too_long" and reasons["BOOM-1"] == "report_processing_error"
    text = json.dumps(withheld)
    assert "secret text" not in text and "xxxxxxxx" not in text
    records = [json.loads(p.read_text()) for p in _files_under(root / "quarantine")]
    assert all("secret text" not in json.dumps(r) for r in records)
    assert out["summary"]["version"]  # published, with the bad inputs quarantined


def test_normalise_retries_series_alone_and_quarantines_the_one_that_raises(monkeypatch):
    from etl.pixels import series

    real = series.normalise_instances

    def picky(items, cfg, **kw):
        items = list(items)
        if any(r["series_key"] == "bad" for r, _ in items):
            raise ZeroDivisionError("value 12345 from a header")
        return real(items, cfg, **kw)

    monkeypatch.setattr(series, "normalise_instances", picky)
    rows = [{"sop_key": "s1", "series_key": "bad"}, {"sop_key": "s2", "series_key": "bad"}]
    out = series.normalise_shard_guarded(rows, lambda r: ValueError("unreadable"), None)
    assert [(f.sop_keys, f.reason) for f in out.failures] == [(("s1", "s2"), "normalisation_error")]
    assert "12345" not in out.failures[0].detail


@pytest.mark.slow
def test_fuzzed_files_through_the_whole_build(template, airflow_home):
    """The seeded fuzzer's files (one institution's delivery beside the demo corpus) through the build DAG with
    ``dag.test()``: the run succeeds and publishes, the ledger balances, the planted identity is in no
    de-identified zone, and every file stays in its zone."""
    from medreco.cli.embedded import run_build

    root = _root(template, "fuzzed")
    made = fuzz_corpus(root / "sources" / INST / "dicom" / "fuzzed", 220, SHARED_DATA if SHARED_DATA.is_dir() else None)
    summary = run_build(config_for(root, shard_count=4, max_map_length=2))
    assert summary["ledger"]["balanced"]
    quarantined = summary["ledger"]["quarantined"]
    assert quarantined >= len(made) // 3  # most mutations are caught; none stopped the run
    for zone in ("curated", "snapshots", "reports"):
        for p in _files_under(root / zone):
            data = p.read_bytes()
            for planted in PLANTED_BYTES:
                assert planted not in data, (p, planted)
    assert not list(root.parent.glob("**/PWNED"))
    assert {p.relative_to(root).parts[0] for p in _files_under(root)} <= {
        "sources",
        "ledger",
        "quarantine",
        "curated",
        "snapshots",
        "reports",
    }
