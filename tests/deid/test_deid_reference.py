"""De-identification against public answer keys and edge cases in ../shared/data:
PHI_LOCATIONS.csv (TCIA pseudo-PHI and pydicom/deid-data files), already de-identified negative controls,
and every file of dicom-edge (de-identified correctly or quarantined with a specific reason)."""

from __future__ import annotations

import csv
import io
import re
import warnings
from pathlib import Path

import pydicom
import pytest
from helpers import decode_strictly

from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.deid.policy import build_policy
from etl.sources.discover import classify_dicom

SPECIFIC_REASONS = {
    "missing_patient_id",
    "missing_uid",
    "truncated_file",
    "burned_in_annotation_risk",
    "unparseable_date",
    "verification_failed",
    "pixel_cleaning_failed",
    # burned-in text (issue 17): text left after blanking; pixels nobody could read for text are
    # quarantined at de-identification with the decoder's reason (fail closed)
    "burned_in_text_remaining",
    "burned_in_text_unreadable",
    "pixel_data_length_mismatch",
    "unsupported_transfer_syntax",
    "decode_error",
}


def _deid(path: Path, key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return deidentify_dataset(pydicom.dcmread(path, force=True), key, "ref")


def test_phi_locations_leave_nothing(shared_data, key):
    """Every identifying value PHI_LOCATIONS.csv lists is gone from every output file (values the options
    retain on purpose, sex/size/weight/age, and dates, which are shifted, are compared per element)."""
    deid = shared_data / "deid"
    rows = list(csv.DictReader(open(deid / "PHI_LOCATIONS.csv", newline="", encoding="utf-8")))
    policy = build_policy()
    outputs, quarantined = {}, {}
    for f in sorted({r["file"] for r in rows}):
        try:
            outputs[f] = _deid(deid / f, key)
        except DeidentificationError as err:
            quarantined[f] = err.reason
    # with OCR the ultrasound and the secondary captures are read instead of quarantined wholesale; the
    # secondary capture humans/ctbrain1.dcm (no text found) then meets the output verifier, which withholds it
    assert set(quarantined.values()) <= {"burned_in_annotation_risk", "burned_in_text_remaining", "verification_failed"}
    assert len(outputs) >= 13
    leaks, checked = [], 0
    for r in rows:
        if r["file"] not in outputs or not r["value"].strip():
            continue
        tag = int(r["tag"].strip("()").replace(",", ""), 16)
        if r["private"] == "no" and policy.action_for(tag) in ("K", "AGE"):
            continue  # Retain Patient Characteristics keeps these values by design
        out = pydicom.dcmread(io.BytesIO(outputs[r["file"]].to_bytes()))
        if r["vr"] in ("DA", "DT", "TM"):
            elem = out.get(tag)
            if elem is not None and str(elem.value) == r["value"] and r["vr"] != "TM":
                leaks.append(f"{r['file']}:{r['tag']} date not shifted")
            checked += 1
            continue
        value = r["value"].strip()
        cleaned = {str(out.get(k, "") or "") for k in ("StudyDescription", "SeriesDescription", "ProtocolName")}
        if len(value) < 4 or policy.action_for(tag) == "CLEAN" or value in cleaned:
            continue  # Clean Descriptors keeps these, scrubbed (checked below); their text may recur elsewhere
        if re.search(
            rb"(?<![A-Za-z0-9.])" + re.escape(value.encode("utf-8", "ignore")) + rb"(?![A-Za-z0-9])",
            outputs[r["file"]].to_bytes(),
        ):
            leaks.append(f"{r['file']}:{r['tag']} {r['keyword']}")
        checked += 1
    names = {p for r in rows if r["vr"] == "PN" for p in re.split(r"[\^ ]+", r["value"]) if len(p) >= 3}
    for r in outputs.values():
        out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
        for k in ("StudyDescription", "SeriesDescription", "ProtocolName"):
            text = str(out.get(k, "") or "")
            leaks += [f"{k} keeps a name" for n in names if re.search(rf"\b{re.escape(n)}\b", text, re.IGNORECASE)]
    assert checked > 300
    assert leaks == [], "\n".join(leaks)


def test_already_deidentified_files_pass_through(shared_data, key):
    files = sorted((shared_data / "deid" / "already-deidentified").glob("*.dcm"))
    assert files, "no already de-identified file under ../shared/data/deid/already-deidentified"
    for f in files:
        src = pydicom.dcmread(f)
        r = _deid(f, key)
        out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
        assert out.PatientIdentityRemoved == "YES"
        assert out.Rows == src.Rows and out.pixel_array.shape == src.pixel_array.shape
        assert (out.pixel_array == src.pixel_array).all()


def test_every_edge_case_is_deidentified_or_quarantined_with_a_reason(shared_data, key):
    outcomes = {}
    for f in sorted(p for p in (shared_data / "dicom-edge").rglob("*") if p.is_file()):
        if f.suffix in (".md", ".csv"):
            continue
        data = f.read_bytes()
        _, reason, _ = classify_dicom(data)
        if reason:
            outcomes[f.name] = reason
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = deidentify_dataset(pydicom.dcmread(io.BytesIO(data), force=True), key, "edge")
            back = pydicom.dcmread(io.BytesIO(r.to_bytes()))
            assert back.file_meta.MediaStorageSOPInstanceUID == back.SOPInstanceUID
            outcomes[f.name] = "ok"
        except DeidentificationError as err:
            outcomes[f.name] = err.reason
    assert len(outcomes) >= 50
    unexpected = {
        n: o for n, o in outcomes.items() if o not in SPECIFIC_REASONS | {"ok", "not_dicom", "unreadable_dicom"}
    }
    assert unexpected == {}
    assert sum(o == "ok" for o in outcomes.values()) >= 20


@pytest.mark.parametrize("charset", ["ISO_IR 100", "ISO_IR 192", "GB18030", "ISO 2022 IR 6\\ISO 2022 IR 87"])
def test_charsets_read_and_output_decodes(key, charset):
    from pydicom.data import get_testdata_file

    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    ds.SpecificCharacterSet = charset
    names = {
        "ISO_IR 100": "Müller^Jürgen",
        "ISO_IR 192": "Ó Briain^Seán",
        "GB18030": "王^小明",
        "ISO 2022 IR 6\\ISO 2022 IR 87": "ﾔﾏﾀﾞ^ﾀﾛｳ=山田^太郎",
    }
    ds.PatientName = names[charset]
    ds.StudyDescription = f"CT chest for {names[charset].split('^')[0]}"
    r = deidentify_dataset(ds, key, "cs")
    out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
    decode_strictly(out)
    assert str(out.PatientName) == r.patient_key
    assert names[charset].split("^")[0].split("=")[0] not in str(out.StudyDescription)
