"""Hostile and corrupt files planted in real files of the shared data (issue 41): each attack is rebuilt, and the
file is quarantined with its own reason or ships without the identifying value, never a crash."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import hostile_dicom as h
import pydicom
import pytest
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from etl.deid.dicom import DeidentificationError, deidentify_dataset, verify_output
from etl.deid.instance import deidentify_file
from etl.deid.policy import build_policy
from etl.keys import PseudonymKey
from etl.pixels.contained import DecoderWorker
from etl.pixels.decode import NormalisationError
from etl.sources.dicom_bounds import bounded_source
from schemas.config import DeidConfig, Institution

assert h.NATIVE_CT.is_file(), "needs ../shared/data/dicom beside the project (CI copies it there)"
ROOT = Path(__file__).resolve().parents[2]
KEY = PseudonymKey(b"hostile-files-test-key-0123456789abcdef")
INST = Institution(id="hostile", country="US", language="en", timezone="UTC", source_uri="/nowhere")


@pytest.fixture(scope="module")
def policy():
    return build_policy()


def run(data: bytes, policy):
    return deidentify_file(data, KEY, INST, policy, "dicom", 0)


def shipped_forms(payload: bytes) -> bytes:
    """The output's bytes lower-cased with every non-alphanumeric byte removed (IDs in any case or spacing)."""
    return bytes(b for b in payload.lower() if chr(b).isalnum())


def test_deflated_source_ships_inflated_without_the_ids(policy):
    out = run(h.deflated_phi_in_model(), policy)
    if out.ingested:  # the model name is cleaned like a descriptor: the IDs are gone from every decoded byte
        assert h.MRN.lower().encode() not in shipped_forms(out.payload)
        assert h.ACCESSION.lower().encode() not in shipped_forms(out.payload)
        assert str(pydicom.dcmread(io.BytesIO(out.payload)).file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.1"
    else:
        assert out.reason == "verification_failed"


def test_deflated_id_variant_in_a_kept_code_is_found(policy):
    ds = h.with_ids(h.read(h.NATIVE_CT))
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = "mr-7731 2458", "99X", "Chest"
    ds.AnatomicRegionSequence = Sequence([item])
    out = run(h.deflated(ds), policy)
    assert (out.reason, out.payload) == ("verification_failed", None)


@pytest.mark.parametrize("found", ["mr-7731 2458", "Mr77312458", "73124", "id 31245 8"])
def test_verifier_matches_ids_ignoring_case_separators_and_on_digit_parts(found):
    free = b"CHEST\x00" + found.encode()
    hits = verify_output(free, {("value", h.MRN)}, ["iso8859"], b"", free, free)
    assert hits == ["value"]


def test_verifier_does_not_match_other_numbers():
    free = b"CHEST 12840\x00V1.2.3\x00SERIES 7"
    assert verify_output(free, {("value", h.MRN)}, ["iso8859"], b"", free, free) == []


def test_rle_panic_is_a_decode_error_and_the_next_file_goes_on(policy):
    bad = run(h.rle_panic(), policy)
    assert bad.reason == "decode_error" and "PanicException" in bad.detail
    good = run(h.RLE.read_bytes(), policy)
    assert good.reason != "decode_error" and good.reason != "decoder_crashed"


@pytest.mark.parametrize("attack", ["jpeg_size_bomb", "j2k_size_bomb"])
def test_codestream_size_bombs_are_refused_before_decoding(policy, attack):
    start = time.perf_counter()
    out = run(getattr(h, attack)(), policy)
    assert out.reason == "declared_size_mismatch"
    assert time.perf_counter() - start < 5  # refused from the header, nothing decoded


def test_item_bomb_is_refused_with_its_own_reason(policy):
    out = run(h.item_bomb(1_000_000), policy)
    assert out.reason == "too_many_sequence_items"


@pytest.mark.slow
def test_deflate_bomb_is_refused_under_1_gb_rss(tmp_path):
    """The bomb is built in one process and refused in another, so the peak RSS measured is the refusal's alone.

    The peak is the child's VmHWM (per address space, reset at exec); ru_maxrss is not used because Linux carries the
    forking parent's high-water mark into it across vfork+exec, so a large pytest process would fail the test.
    """
    bomb = tmp_path / "bomb.dcm"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    build = (
        "import sys; sys.path.insert(0, 'tests'); import hostile_dicom as h, pathlib;"
        f"pathlib.Path({str(bomb)!r}).write_bytes(h.deflate_bomb(1024 ** 3))"
    )
    subprocess.run([sys.executable, "-c", build], cwd=ROOT, check=True, timeout=300, env=env)
    code = (
        "import pathlib, re;"
        "from etl.sources.dicom_bounds import bounded_source, SourceBoundsError\n"
        f"data = pathlib.Path({str(bomb)!r}).read_bytes()\n"
        "try:\n bounded_source(data); print('accepted')\n"
        "except SourceBoundsError as e:\n print(e.reason)\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', pathlib.Path('/proc/self/status').read_text())\n"
        "print(len(data), int(hwm.group(1)) * 1024)"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    reason, sizes = res.stdout.split("\n")[:2]
    size, rss = map(int, sizes.split())
    assert reason == "inflated_too_large"
    assert size < 2 * 1024**2 and rss < 1024**3  # a ~1 MB file that inflates to 1 GiB: refused under 1 GB


def test_deflated_source_is_relabelled_explicit_little_endian():
    data = bounded_source(h.DEFLATED.read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = pydicom.dcmread(h.DEFLATED), pydicom.dcmread(io.BytesIO(data))
    assert str(b.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.1" and a == b


def test_worker_crash_and_timeout_are_decoder_crashed_and_the_worker_is_replaced():
    class Abort:
        def __reduce__(self):
            return os.abort, ()

    ds = h.read(h.JPEG)
    worker = DecoderWorker()
    try:
        arr, _ = worker.decode(ds, ds.file_meta.TransferSyntaxUID, 0)
        assert arr.shape[:2] == (ds.Rows, ds.Columns)
        bomb = Dataset()
        bomb.add(DataElement(0x00280010, "US", Abort()))  # unpickled in the worker: it aborts
        with pytest.raises(NormalisationError) as err:
            worker.decode(bomb, ds.file_meta.TransferSyntaxUID, 0)
        assert err.value.reason == "decoder_crashed" and "SIGABRT" in str(err.value)
        again, _ = worker.decode(ds, ds.file_meta.TransferSyntaxUID, 0)  # a fresh worker
        assert (again == arr).all()
        worker.seconds = 1e-4
        with pytest.raises(NormalisationError) as err:
            worker.decode(ds, ds.file_meta.TransferSyntaxUID, None)
        assert err.value.reason == "decoder_crashed" and "longer than" in str(err.value)
    finally:
        worker.stop()


def test_name_in_a_kept_binary_value_is_found(policy):
    ds = h.with_ids(h.read(h.NATIVE_CT))
    ds.PatientName = "Quillfeather^Rosalind"
    ds.ICCProfile = b"\x00\x00\x02\x0cdesc\x00\x00" + b"QUILLFEATHER" + b"\x00" * 20
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(ds, KEY, "hostile", policy)
    assert err.value.reason == "verification_failed"


def test_control_bytes_in_a_kept_text_value_are_malformed_structure(policy):
    ds = h.with_ids(h.read(h.NATIVE_CT))
    ds.add(DataElement(0x00181020, "LO", b"V1 \x08\x00\x18\x00UI\x10\x001.2.3.4.5.6.7.8"))  # SoftwareVersions, kept
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(ds, KEY, "hostile", policy)
    assert err.value.reason == "malformed_structure"


def test_code_meaning_ten_levels_deep_is_cleaned(policy):
    ds = h.with_ids(h.read(h.NATIVE_CT))
    inner = Dataset()
    inner.CodeValue, inner.CodingSchemeDesignator = "T-D3000", "SRT"
    inner.CodeMeaning = "Chest, call Dr Harold Vintersby on 617-555-0143"
    for _ in range(10):
        outer = Dataset()
        outer.ConceptNameCodeSequence = Sequence([inner])
        inner = outer
    ds.ContentSequence = inner.ConceptNameCodeSequence
    payload = deidentify_dataset(ds, KEY, "hostile", policy).payload
    assert b"617-555-0143" not in payload and b"5550143" not in shipped_forms(payload)
    assert b"Vintersby" not in payload


def test_safe_private_allow_list_matches_group_and_vr():
    policy = build_policy(DeidConfig(retain_safe_private=True))
    ds = h.with_ids(h.read(h.NATIVE_CT))
    ds.add(DataElement(0x00190010, "LO", "Agfa ADC NX"))
    ds.add(DataElement(0x001910F6, "DS", "1.5"))  # listed: Plate Sensitivity, DS
    ds.add(DataElement(0x001910F7, "UT", "written as UT"))  # listed as DS
    ds.add(DataElement(0x00210010, "LO", "Agfa ADC NX"))
    ds.add(DataElement(0x002110F6, "DS", "2.5"))  # another group
    out = deidentify_dataset(ds, KEY, "hostile", policy).dataset
    assert 0x001910F6 in out and 0x001910F7 not in out and 0x002110F6 not in out


def test_encapsulated_pdf_has_its_own_reason(policy):
    path = h.DICOM / "sr-seg-other" / "orthanc_encapsulated_pdf.dcm"
    ds = h.read(path)
    ds.PatientID = h.MRN
    assert run(h.to_bytes(ds), policy).reason == "encapsulated_document"


def test_deid_folder_gives_every_path_one_row(tmp_path):
    import pyarrow.parquet as pq

    from medreco.cli.deid_folder import deidentify_folder

    src = tmp_path / "src"
    src.mkdir()
    ct = h.with_ids(h.read(h.NATIVE_CT))
    ct.SOPInstanceUID = "2.25.41410000000000000000000000001"  # not that of the deflated copy
    (src / os.fsdecode(b"\xff\xfe.dcm")).write_bytes(h.to_bytes(ct))
    (src / "rle-panic.dcm").write_bytes(h.rle_panic())
    (src / "deflated.dcm").write_bytes(h.deflated_phi_in_model())
    (src / "items.dcm").write_bytes(h.item_bomb(300_000))
    os.mkfifo(src / "pipe.dcm")
    (src / "dangling.dcm").symlink_to(src / "nothing")
    balance = deidentify_folder(src, tmp_path / "out", KEY, "hostile")
    rows = {
        r["source_uri"].rsplit("/", 1)[1]: r for r in pq.read_table(tmp_path / "out" / "ledger.parquet").to_pylist()
    }
    assert balance["balanced"] and balance["files_seen"] == 6 == len(rows)
    assert rows["\\xff\\xfe.dcm"]["status"] == "ingested"
    assert rows["rle-panic.dcm"]["reason"] == "decode_error"
    assert rows["items.dcm"]["reason"] == "too_many_sequence_items"
    assert rows["pipe.dcm"]["reason"] == rows["dangling.dcm"]["reason"] == "unreadable_file"
    files = list((tmp_path / "out" / "files").iterdir())
    assert files and len(files) == sum(r["status"] == "ingested" for r in rows.values())
    for f in files:
        assert h.MRN.lower().encode() not in shipped_forms(f.read_bytes())
    assert not (tmp_path / "out" / ".staging").exists()
    json.dumps(list(rows))  # every recorded name is valid UTF-8


@pytest.mark.parametrize("explicit", [False, True], ids=["implicit", "explicit"])
@pytest.mark.parametrize("segment", [0, 1])
def test_tracking_uid_swallowed_by_the_tracking_id_is_quarantined(policy, explicit, segment):
    """A real Segmentation whose Tracking ID (UT) swallowed the segment's Tracking UID after a length fault."""
    data, uid = h.tracking_uid_swallowed(explicit=explicit, segment=segment)
    swallowed = pydicom.dcmread(io.BytesIO(data)).SegmentSequence[segment]
    assert "TrackingUID" not in swallowed and uid in str(swallowed.TrackingID)  # the attack is what it says
    out = run(data, policy)
    assert (out.ingested, out.reason) == (False, "malformed_structure") and out.payload is None


@pytest.mark.parametrize(
    ("tag", "through", "explicit"),
    [
        (0x00620004, h.TRACKING_UID, True),  # Segment Number (US, VM 1) swallows the segment's elements
        (0x00200011, 0x00200052, False),  # Series Number (IS) swallows the Frame of Reference UID
        (0x00200011, 0x00200052, True),
    ],
    ids=["segment_number_tracking_uid", "series_number_frame_of_reference_implicit", "explicit"],
)
def test_uid_swallowed_by_a_numeric_value_is_quarantined(policy, tag, through, explicit):
    """Found by sweeping every length fault of the shared Segmentation through its next UIDs: a US or IS value that
    swallowed a UID shipped it (only text VRs were checked for swallowed bytes)."""
    ds = h.with_ids(h.read(h.SEG))
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1" if explicit else "1.2.840.10008.1.2"
    uid = str(ds.SegmentSequence[0].TrackingUID if through == h.TRACKING_UID else ds.FrameOfReferenceUID)
    data = h.length_fault(h.to_bytes(ds), tag, through, explicit)
    faulted = pydicom.dcmread(io.BytesIO(data))
    holder = faulted.SegmentSequence[0] if through == h.TRACKING_UID else faulted
    assert through not in holder and uid.encode() in data  # the UID rides inside the faulted value
    out = run(data, policy)
    assert (out.ingested, out.reason) == (False, "malformed_structure"), out.detail


def test_medreco_deid_ships_no_swallowed_tracking_uid(tmp_path):
    """Through the call ``medreco deid`` makes: the faulted Segmentations are quarantined, the clean one ingested,
    and no Tracking UID is in any shipped value (read back decoded, at any depth)."""
    import pyarrow.parquet as pq

    from medreco.cli.deid_folder import deidentify_folder

    src = tmp_path / "src"
    src.mkdir()
    uids = set()
    for explicit in (False, True):
        for segment in (0, 1):
            data, uid = h.tracking_uid_swallowed(explicit=explicit, segment=segment)
            (src / f"seg-{int(explicit)}{segment}.dcm").write_bytes(data)
            uids.add(uid)
    ds = h.with_ids(h.read(h.SEG))
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    (src / "seg-numeric.dcm").write_bytes(h.length_fault(h.to_bytes(ds), 0x00620004, h.TRACKING_UID, True))
    (src / "seg-clean.dcm").write_bytes(h.to_bytes(h.with_ids(h.read(h.SEG))))
    balance = deidentify_folder(src, tmp_path / "out", KEY, "hostile")
    rows = {Path(r["source_uri"]).name: r for r in pq.read_table(tmp_path / "out" / "ledger.parquet").to_pylist()}
    assert balance["balanced"] and len(rows) == 6
    assert {(r["status"], r["reason"]) for n, r in rows.items() if n != "seg-clean.dcm"} == {
        ("quarantined", "malformed_structure")
    }
    assert rows["seg-clean.dcm"]["status"] == "ingested"
    shipped = tmp_path / "out" / rows["seg-clean.dcm"]["output"]
    values = [str(e.value) for e in pydicom.dcmread(shipped).iterall() if e.VR != "SQ"]
    for uid in uids:
        assert uid.encode() not in shipped.read_bytes() and not any(uid in v for v in values)


def test_a_value_pydicom_cannot_convert_is_quarantined_at_discovery(tmp_path):
    """Fuzz campaign seed 60517 mutant 255: an unknown VR on PatientID raised NotImplementedError out of the
    discovery check, which stopped ``medreco deid`` (and would stop a build's discover task)."""
    import pyarrow.parquet as pq

    from etl.sources.discover import classify_dicom
    from medreco.cli.deid_folder import deidentify_folder

    data = h.bad_vr_patient_id()
    assert classify_dicom(data)[1:] == ("unreadable_dicom", "NotImplementedError while reading a header value")
    src = tmp_path / "src"
    src.mkdir()
    (src / "bad-vr.dcm").write_bytes(data)
    (src / "good.dcm").write_bytes(h.to_bytes(h.with_ids(h.read(h.NATIVE_CT))))
    balance = deidentify_folder(src, tmp_path / "out", KEY, "hostile")
    rows = {Path(r["source_uri"]).name: r for r in pq.read_table(tmp_path / "out" / "ledger.parquet").to_pylist()}
    assert balance["balanced"] and rows["bad-vr.dcm"]["reason"] == "unreadable_dicom"
    assert rows["good.dcm"]["status"] == "ingested"


@pytest.mark.parametrize(
    ("tag", "vr", "value"),
    [
        (0x00200011, b"I\x9a", None),  # SeriesNumber as mutant 525 flipped it: shipped with its unreadable VR
        (0x00200011, b"I\x9a", b"Zorblax "),  # the same, holding the patient's name: the verifier never read it
        (0x00280034, b"I\xa4", None),  # PixelAspectRatio (IS), as mutant 569 flipped another element's IS
    ],
    ids=["series_number", "series_number_with_a_name", "pixel_aspect_ratio"],
)
def test_an_element_whose_vr_bytes_name_no_vr_is_malformed(policy, tag, vr, value):
    """Found by the fuzz campaign (seed 60517): a byte flip in an element's VR left a value that was neither cleaned
    nor verified (its VR is none the walk knows) and that no reader could read back."""
    data = h.flipped_vr(tag, vr, value, patient_name="Zorblax^Quentin")
    assert pydicom.dcmread(io.BytesIO(data), force=True).get_item(tag).VR == vr.decode("latin-1")
    out = run(data, policy)
    assert (out.ingested, out.reason) == (False, "malformed_structure"), out.reason
