"""Tests for etl.assemble.pairs.build_pairs: pairing rule, views, change labels, conflicts, determinism."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from helpers import LABEL_SCHEMA, STUDY_SCHEMA, T0  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.assemble.pairs import PairingInputError, build_pairs, pair_id
from schemas.config import PROJECT_ROOT, PairingConfig
from schemas.pairs import SCHEMA

IMAGE_SCHEMA = {"study_key": pl.Utf8, "view": pl.Utf8, "kind": pl.Utf8}


def studies(*rows: tuple) -> pl.DataFrame:
    """rows: (study_key, patient_key, family, modality, days_after_T0 or datetime)."""
    out = []
    for key, patient, family, modality, when in rows:
        dt = when if isinstance(when, datetime) else T0 + timedelta(days=when)
        out.append((key, patient, family, modality, dt, 2))
    return pl.DataFrame(out, schema=STUDY_SCHEMA, orient="row")


def labels(*rows: tuple) -> pl.DataFrame:
    """rows: (study_key, entity_id, state, change)."""
    return pl.DataFrame([(*r, 2) for r in rows], schema=LABEL_SCHEMA, orient="row")


def images(*rows: tuple) -> pl.DataFrame:
    """rows: (study_key, view)."""
    return pl.DataFrame([(*r, "2d") for r in rows], schema=IMAGE_SCHEMA, orient="row")


NO_LABELS = pl.DataFrame(schema=LABEL_SCHEMA)
CFG = PairingConfig()


def frontal(*keys: str) -> pl.DataFrame:
    return images(*[(k, "PA") for k in keys])


def keys(table) -> list[tuple[str, str]]:
    return sorted(zip(table["prior_study_key"].to_pylist(), table["current_study_key"].to_pylist(), strict=True))


def test_single_study_gives_no_pair():
    t = build_pairs(studies(("s1", "p1", "2D-CXR", "DX", 0)), NO_LABELS, frontal("s1"), CFG)
    assert t.num_rows == 0
    assert t.schema.equals(SCHEMA, check_metadata=True)


def test_empty_frames_give_empty_table_of_schema():
    t = build_pairs(pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), CFG)
    assert t.num_rows == 0 and t.schema.equals(SCHEMA, check_metadata=True)
    t2 = build_pairs(pl.DataFrame(schema=STUDY_SCHEMA), NO_LABELS, pl.DataFrame(schema=IMAGE_SCHEMA), CFG)
    assert t2.num_rows == 0 and t2.schema.equals(SCHEMA)


def test_three_studies_give_two_consecutive_pairs():
    s = studies(("s1", "p1", "2D-CXR", "CR", 0), ("s2", "p1", "2D-CXR", "DX", 10), ("s3", "p1", "2D-CXR", "DX", 30))
    t = build_pairs(s, NO_LABELS, frontal("s1", "s2", "s3"), CFG)
    assert keys(t) == [("s1", "s2"), ("s2", "s3")]
    rows = {r["current_study_key"]: r for r in t.to_pylist()}
    assert rows["s2"]["gap_days"] == 10 and rows["s3"]["gap_days"] == 20
    assert rows["s2"]["pair_id"] == hashlib.sha256(b"s1|s2").hexdigest()[:16]
    assert rows["s2"]["modality"] == "DX" and rows["s2"]["family"] == "2D-CXR"
    assert rows["s2"]["view"] == "PA" and rows["s2"]["shard"] == 2
    assert rows["s2"]["change_labels"] == [] and rows["s2"]["n_conflicts"] == 0
    assert t["pair_id"].to_pylist() == sorted(t["pair_id"].to_pylist())


def test_gap_window_and_floor():
    s = studies(
        ("s1", "p1", "2D-CXR", "DX", 0),
        ("s2", "p1", "2D-CXR", "DX", T0 + timedelta(days=10, hours=23)),  # floor -> 10 days
        ("s3", "p1", "2D-CXR", "DX", T0 + timedelta(days=11, hours=1)),  # 2 h after s2: gap 0 < min 1
        ("s4", "p1", "2D-CXR", "DX", 60),
    )
    cfg = PairingConfig(min_gap_days=1, max_gap_days=15)
    t = build_pairs(s, NO_LABELS, frontal("s1", "s2", "s3", "s4"), cfg)
    # s3's nearest prior (s2) is too close, so it pairs with its nearest *eligible* prior s1;
    # s4 is 49 days after s3: outside the window, no pair.
    assert keys(t) == [("s1", "s2"), ("s1", "s3")]
    gaps = dict(zip(t["current_study_key"].to_pylist(), t["gap_days"].to_pylist(), strict=True))
    assert gaps == {"s2": 10, "s3": 11}


def test_same_time_studies_do_not_pair_with_min_gap_zero():
    s = studies(("a", "p1", "2D-CXR", "DX", 0), ("b", "p1", "2D-CXR", "DX", 0))
    t = build_pairs(s, NO_LABELS, frontal("a", "b"), PairingConfig(min_gap_days=0))
    assert t.num_rows == 0


def test_lateral_only_cxr_excluded_and_view_choice():
    s = studies(("s1", "p1", "2D-CXR", "DX", 0), ("s2", "p1", "2D-CXR", "DX", 5), ("s3", "p1", "2D-CXR", "DX", 9))
    img = images(("s1", "PA"), ("s1", "LATERAL"), ("s2", "LATERAL"), ("s3", "LATERAL"), ("s3", "AP"))
    t = build_pairs(s, NO_LABELS, img, CFG)
    assert keys(t) == [("s1", "s3")]
    assert t["view"].to_pylist() == ["AP"]
    loose = build_pairs(s, NO_LABELS, img, PairingConfig(frontal_only_cxr=False))
    assert keys(loose) == [("s1", "s2"), ("s2", "s3")]
    views = dict(zip(loose["current_study_key"].to_pylist(), loose["view"].to_pylist(), strict=True))
    assert views == {"s2": "LATERAL", "s3": "AP"}


def test_frontal_rule_applies_only_to_cxr():
    s = studies(("c1", "p1", "3D-CT", "CT", 0), ("c2", "p1", "3D-CT", "CT", 40))
    t = build_pairs(s, NO_LABELS, images(("c1", None), ("c2", None)), CFG)
    assert keys(t) == [("c1", "c2")] and t["view"].to_pylist() == [None]


def test_all_priors_cap_nearest_first():
    s = studies(*[(f"s{i}", "p1", "2D-CXR", "DX", 10 * i) for i in range(1, 5)])
    img = frontal("s1", "s2", "s3", "s4")
    assert build_pairs(s, NO_LABELS, img, PairingConfig(all_priors=False, max_priors=3)).num_rows == 3
    t = build_pairs(s, NO_LABELS, img, PairingConfig(all_priors=True, max_priors=2))
    assert keys(t) == [("s1", "s2"), ("s1", "s3"), ("s2", "s3"), ("s2", "s4"), ("s3", "s4")]


def test_family_null_and_different_families_never_pair():
    s = studies(
        ("n1", "p1", None, "MG", 0),
        ("n2", "p1", None, "MG", 30),
        ("x1", "p1", "2D-CXR", "DX", 1),
        ("c1", "p1", "3D-CT", "CT", 20),
    )
    assert build_pairs(s, NO_LABELS, frontal("x1"), CFG).num_rows == 0


def test_patients_are_never_mixed():
    s = studies(("a1", "pa", "2D-CXR", "DX", 0), ("b1", "pb", "2D-CXR", "DX", 10))
    assert build_pairs(s, NO_LABELS, frontal("a1", "b1"), CFG).num_rows == 0


def test_stated_and_derived_changes_and_conflicts():
    s = studies(("pr", "p1", "2D-CXR", "DX", 0), ("cu", "p1", "2D-CXR", "DX", 20))
    lab = labels(
        ("pr", "F029", "present", "none"),
        ("cu", "F029", "present", "increased"),  # stated, agrees
        ("pr", "F007", "absent", "none"),
        ("cu", "F007", "present", "none"),  # derived new
        ("pr", "C006", "present", "none"),
        ("cu", "C006", "absent", "none"),  # derived resolved
        ("pr", "F019", "uncertain", "none"),
        ("cu", "F019", "present", "none"),  # uncertain: no label
        ("pr", "F005", "present", "none"),
        ("cu", "F005", "present", "new"),  # stated new but prior present: conflict
        ("pr", "F028", "absent", "none"),
        ("cu", "F028", "absent", "resolved"),  # stated resolved but prior absent: conflict
        ("cu", "F016", "present", "none"),  # not in prior (not_mentioned) -> new
        ("pr", "F024", "present", "none"),
        ("cu", "F024", "present", "none"),  # derived unchanged
        ("pr", "F022", "absent", "none"),
        ("cu", "F022", "absent", "none"),  # absent -> absent: no label
    )
    t = build_pairs(s, lab, frontal("pr", "cu"), CFG)
    (row,) = t.to_pylist()
    got = {(c["entity_id"], c["change"], c["source"]) for c in row["change_labels"]}
    assert got == {
        ("F029", "increased", "stated"),
        ("F007", "new", "state_difference"),
        ("C006", "resolved", "state_difference"),
        ("F005", "new", "stated"),
        ("F028", "resolved", "stated"),
        ("F016", "new", "state_difference"),
        ("F024", "unchanged", "state_difference"),
    }
    assert [c["entity_id"] for c in row["change_labels"]] == sorted(c["entity_id"] for c in row["change_labels"])
    assert row["n_conflicts"] == 2


def test_prior_without_labels_gives_only_stated_changes():
    s = studies(("pr", "p1", "2D-CXR", "DX", 0), ("cu", "p1", "2D-CXR", "DX", 20))
    lab = labels(("cu", "F029", "present", "none"), ("cu", "F007", "present", "worsened"))
    (row,) = build_pairs(s, lab, frontal("pr", "cu"), CFG).to_pylist()
    assert row["change_labels"] == [{"entity_id": "F007", "change": "worsened", "source": "stated"}]
    assert row["n_conflicts"] == 0


def test_current_stated_new_but_absent_is_conflict():
    s = studies(("pr", "p1", "2D-CXR", "DX", 0), ("cu", "p1", "2D-CXR", "DX", 20))
    lab = labels(("pr", "F029", "absent", "none"), ("cu", "F029", "absent", "new"))
    (row,) = build_pairs(s, lab, frontal("pr", "cu"), CFG).to_pylist()
    assert row["n_conflicts"] == 1


def _corpus():
    rows, img, lab = [], [], []
    for p in range(6):
        for i in range(4):
            key = f"p{p}s{i}"
            rows.append((key, f"p{p}", "2D-CXR" if p % 3 else "3D-CT", "DX" if p % 3 else "CT", 7 * i + p))
            img.append((key, "PA" if (i + p) % 4 else "LATERAL"))
            lab.append((key, "F029", ["present", "absent"][(i + p) % 2], "none"))
            lab.append((key, "F007", "present", "none" if i % 2 else "unchanged"))
    return studies(*rows), labels(*lab), images(*img)


def test_deterministic_same_input_twice():
    s, lab, img = _corpus()
    cfg = PairingConfig(all_priors=True, max_priors=2)
    a = build_pairs(s, lab, img, cfg)
    b = build_pairs(s, lab, img, cfg)
    assert a.num_rows > 5 and a.equals(b)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(min_value=0, max_value=10_000))
def test_row_order_does_not_matter(seed):
    s, lab, img = _corpus()
    cfg = PairingConfig(all_priors=True, max_priors=2)
    expected = build_pairs(s, lab, img, cfg)
    got = build_pairs(
        s.sample(fraction=1.0, shuffle=True, seed=seed),
        lab.sample(fraction=1.0, shuffle=True, seed=seed + 1),
        img.sample(fraction=1.0, shuffle=True, seed=seed + 2),
        cfg,
    )
    assert got.equals(expected)


def test_pair_id_helper():
    assert pair_id("a", "b") == hashlib.sha256(b"a|b").hexdigest()[:16]
    assert pair_id("a", "b") != pair_id("b", "a")


@pytest.mark.parametrize(
    ("frame", "lab", "reason"),
    [
        (studies(("s1", "p1", "2D-CXR", "DX", 0)).drop("modality"), NO_LABELS, "missing_column"),
        (pl.concat([studies(("s1", "p1", "2D-CXR", "DX", 0))] * 2), NO_LABELS, "duplicate_study_key"),
        (studies(("s1", "p1", "2D-CXR", "DX", 0)), labels(("s1", "F029", "maybe", "none")), "unknown_state"),
        (
            studies(("s1", "p1", "2D-CXR", "DX", 0)),
            labels(("s1", "F029", "present", "bigger")),
            "unknown_change",
        ),
        (
            studies(("s1", "p1", "2D-CXR", "DX", 0)),
            labels(("s1", "F029", "present", "none"), ("s1", "F029", "absent", "none")),
            "duplicate_label",
        ),
        (
            studies(("s1", "p1", "2D-CXR", "DX", 0)).with_columns(study_datetime=pl.lit("2031")),
            NO_LABELS,
            "bad_datetime_type",
        ),
    ],
)
def test_bad_input_raises_with_reason(frame, lab, reason):
    with pytest.raises(PairingInputError) as err:
        build_pairs(frame, lab, frontal("s1"), CFG)
    assert err.value.reason == reason


def test_patient_in_two_shards_raises():
    s = studies(("s1", "p1", "2D-CXR", "DX", 0), ("s2", "p1", "2D-CXR", "DX", 9))
    s = s.with_columns(shard=pl.Series([2, 3], dtype=pl.Int32))
    with pytest.raises(PairingInputError) as err:
        build_pairs(s, NO_LABELS, frontal("s1", "s2"), CFG)
    assert err.value.reason == "patient_in_several_shards"


def test_null_datetime_falls_back_to_shifted_date():
    s = studies(("s1", "p1", "2D-CXR", "DX", 0), ("s2", "p1", "2D-CXR", "DX", 12), ("s3", "p1", "2D-CXR", "DX", 30))
    s = s.with_columns(
        study_datetime=pl.when(pl.col("study_key") == "s2").then(None).otherwise(pl.col("study_datetime")),
        study_date_shifted=pl.Series([None, (T0 + timedelta(days=12)).date(), None], dtype=pl.Date),
    )
    t = build_pairs(s, NO_LABELS, frontal("s1", "s2", "s3"), CFG)
    gaps = dict(zip(t["current_study_key"].to_pylist(), t["gap_days"].to_pylist(), strict=True))
    # s2 at midnight of day 12 is 11 days 14.5 h after s1 (09:30) and 18 days 9.5 h before s3
    assert keys(t) == [("s1", "s2"), ("s2", "s3")] and gaps == {"s2": 11, "s3": 18}
    undated = build_pairs(s.drop("study_date_shifted"), NO_LABELS, frontal("s1", "s2", "s3"), CFG)
    assert keys(undated) == [("s1", "s3")]


SHARED = PROJECT_ROOT.parent / "shared" / "data" / "dicom"


def _real_studies(folders: list[Path]) -> pl.DataFrame:
    """One row per real study, built from the headers the way the build does (etl.pipeline.stages)."""
    import pydicom

    from etl.deid.instance import study_datetime as _study_datetime
    from schemas.ontology import infer_body_part, modality_family

    rows = {}
    for f in sorted(p for d in folders for p in d.rglob("*.dcm")):
        ds = pydicom.dcmread(f, stop_before_pixels=True)
        bp = infer_body_part(
            str(ds.get("BodyPartExamined", "") or ""),
            [str(ds.get(k, "") or "") for k in ("StudyDescription", "SeriesDescription", "ProtocolName")],
        )
        rows.setdefault(
            ds.StudyInstanceUID,
            (ds.StudyInstanceUID, ds.PatientID, modality_family(ds.Modality, bp), ds.Modality, _study_datetime(ds), 0),
        )
    return pl.DataFrame(list(rows.values()), schema=STUDY_SCHEMA, orient="row")


def test_real_longitudinal_chest_ct_pairs_and_intervals():
    """COVID-19-NY-SBU (6 patients x 2 chest CT dates) and the Orthanc patient with 2 studies 4.5 years apart."""
    st = _real_studies(
        [SHARED / "longitudinal-chest-ct-covid19-ny-sbu", SHARED / "chest-ct" / "patient_with_2_studies"]
    )
    assert st.height == 14 and set(st["family"].to_list()) == {"3D-CT"}
    t = build_pairs(st, NO_LABELS, images(), CFG)
    gaps = dict(zip(t["patient_key"].to_pylist(), t["gap_days"].to_pylist(), strict=True))
    # floor of (current - prior) in days, StudyDate + StudyTime of the headers (e.g. A048383: 1900-12-31 13:47:09
    # -> 1901-04-10 09:21:57 is 99 days 19.6 h)
    assert gaps == {"A002304": 12, "A027284": 97, "A046441": 51, "A048383": 99, "A056642": 9, "A072894": 30}
    assert set(t["view"].to_pylist()) == {None} and t["change_labels"].to_pylist() == [[]] * 6
    # TEST_1: 2010-06-30 12:00 -> 2015-01-01 12:00 = 1646 days, outside the default 3-year window
    wide = build_pairs(st, NO_LABELS, images(), PairingConfig(max_gap_days=2000))
    gaps = dict(zip(wide["patient_key"].to_pylist(), wide["gap_days"].to_pylist(), strict=True))
    assert gaps["TEST_1"] == 1646 and wide.num_rows == 7


def test_hand_made_archive_with_exact_pairs():
    """One-study patient, same-day studies, prior outside the window, mixed PA/lateral series."""
    s = studies(
        ("solo", "p1", "2D-CXR", "DX", 0),
        ("d1", "p2", "2D-CXR", "DX", T0 + timedelta(hours=1)),
        ("d2", "p2", "2D-CXR", "DX", T0 + timedelta(hours=9)),  # same day as d1: gap 0 < 1 day
        ("d3", "p2", "2D-CXR", "DX", 3),
        ("o1", "p3", "3D-CT", "CT", 0),
        ("o2", "p3", "3D-CT", "CT", 1200),  # 1200 days later: outside 3 x 365
        ("o3", "p3", "3D-CT", "CT", 1290),
        ("m1", "p4", "2D-CXR", "CR", 0),
        ("m2", "p4", "2D-CXR", "CR", 40),  # lateral only: not a frontal study
        ("m3", "p4", "2D-CXR", "CR", 100),
    )
    img = images(
        ("solo", "PA"),
        ("d1", "AP"),
        ("d2", "PA"),
        ("d3", "PA"),
        ("d3", "LATERAL"),
        ("o1", None),
        ("o2", None),
        ("o3", None),
        ("m1", "PA"),
        ("m1", "LATERAL"),
        ("m2", "LATERAL"),
        ("m3", "AP"),
        ("m3", "LATERAL"),
    )
    t = build_pairs(s, NO_LABELS, img, CFG)
    got = sorted(
        zip(
            t["prior_study_key"].to_pylist(),
            t["current_study_key"].to_pylist(),
            t["gap_days"].to_pylist(),
            t["view"].to_pylist(),
            strict=True,
        )
    )
    assert got == [("d2", "d3", 2, "PA"), ("m1", "m3", 100, "AP"), ("o2", "o3", 90, None)]
