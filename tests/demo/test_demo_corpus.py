"""Tests of the synthetic demo corpus generator (etl/demo/corpus.py, etl/demo/reports.py)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pydicom
import pytest
from pydicom.tag import Tag

from etl.demo.corpus import (
    DEMO_INSTITUTIONS,
    FAMILIES,
    HEAD_CT_PATIENTS,
    HEAD_MR_PATIENTS,
    DemoCorpusError,
    generate_corpus,
)
from etl.demo.reports import CHANGES, DemoReportError, family_phrases, load_phrases, plan_entities
from etl.sources.reports import REPORT_FIELDS
from schemas.config import PROJECT_ROOT, load_config
from schemas.ontology import load_ontology, modality_family

REPO = PROJECT_ROOT
N_PATIENTS = 16
REPORT_KEYS = set(REPORT_FIELDS)  # the demo writes exactly what the report reader expects


def _tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "corpus"
    summary = generate_corpus(out, seed=0, n_patients=N_PATIENTS)
    return out, summary


@pytest.fixture(scope="module")
def interrupted(corpus) -> list[dict]:
    """answer_key/quarantine.jsonl: the files the build must quarantine (the interrupted transfers)."""
    out, _ = corpus
    return [json.loads(x) for x in (out / "answer_key" / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def dicoms(corpus) -> dict[str, pydicom.Dataset]:
    """Every DICOM file of the corpus (the interrupted transfers' headers read whole; their pixels do not decode)."""
    out, _ = corpus
    return {str(p.relative_to(out)): pydicom.dcmread(p) for p in sorted(out.glob("sources/*/dicom/**/*.dcm"))}


@pytest.fixture(scope="module")
def intact(dicoms, interrupted) -> dict[str, pydicom.Dataset]:
    """The files whose pixels decode: every one but the interrupted transfers."""
    cut = {e["file"] for e in interrupted}
    return {rel: ds for rel, ds in dicoms.items() if rel not in cut}


def test_interrupted_transfers_end_inside_their_pixel_data(corpus, intact, interrupted):
    """Two radiograph copies cut inside PixelData, each under a SOPInstanceUID of its own, in a study whose intact
    files are there; the answer key says the build quarantines them as truncated_file when it reads them."""
    from etl.sources.dicom_integrity import last_element_cut

    out, _ = corpus
    assert len(interrupted) == 2 and len({e["institution"] for e in interrupted}) == 2
    sops = {ds.SOPInstanceUID for ds in intact.values()}
    for e in interrupted:
        assert (e["stage"], e["reason"]) == ("deidentify", "truncated_file")
        ds = pydicom.dcmread(out / e["file"])
        assert ds.Modality in ("CR", "DX") and ds.SOPInstanceUID not in sops
        assert any(d.StudyInstanceUID == ds.StudyInstanceUID for d in intact.values())
        assert last_element_cut(ds) == "(7FE0,0010)"
        with pytest.raises(ValueError, match="less than expected"):
            _ = ds.pixel_array


@pytest.fixture(scope="module")
def phi_rows(corpus) -> list[dict]:
    out, _ = corpus
    return [json.loads(line) for line in (out / "answer_key" / "phi.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def reports(corpus) -> list[dict]:
    out, _ = corpus
    rows = []
    for f in sorted(out.glob("sources/*/reports/reports.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            r["_institution"] = f.parts[-3]
            rows.append(r)
    return rows


@pytest.fixture(scope="module")
def truth(corpus) -> dict[str, dict]:
    out, _ = corpus
    lines = (out / "answer_key" / "truth.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["report_id"]: r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def withheld(corpus) -> dict[str, dict]:
    """answer_key/withheld_reports.jsonl: the outside reports in languages without a pack, by report id."""
    out, _ = corpus
    lines = (out / "answer_key" / "withheld_reports.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["report_id"]: r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def kept(reports, withheld) -> list[dict]:
    """The reports the build keeps (every one but the withheld outside reports)."""
    return [r for r in reports if r["report_id"] not in withheld]


# --------------------------------------------------------------------------------------- institutions


def test_demo_institutions_equal_config():
    cfg = load_config(REPO / "config" / "demo.yaml")
    assert [i.id for i in DEMO_INSTITUTIONS] == [i.id for i in cfg.institutions]
    for mine, conf in zip(DEMO_INSTITUTIONS, cfg.institutions, strict=True):
        assert (mine.country, mine.timezone, mine.name, mine.language) == (
            conf.country,
            conf.timezone,
            conf.name,
            conf.language,
        )


def test_eight_institutions_in_six_countries_and_three_report_languages(corpus, dicoms, kept):
    out, summary = corpus
    assert summary["institutions"] == 8
    assert sorted(p.name for p in (out / "sources").iterdir()) == sorted(i.id for i in DEMO_INSTITUTIONS)
    assert len({i.country for i in DEMO_INSTITUTIONS}) == 6
    language_of = {i.id: i.language for i in DEMO_INSTITUTIONS}
    assert sorted(language_of.values()).count("en") == 6 and {"de", "es"} < set(language_of.values())
    for r in kept:  # every report the build keeps is written in its institution's language
        assert r["language"] == language_of[r["_institution"]]
    assert {r["language"] for r in kept} == {"en", "de", "es"}
    for inst in DEMO_INSTITUTIONS:
        assert any(k.startswith(f"sources/{inst.id}/dicom/") for k in dicoms), inst.id
        assert (out / "sources" / inst.id / "reports" / "reports.jsonl").stat().st_size > 0


# --------------------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_tree_and_other_seed_differs(corpus, tmp_path):
    out, summary = corpus
    again = generate_corpus(tmp_path / "again", seed=0, n_patients=N_PATIENTS)
    assert again == summary
    first = _tree_hashes(out)
    assert _tree_hashes(tmp_path / "again") == first
    generate_corpus(tmp_path / "other", seed=1, n_patients=N_PATIENTS)
    other = _tree_hashes(tmp_path / "other")
    assert other != first
    assert other["answer_key/phi.jsonl"] != first["answer_key/phi.jsonl"]


def test_summary_matches_files(corpus, dicoms, intact, interrupted, phi_rows, reports, truth, withheld):
    out, summary = corpus
    assert summary["patients"] == N_PATIENTS
    assert summary["dicom_files"] == len(dicoms) == len(intact) + len(interrupted)
    assert summary["reports"] == len(reports) == len(truth) + len(withheld) == summary["truth_records"] + 3
    assert summary["unsupported_language_reports"] == len(withheld) == 3
    assert summary["phi_values"] == len(phi_rows)
    assert summary["studies"] == len({ds.StudyInstanceUID for ds in dicoms.values()})
    assert summary["bytes"] == sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert summary["bytes"] < 15_000_000  # 16 patients; the 48-patient default stays well under 40 MB


def test_bad_arguments_raise_with_reason(tmp_path, corpus):
    with pytest.raises(DemoCorpusError) as e:
        generate_corpus(tmp_path / "x", n_patients=7)
    assert e.value.reason == "too_few_patients"
    with pytest.raises(DemoCorpusError) as e:
        generate_corpus(corpus[0], n_patients=N_PATIENTS)
    assert e.value.reason == "out_not_empty"


# ---------------------------------------------------------------------------------------------- DICOM


def _resolve(ds: pydicom.Dataset, path: str):
    """Element addressed by a phi.jsonl DICOM location (``A[0].B``, ``private (gggg,eeee)``)."""
    cur: pydicom.Dataset = ds
    parts = path.split(".")
    for n, part in enumerate(parts):
        m = re.fullmatch(r"(?:private \(([0-9A-F]{4}),([0-9A-F]{4})\)|(\w+))(?:\[(\d+)\])?", part)
        assert m, part
        if m.group(3):
            kw = m.group(3)
            elem = cur.file_meta[kw] if kw.startswith("MediaStorage") else cur[kw]
        else:
            elem = cur[Tag(int(m.group(1), 16), int(m.group(2), 16))]
        if m.group(4) is not None:
            cur = elem.value[int(m.group(4))]
        elif n != len(parts) - 1:
            raise AssertionError(f"{path}: sequence without index")
    return elem


def _text(elem, charset: str = "ISO_IR 192") -> str:
    v = elem.value
    if isinstance(v, bytes):  # private elements of Implicit VR files read as UN: decoded in the file's charset
        return v.decode("utf-8" if charset == "ISO_IR 192" else "latin-1").rstrip("\x00 ")
    return str(v)


REQUIRED_DICOM_PHI = {
    "PatientName",
    "PatientID",
    "OtherPatientIDs",
    "IssuerOfPatientID",
    "PatientBirthDate",
    "PatientAge",
    "PatientAddress",
    "PatientTelephoneNumbers",
    "InstitutionName",
    "InstitutionAddress",
    "ReferringPhysicianName",
    "PerformingPhysicianName",
    "OperatorsName",
    "AccessionNumber",
    "StudyID",
    "StudyDate",
    "SeriesDate",
    "AcquisitionDate",
    "ContentDate",
    "StudyTime",
    "SeriesTime",
    "AcquisitionTime",
    "ContentTime",
    "AcquisitionDateTime",
    "StudyDescription",
    "ImageComments",
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SOPInstanceUID",
    "MediaStorageSOPInstanceUID",
    "RequestAttributesSequence[0].RequestedProcedureID",
    "RequestAttributesSequence[0].ScheduledProcedureStepID",
    "RequestAttributesSequence[0].ReferencedStudySequence[0].ReferencedSOPInstanceUID",
    "ReferencedPatientSequence[0].ReferencedSOPInstanceUID",
    "private (0009,1001)",
    "private (0009,1002)[0].private (0009,1001)",
}


def test_every_dicom_reads_and_holds_its_listed_phi(dicoms, intact, phi_rows):
    by_file = defaultdict(list)
    for r in phi_rows:
        by_file[r["file"]].append(r)
    for rel, ds in dicoms.items():
        if rel in intact:
            arr = ds.pixel_array
            assert arr.shape[:2] == (ds.Rows, ds.Columns)
        assert ds.file_meta.ImplementationVersionName == "MEDRECO_DEMO_1"
        assert ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID
        rows = by_file[rel]
        locations = {r["location"].removeprefix("dicom:") for r in rows if r["location"].startswith("dicom:")}
        assert REQUIRED_DICOM_PHI <= locations, (rel, REQUIRED_DICOM_PHI - locations)
        for r in rows:
            assert r["institution"] == rel.split("/")[1]
            if r["location"].startswith("dicom:"):
                assert _text(_resolve(ds, r["location"][6:]), ds.SpecificCharacterSet) == r["value"], (rel, r)
            elif r["location"] == "path":
                assert r["value"] in rel
            else:
                assert r["location"] == "burned_in"
                assert ds.BurnedInAnnotation == "YES"
    assert len(by_file) >= len(dicoms)


def test_exactly_two_burned_in_ultrasound_images(dicoms, phi_rows):
    yes = sorted(rel for rel, ds in dicoms.items() if ds.BurnedInAnnotation == "YES")
    assert len(yes) == 2
    assert all(dicoms[rel].Modality == "US" for rel in yes)
    assert all(ds.BurnedInAnnotation == "NO" for rel, ds in dicoms.items() if rel not in yes)
    assert sorted({r["file"] for r in phi_rows if r["location"] == "burned_in"}) == yes


def test_patient_named_folders_hold_phi(dicoms, phi_rows):
    path_rows = [r for r in phi_rows if r["location"] == "path"]
    assert {r["phi_type"] for r in path_rows} >= {"name", "id", "date", "uid"}
    named = [r for r in path_rows if r["phi_type"] == "name"]
    for r in named:
        ds = dicoms[r["file"]]
        folder = r["file"].split("/")[3]
        assert folder == f"{r['value']}_{ds.PatientID}"
        assert r["file"].split("/")[4] == f"{ds.Modality}_{ds.StudyDate}"
    assert {r["institution"] for r in named} == {i.id for i in DEMO_INSTITUTIONS if i.layout == "patient"}


def test_name_spellings_vary_across_studies_and_old_patients(dicoms):
    names = defaultdict(set)
    for ds in dicoms.values():
        names[ds.PatientID].add(str(ds.PatientName))
    assert sum(len(v) >= 2 for v in names.values()) >= 3
    for ds in dicoms.values():
        birth = datetime.strptime(ds.PatientBirthDate, "%Y%m%d").date()
        study = datetime.strptime(ds.StudyDate, "%Y%m%d").date()
        years = study.year - birth.year - ((study.month, study.day) < (birth.month, birth.day))
        assert ds.PatientAge == f"{years:03d}Y"
    assert any(int(ds.PatientAge[:3]) > 89 for ds in dicoms.values())


def test_acquisition_datetime_offsets_follow_institution_time_zone(dicoms):
    seen = 0
    for rel, ds in dicoms.items():
        m = re.fullmatch(r"\d{14}(\.\d{6})?([+-]\d{4})?", ds.AcquisitionDateTime)
        assert m, ds.AcquisitionDateTime
        if m.group(2):
            seen += 1
            country = next(i.country for i in DEMO_INSTITUTIONS if i.id == rel.split("/")[1])
            assert m.group(2)[0] == {"US": "-", "AU": "+"}.get(country, m.group(2)[0])
            assert m.group(2) in {
                ds.TimezoneOffsetFromUTC,
                "+0000",
                "+0100",
                "-0400",
                "-0500",
                "-0700",
                "-0800",
                "+0200",
                "+1000",
                "+1100",
            }
    assert seen > 0


def test_longitudinal_patients_and_families(dicoms):
    studies = defaultdict(dict)
    for ds in dicoms.values():
        studies[ds.PatientID][ds.StudyInstanceUID] = (
            ds.StudyDate,
            modality_family(ds.Modality, ds.BodyPartExamined),
        )
    assert len(studies) == N_PATIENTS
    assert sum(len(s) >= 2 for s in studies.values()) >= N_PATIENTS / 2
    head_ct = [u for s in studies.values() for u, (_, f) in s.items() if f is None]
    assert len(head_ct) == HEAD_CT_PATIENTS  # CT of the head has no MedReCo family (no labels)
    for s in studies.values():
        assert 1 <= len({u for u, (_, f) in s.items() if f is not None}) <= 4
        dates = sorted(datetime.strptime(d, "%Y%m%d") for d, _ in s.values())
        assert (dates[-1] - dates[0]).days <= 3 * 365
    fams = {f for s in studies.values() for _, f in s.values()}
    assert fams == set(FAMILIES) | {None}
    # pairs: some patient has two studies of one family
    assert any(len([f for _, f in s.values()]) > len({f for _, f in s.values()}) for s in studies.values())


def test_modality_specific_headers(dicoms):
    by_series = defaultdict(list)
    for ds in dicoms.values():
        by_series[ds.SeriesInstanceUID].append(ds)
        if ds.Modality in ("CR", "DX"):
            assert ds.BodyPartExamined == "CHEST" and ds.ViewPosition in ("PA", "LL", "LATERAL")
        elif ds.Modality == "MR":
            assert ds.BodyPartExamined in ("HEAD", "BRAIN")
        elif ds.Modality == "US":
            assert any(w in ds.StudyDescription for w in ("BREAST", "LIVER", "THYROID"))
    assert any(ds.ViewPosition in ("LL", "LATERAL") for ds in dicoms.values() if ds.Modality in ("CR", "DX"))
    ct_series = [s for s in by_series.values() if s[0].Modality == "CT"]
    assert ct_series and sum(s[0].BodyPartExamined == "HEAD" for s in ct_series) == HEAD_CT_PATIENTS
    for series in ct_series:
        assert len(series) >= 5
        z = sorted(float(ds.ImagePositionPatient[2]) for ds in series)
        steps = {round(b - a, 4) for a, b in zip(z, z[1:], strict=False)}
        assert steps == {float(series[0].SliceThickness)}
        assert len({tuple(map(float, ds.PixelSpacing)) for ds in series}) == 1
        assert len({tuple(map(float, ds.ImagePositionPatient[:2])) for ds in series}) == 1
        assert len({ds.BodyPartExamined for ds in series}) == 1 and series[0].BodyPartExamined in ("CHEST", "HEAD")


def test_head_volumes_with_a_face_and_their_answer_key(corpus, dicoms, phi_rows):
    """Two head MR and one head CT series made from the demo head (issue 33), each a volume the build must deface
    (>= 10 slices, >= 60 mm in every axis), with its face / brain / brow labels in file order on the series grid."""
    import gzip
    import io

    import numpy as np

    from etl.deid.deface import head_decision
    from etl.demo.heads import BRAIN, BROW, FACE

    out, summary = corpus
    key = [json.loads(x) for x in (out / "answer_key" / "heads.jsonl").read_text().splitlines()]
    assert sorted(h["modality"] for h in key) == ["CT"] * HEAD_CT_PATIENTS + ["MR"] * HEAD_MR_PATIENTS
    assert summary["head_series"] == len(key)
    for h in key:
        series = [dicoms[f] for f in h["files"]]
        labels = np.load(io.BytesIO(gzip.decompress((out / h["labels"]).read_bytes())))
        assert labels.shape == (len(series), series[0].Rows, series[0].Columns) and len(series) >= 10
        assert {ds.SeriesInstanceUID for ds in series} == {h["series_uid"]}
        assert all(head_decision(ds.Modality, ds.BodyPartExamined) == "head" for ds in series)
        iop = np.array(series[0].ImageOrientationPatient, float)
        normal = np.cross(iop[:3], iop[3:])
        along = [float(np.dot(np.array(ds.ImagePositionPatient, float), normal)) for ds in series]
        assert np.allclose(np.diff(along), float(series[0].SliceThickness))  # file order = label order
        extent = [ds.Rows * float(ds.PixelSpacing[0]) for ds in series[:1]] + [along[-1] - along[0]]
        assert min(extent) >= 60 and series[0].Columns * float(series[0].PixelSpacing[1]) >= 60
        counts = {k: int((labels == k).sum()) for k in (FACE, BRAIN, BROW)}
        assert counts[FACE] > 3000 and counts[BRAIN] > 40_000 and counts[BROW] > 300, counts
        arr = np.stack([ds.pixel_array for ds in series]).astype(float)
        assert arr[labels == FACE].mean() > arr[labels == 0].mean()  # the face region holds tissue
        assert all(any(r["file"] == f for r in phi_rows) for f in h["files"])  # and its headers carry PHI


def test_transfer_syntaxes_and_private_block(dicoms):
    syntaxes = [ds.file_meta.TransferSyntaxUID for ds in dicoms.values()]
    assert syntaxes.count(pydicom.uid.ExplicitVRLittleEndian) > len(syntaxes) / 2
    assert len(set(syntaxes)) >= 3
    for ds in dicoms.values():
        assert ds[0x00090010].value == "MEDRECO DEMO"
        assert _text(ds[0x00091002].value[0][0x00091001], ds.SpecificCharacterSet).startswith("CALL ")


def test_pixels_differ_between_studies(intact):
    by_patient = defaultdict(dict)
    for ds in intact.values():
        if ds.Modality in ("CR", "DX") and ds.ViewPosition == "PA":
            by_patient[ds.PatientID][ds.StudyInstanceUID] = ds.pixel_array
    pairs = [list(v.values()) for v in by_patient.values() if len(v) >= 2]
    assert pairs
    for arrays in pairs:
        a, b = arrays[0], arrays[1]
        assert a.shape != b.shape or (a != b).any()


# -------------------------------------------------------------------------------------------- reports


def test_reports_parse_with_section_headers(reports, kept):
    from etl.demo.reports_local import load_local_phrases

    books = {"en": load_phrases(), **{k: v for k, v in load_local_phrases().items() if k != "unsupported"}}
    for r in reports:
        assert set(r) - {"_institution"} == REPORT_KEYS
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", r["report_datetime"])
        assert r["accession_number"] or r["study_instance_uid"]
    for r in kept:
        book = books[r["language"]]
        for kind in ("findings", "impression"):
            assert any(re.search(rf"(^|\n){re.escape(h)}", r["text"]) for h in book["sections"][kind]), kind
        heads = [h for hs in book["sections"].values() for h in hs if h in r["text"]]
        assert len(heads) >= 4
    ids = [r["report_id"] for r in reports]
    assert len(ids) == len(set(ids))


def test_report_links_orphans_and_missing_reports(dicoms, kept, truth):
    reports = kept
    acc = {ds.AccessionNumber: ds.StudyInstanceUID for ds in dicoms.values()}
    uids = set(acc.values())
    orphans = [r for r in reports if r["accession_number"] not in acc and r["study_instance_uid"] not in uids]
    assert len(orphans) >= 2
    both = [r for r in reports if r["accession_number"] in acc and r["study_instance_uid"] in uids]
    only_acc = [r for r in reports if r["accession_number"] in acc and r["study_instance_uid"] is None]
    only_uid = [r for r in reports if r["accession_number"] is None and r["study_instance_uid"] in uids]
    assert len(both) + len(only_acc) + len(only_uid) + len(orphans) == len(reports)
    assert only_acc and only_uid and len(both) > len(reports) / 2
    for r in both + only_acc:
        assert truth[r["report_id"]]["study_instance_uid"] == acc[r["accession_number"]]
    for r in only_uid + orphans:
        assert truth[r["report_id"]]["study_instance_uid"] == r["study_instance_uid"]
    reported = {truth[r["report_id"]]["study_instance_uid"] for r in reports}
    assert uids - reported  # studies without a report


def test_report_phi_is_listed_and_present(reports, phi_rows):
    values = defaultdict(list)
    for r in reports:
        values[f"sources/{r['_institution']}/reports/reports.jsonl"] += [v for k, v in r.items() if k != "_institution"]
    joined = {f: "\n".join(v for v in vs if v) for f, vs in values.items()}
    rows = [r for r in phi_rows if r["location"] == "report"]
    assert {r["phi_type"] for r in rows} >= {"name", "id", "date", "phone", "uid", "datetime"}
    for r in rows:
        assert r["value"] in joined[r["file"]], r
    fields = {
        (f"sources/{r['_institution']}/reports/reports.jsonl", v)
        for r in reports
        for v in (r["patient_id"], r["accession_number"], r["study_instance_uid"], r["report_datetime"])
        if v
    }
    assert fields <= {(r["file"], r["value"]) for r in rows}
    texts = {f: "\n".join(r["text"] for r in reports if f.split("/")[1] == r["_institution"]) for f in joined}
    # varied date formats: numeric, month name, ISO
    dates = [r["value"] for r in rows if r["phi_type"] == "date"]
    assert any(re.fullmatch(r"\d{2}/\d{2}/\d{4}", d) for d in dates)
    assert any(re.fullmatch(r"\d{4}-\d{2}-\d{2}", d) for d in dates)
    assert any(re.search(r"[A-Z][a-z]+", d) for d in dates)
    assert any(re.search(r"Dr\. \w", t) for t in texts.values())


def test_outside_reports_without_a_language_pack_are_withheld_and_the_others_route_to_their_pack(
    reports, kept, withheld, phi_rows
):
    """Three outside reports (Italian, Dutch, Chinese) filed under reported studies of three institutions, their
    source record claiming the institution's language: the build's language router withholds each
    (``unsupported_language``); every German and Spanish report routes to its pack, every English one to English."""
    from entity_extraction.languages.route import UnsupportedLanguageError, route_language

    assert sorted(w["language"] for w in withheld.values()) == ["it", "nl", "zh"]
    assert len({w["institution"] for w in withheld.values()}) == 3
    by_id = {r["report_id"]: r for r in reports}
    for rid, w in withheld.items():
        r = by_id[rid]
        assert (w["stage"], w["reason"]) == ("reports", "unsupported_language") and r["_institution"] == w[
            "institution"
        ]
        assert r["language"] == next(i.language for i in DEMO_INSTITUTIONS if i.id == w["institution"])
        with pytest.raises(UnsupportedLanguageError) as e:
            route_language(r["text"], r["language"])
        assert e.value.decision.language == w["language"] or e.value.decision.foreign_script
        listed = {
            x["value"] for x in phi_rows if x["location"] == "report" and x["file"].split("/")[1] == w["institution"]
        }
        assert sum(v in r["text"] for v in listed) >= 4  # its name, birth date, exam date and reader are listed
    for r in kept:
        assert route_language(r["text"], r["language"]).language == r["language"], r["report_id"]


def test_german_and_spanish_reports_state_interval_change_in_their_language(kept, truth):
    """The German and Spanish change templates carry their change words (the ConText triggers of the packs)."""
    words = {
        "de": {
            "new": ("neu",),
            "resolved": ("nicht mehr",),
            "unchanged": ("unverändert",),
            "increased": ("zunehmend", "progredient"),
            "decreased": ("rückläufig", "regredient"),
            "improved": ("gebessert",),
            "worsened": ("progredient",),
        },
        "es": {
            "new": ("nueva aparición", "aparición"),
            "resolved": ("resolución", "ya no"),
            "unchanged": ("sin cambios", "estable"),
            "increased": ("aumento", "progresión"),
            "decreased": ("disminución", "reducción"),
            "improved": ("mejoría",),
            "worsened": ("empeoramiento",),
        },
    }
    checked = 0
    for r in kept:
        if r["language"] == "en":
            continue
        text = r["text"].lower()
        for e in truth[r["report_id"]]["entities"]:
            if e["change"] != "none":
                checked += 1
                assert any(w in text for w in words[r["language"]][e["change"]]), (r["report_id"], e)
    assert checked >= 3


def _longest_match_ids(text: str, family: str, language: str = "en") -> set[str]:
    """Concept ids a greedy longest-match over the family's synonyms in ``language`` finds in ``text``."""
    onto = load_ontology()
    syn: dict[str, set[str]] = defaultdict(set)
    for c in onto.family_concepts(family):
        for s in c.synonyms.get(language, ()):
            syn[s.lower()].add(c.id)
    pattern = re.compile(r"(?<!\w)(" + "|".join(re.escape(s) for s in sorted(syn, key=len, reverse=True)) + r")(?!\w)")
    found: set[str] = set()
    for m in pattern.finditer(text.lower()):
        ids = syn[m.group(1)]
        assert len(ids) == 1, f"ambiguous synonym {m.group(1)!r} -> {sorted(ids)}"
        found |= ids
    return found


def test_truth_entities_exist_and_match_the_text(kept, truth):
    onto = load_ontology()
    assertions = {"present", "absent", "uncertain"}
    assert len(kept) >= 10  # the loop below cannot pass on an empty corpus
    checked = defaultdict(int)
    for r in kept:
        checked[r["language"]] += 1
        t = truth[r["report_id"]]
        assert t["patient_id"] == r["patient_id"]
        fam_ids = {i for ids in onto.families[t["family"]].values() for i in ids}
        ents = t["entities"]
        assert len({e["entity_id"] for e in ents}) == len(ents)
        for e in ents:
            assert e["entity_id"] in onto.concepts and e["entity_id"] in fam_ids
            assert e["assertion"] in assertions and e["change"] in CHANGES
            if e["change"] == "resolved":
                assert e["assertion"] == "absent"
            elif e["change"] != "none":
                assert e["assertion"] == "present"
        assert _longest_match_ids(r["text"], t["family"], r["language"]) == {e["entity_id"] for e in ents}, r[
            "report_id"
        ]
    assert set(checked) == {"en", "de", "es"}
    all_ents = [e for t in truth.values() for e in t["entities"]]
    assert {e["assertion"] for e in all_ents} == assertions
    assert {"new", "resolved", "unchanged"} <= {e["change"] for e in all_ents}


def test_interval_change_wording_matches_truth(kept, truth):
    reports = [r for r in kept if r["language"] == "en"]  # the English wording (German/Spanish: the next test)
    onto = load_ontology()
    words = {
        "resolved": ("resolv", "resolution"),
        "new": ("new", "development"),
        "unchanged": ("unchanged", "stable"),
        "increased": ("increase", "enlarging"),
        "decreased": ("decrease", "smaller"),
        "improved": ("improv",),
        "worsened": ("worsen",),
    }
    checked = 0
    for r in reports:
        text = r["text"].lower()
        for e in truth[r["report_id"]]["entities"]:
            if e["change"] == "none":
                continue
            checked += 1
            phrases = family_phrases(truth[r["report_id"]]["family"])[e["entity_id"]]
            sentences = [s for s in re.split(r"(?<=\.)\s+|\n", text) if any(p in s for p in phrases)]
            assert any(any(w in s for w in words[e["change"]]) for s in sentences), (
                r["report_id"],
                e,
                onto.concepts[e["entity_id"]],
            )
    assert checked >= 5  # interval changes were checked, not skipped


# ------------------------------------------------------------------------------------- entity planning


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_entities_state_evolves_consistently(family):
    for seed in range(20):
        rng = random.Random(seed)
        kw = {"us_subtype": ["breast", "liver", "thyroid"][seed % 3]} if family == "2D-Ultrasound" else {}
        mentions, state = plan_entities(rng, family, None, **kw)
        assert all(m.change == "none" for m in mentions)
        for _ in range(4):
            prior = state
            mentions, state = plan_entities(rng, family, prior, **kw)
            for m in mentions:
                if m.change in ("unchanged", "increased", "decreased", "improved", "worsened", "resolved"):
                    assert m.entity_id in prior
                if m.change == "new":
                    assert m.entity_id not in prior
                before = prior[m.entity_id].severity if m.entity_id in prior else None
                if before is not None and m.assertion == "present":
                    step = {"increased": 1, "worsened": 1, "decreased": -1, "improved": -1, "unchanged": 0}
                    assert state[m.entity_id].severity == before + step[m.change]
            assert set(prior) == {m.entity_id for m in mentions if m.entity_id in prior}
            assert set(state) == {m.entity_id for m in mentions if m.assertion == "present"}


def test_plan_entities_rejects_unknown_family_and_subtype():
    with pytest.raises(DemoReportError) as e:
        plan_entities(random.Random(0), "XR-FOOT", None)
    assert e.value.reason == "unknown_family"
    with pytest.raises(DemoReportError) as e:
        plan_entities(random.Random(0), "2D-Ultrasound", None, us_subtype="kidney")
    assert e.value.reason == "unknown_us_subtype"


def test_archive_pixel_profile_has_real_sizes_and_an_unknown_profile_is_refused(tmp_path):
    """``pixels="archive"`` (the build benchmark's corpora): 512 x 512 CT slices of the real 693 slice, 1.25 mm
    apart, 100-300 per series; a profile outside PIXEL_PROFILES raises before anything is written."""
    import numpy as np

    from etl.demo.corpus import ARCHIVE_CT_SLICES, PIXEL_PROFILES, _archive_sources, _ct_archive_slices

    with pytest.raises(DemoCorpusError) as e:
        generate_corpus(tmp_path / "x", n_patients=8, pixels="tiny")
    assert e.value.reason == "unknown_pixel_profile" and not (tmp_path / "x").exists()
    assert PIXEL_PROFILES == ("demo", "archive") and min(ARCHIVE_CT_SLICES) >= 100 and max(ARCHIVE_CT_SLICES) <= 300
    src = _archive_sources()
    assert src.ct.shape == (512, 512) and src.mr.shape == (256, 256) and int(src.mr.max()) <= 4095
    slices, thickness = _ct_archive_slices(random.Random(0), 3, 0)
    assert thickness == 1.25 and [s.pixels.shape for s in slices] == [(512, 512)] * 3
    assert all(s.pixels.dtype == np.dtype("<i2") for s in slices)
    assert [s.attrs["ImagePositionPatient"][2] for s in slices] == [0.0, -1.25, -2.5]
    assert not np.array_equal(slices[0].pixels, slices[1].pixels)  # neighbouring slices differ


def test_chest_mix_holds_radiographs_and_chest_ct_only_and_an_unknown_mix_is_refused(tmp_path):
    """``mix="chest"`` (the build benchmark's realistic archive): chest radiographs and chest CT series only, about a
    fifth of the images rows CT series (the archive profile's series are 120 slices); the default mix is the
    demo's four families; a mix outside ARCHIVE_MIXES raises before anything is written."""
    from etl.demo.corpus import ARCHIVE_CT_SLICES, ARCHIVE_MIXES

    with pytest.raises(DemoCorpusError) as e:
        generate_corpus(tmp_path / "x", n_patients=8, mix="mostly-mr")
    assert e.value.reason == "unknown_mix" and not (tmp_path / "x").exists()
    assert ARCHIVE_MIXES["ct-heavy"] == (FAMILIES, ARCHIVE_CT_SLICES) and ARCHIVE_MIXES["chest"][1] == (120,)
    out = tmp_path / "chest"
    summary = generate_corpus(out, seed=11, n_patients=16, mix="chest")
    series: dict[str, set[str]] = defaultdict(set)
    for p in out.glob("sources/*/dicom/**/*.dcm"):
        ds = pydicom.dcmread(p, stop_before_pixels=True, force=True)
        series[ds.Modality].add(ds.SeriesInstanceUID)
    assert set(series) <= {"CR", "DX", "CT"} and series["CT"]
    ct_rows, radiograph_rows = len(series["CT"]), len(series["CR"]) + len(series["DX"])  # one view per series
    assert 0.15 <= ct_rows / (ct_rows + radiograph_rows) <= 0.3, (ct_rows, radiograph_rows)
    assert summary["patients"] == 16
