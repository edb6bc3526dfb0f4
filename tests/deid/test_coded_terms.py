"""Clinical words after the modality code "MR" in DICOM header text survive the free-text cleaning (the shared
file's "MR Lever", Dutch for liver, came out "MR [NAME]"), while names and phone numbers in the same values go."""

from __future__ import annotations

import hostile_dicom as h
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from etl.deid.coded_terms import kept_spans
from etl.deid.dicom import deidentify_dataset
from etl.deid.policy import build_policy
from etl.keys import PseudonymKey

LIVER_MR = h.DICOM / "mr" / "orthanc_siemens_mr_liver_vibe.dcm"
assert LIVER_MR.is_file(), "needs ../shared/data/dicom beside the project (CI copies it there)"
KEY = PseudonymKey(b"coded-terms-test-key-0123456789abcdef")


@pytest.fixture(scope="module")
def policy():
    return build_policy()


def with_procedure(meaning: str, patient: str = "Quillfeather^Rosalind"):
    """The shared native CT with a Procedure Code Sequence item whose CodeMeaning is ``meaning``."""
    ds = h.with_ids(h.read(h.NATIVE_CT))
    ds.PatientName = patient
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = "M28", "DSS_MESA", meaning
    ds.ProcedureCodeSequence = Sequence([item])
    return ds


def test_the_shared_liver_mr_keeps_its_procedure(policy):
    ds = h.read(LIVER_MR)
    assert ds.ProcedureCodeSequence[0].CodeMeaning == "MR Lever" == ds.StudyDescription
    out = deidentify_dataset(ds, KEY, "coded", policy).dataset
    assert out.ProcedureCodeSequence[0].CodeMeaning == "MR Lever"
    assert out.RequestedProcedureCodeSequence[0].CodeMeaning == "MR Lever"
    assert out.StudyDescription == "MR Lever"  # a descriptor goes through the same cleaning


@pytest.mark.parametrize("meaning", ["MR Knie", "MR Leber", "MR Hombro", "MR Schouder links", "MR LEVER", "MR Foie"])
def test_clinical_terms_in_code_meaning_survive(policy, meaning):
    out = deidentify_dataset(with_procedure(meaning), KEY, "coded", policy).dataset
    assert out.ProcedureCodeSequence[0].CodeMeaning == meaning


@pytest.mark.parametrize(
    ("meaning", "kept", "gone"),
    [
        ("MR Vintersby", "MR", ["Vintersby"]),  # not a clinical word: the title rule still applies
        ("MR Harold Vintersby", "MR", ["Harold", "Vintersby"]),
        ("Mr Lever", "Mr", ["Lever"]),  # the title as a title: not the modality code
        ("MR Lever, call Dr Harold Vintersby on 617-555-0143", "MR Lever, call Dr", ["Harold", "Vintersby", "0143"]),
    ],
)
def test_names_and_phones_in_code_meaning_still_go(policy, meaning, kept, gone):
    value = deidentify_dataset(with_procedure(meaning), KEY, "coded", policy).dataset.ProcedureCodeSequence[0]
    assert value.CodeMeaning.startswith(kept)
    assert not any(g in value.CodeMeaning for g in gone), value.CodeMeaning


def test_a_clinical_word_that_is_the_patients_name_goes(policy):
    out = deidentify_dataset(with_procedure("MR Lever", patient="Lever^Jan"), KEY, "coded", policy).dataset
    assert "Lever" not in out.ProcedureCodeSequence[0].CodeMeaning


def test_kept_spans():
    assert kept_spans("MR Lever en galwegen") == [(0, 8)] and kept_spans("MR Lever, galwegen") == [(0, 18)]
    assert kept_spans("MR Lever2 x") == [(0, 8)]
    assert kept_spans("MR Leverkusen") == [] and kept_spans("Mr Lever") == [] and kept_spans("MR. Lever") == []
    assert kept_spans("MR Lever", {"lever"}) == []
