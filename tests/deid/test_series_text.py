"""Burned-in text per series (etl/deid/series_text.py, etl/deid/text_precheck.py) on series built from real CT
slices of the shared data (etl/demo/real_series.py): the sample (none by default), the header rules, the detector on
every slice, and series with text on some slices only (one slice, the middle slice, a localizer, every slice), each
blanked on every slice that carries it, through de-identification and through `medreco deid`."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pydicom
import pytest
from ocr_required import require_ocr
from pydicom.dataset import Dataset

from etl.deid.burned_in_text import display_frames, header_phi, load_text_policy
from etl.deid.dicom import deidentify_dataset
from etl.deid.policy import build_policy
from etl.deid.series_text import (
    SeriesTextGate,
    load_series_policy,
    row_has_text,
    sample_positions,
    text_likely,
)
from etl.deid.text_precheck import glyph_rows
from etl.demo.real_series import burn_text, ct_series, localizer, real_axial_slices

#: the value burn_text draws in (16-bit signed CT: the brightest stored value); anatomy never holds it
TEXT_VALUE = 32767
N = 12  # slices per test series; no sample with the policy's sample_slices 0 (positions [0, 3, 5, 8, 11] with 5)
SCANNER_TEXT = ["QUENNELL MARGIT", "4829173 09.01.2012"]
#: where a scanner writes it: the lower left corner, outside the field of view of every real slice used
CORNER, CAP = (4, 478), 11


def test_sample_is_first_last_middle_and_evenly_spaced():
    assert sample_positions(120, 5) == [0, 30, 59, 89, 119]
    assert sample_positions(12, 5) == [0, 3, 5, 8, 11]
    assert sample_positions(7, 3) == [0, 3, 6]
    assert sample_positions(4, 5) == [0, 1, 2, 3]  # a short series is read whole
    assert sample_positions(120, 0) == []
    sp = load_series_policy()
    assert (sp.sample_slices, sp.read_whole_up_to) == (0, 2)


def test_gate_reads_single_images_whole_and_no_slice_of_a_longer_series_by_default():
    members = [(f"a{i}", "A") for i in range(N)] + [("x", None)] + [("c0", "C"), ("c1", "C")]
    members += [(f"b{i}", "B") for i in range(3)]
    gate = SeriesTextGate(members)
    assert gate.order() == [m for m, _ in members]  # no sample: source order
    assert gate.slot("x").sampled and gate.slot("c0").sampled and gate.slot("c1").sampled  # 2 files or fewer
    assert not any(gate.slot(f"a{i}").sampled for i in range(N)) and not gate.slot("b2").sampled


def test_gate_orders_each_series_sample_first_and_keeps_files_of_unknown_series_alone():
    members = [(f"a{i}", "A") for i in range(N)] + [("x", None), ("y", None)] + [(f"b{i}", "B") for i in range(3)]
    gate = SeriesTextGate(members, dataclasses.replace(load_series_policy(), sample_slices=5))
    order = gate.order()
    assert order[:5] == ["a0", "a3", "a5", "a8", "a11"] and sorted(order) == sorted(m for m, _ in members)
    assert order[5:12] == ["a1", "a2", "a4", "a6", "a7", "a9", "a10"]
    assert gate.slot("x").sampled and gate.slot("y").sampled and gate.slot("b2").sampled
    assert not gate.slot("a1").sampled
    gate.record("a0", [{"frame": "all", "box": [0, 0, 9, 9], "reason": "rule"}])  # a device rule is no text found
    assert not gate.slot("a1").state.has_text
    gate.record("a0", [{"frame": 0, "box": [0, 0, 9, 9], "reason": "phi"}])
    assert gate.slot("a1").state.has_text and not gate.slot("b0").state.has_text  # one state per series


def test_header_rules_make_text_likely():
    sp = load_series_policy()
    ds = Dataset()
    ds.Modality, ds.ImageType, ds.SOPClassUID = "CT", ["ORIGINAL", "PRIMARY", "AXIAL"], "1.2.840.10008.5.1.4.1.1.2"
    assert text_likely(ds, sp) is None
    ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    assert text_likely(ds, sp) == "ImageType"
    ds.ImageType = ["DERIVED", "SECONDARY", "REFORMATTED"]
    assert text_likely(ds, sp) == "ImageType"
    ds.ImageType = ["ORIGINAL", "PRIMARY"]
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture
    assert text_likely(ds, sp) == "SOPClassUID"
    ds.SOPClassUID, ds.Modality = "1.2.840.10008.5.1.4.1.1.2", "XA"
    assert text_likely(ds, sp) == "Modality"
    ds.Modality, ds.BurnedInAnnotation = "CT", "YES"
    assert text_likely(ds, sp) == "BurnedInAnnotation"


def _display(ds) -> np.ndarray:
    return display_frames(ds, ds.pixel_array[None])[0]


def test_precheck_finds_the_row_of_burned_text_on_a_real_slice_and_ocr_reads_it():
    require_ocr()
    policy, sp = load_text_policy(), load_series_policy()
    ds = ct_series(1)[0]
    # over the anatomy (the right lung of the first slice, where its lung window shows text), not in a corner
    x0, y0, x1, y1 = burn_text(ds, ["4829173", "09.01.2012"], (105, 300), CAP)
    rows = glyph_rows(_display(ds), sp.precheck)
    hit = [r for r in rows if r.box[0] < x1 and r.box[2] > x0 and r.box[1] < y1 and r.box[3] > y0]
    assert hit, "no glyph row over the burned text"
    assert any(row_has_text(_display(ds), r, policy, header_phi(ds, policy), sp) for r in hit)


def test_precheck_skips_most_real_clean_slices():
    """The real axial slices hold no burned-in text: rows the pre-check finds on them (vessels, ribs) are not read
    as words, so no slice needs a full read."""
    require_ocr()
    policy, sp = load_text_policy(), load_series_policy()
    series = ct_series(len(real_axial_slices()))
    suspect = [
        i
        for i, ds in enumerate(series)
        if any(
            row_has_text(_display(ds), r, policy, header_phi(ds, policy), sp)
            for r in glyph_rows(_display(ds), sp.precheck)
        )
    ]
    assert suspect == []


def _run(series: list[pydicom.Dataset], key) -> dict[int, tuple]:
    """De-identify a series (sample first) with OCR on: {position: (output pixels, audit, text regions)}."""
    datas = []
    for ds in series:
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        datas.append(buf.getvalue())
    gate = SeriesTextGate((i, "one series") for i in range(len(datas)))
    policy = build_policy()
    out = {}
    for i in gate.order():
        r = deidentify_dataset(pydicom.dcmread(io.BytesIO(datas[i])), key, "inst", policy, series_text=gate.slot(i))
        out[i] = (pydicom.dcmread(io.BytesIO(r.to_bytes())).pixel_array, r.audit, r.text_regions)
    return out


def _text_left(arr: np.ndarray, box: tuple[int, ...]) -> int:
    x0, y0, x1, y1 = box
    return int((arr[y0:y1, x0:x1] == TEXT_VALUE).sum())


def test_clean_series_is_read_on_no_slice(key):
    """No Tesseract read of a whole slice: the detector finds no row on the real slices that OCR reads as text."""
    require_ocr()
    out = _run(ct_series(N), key)
    assert sorted(i for i, (_, audit, _) in out.items() if audit.get("text_checked")) == []
    assert all(out[i][1].get("text_series_skipped") == 1 for i in range(N))
    assert not any(regions for _, _, regions in out.values())


@pytest.mark.parametrize("where", [7, 5, 0], ids=["one_slice", "middle_slice", "first_slice"])
def test_text_on_one_slice_only_is_blanked(key, where):
    require_ocr()
    series = ct_series(N)
    box = burn_text(series[where], SCANNER_TEXT, CORNER, CAP)
    out = _run(series, key)
    arr, audit, regions = out[where]
    assert _text_left(arr, box) == 0 and regions
    assert audit.get("text_series_precheck") == 1
    # every slice after it in the series is read in full, the others untouched
    assert all(not out[i][2] for i in range(N) if i != where)


def test_text_on_the_localizer_only_is_blanked(key):
    require_ocr()
    series = ct_series(N - 1)
    loc = localizer(series)
    box = burn_text(loc, SCANNER_TEXT, (300, 470))
    out = _run(series[:7] + [loc] + series[7:], key)  # at position 7: not in the sample, read by its ImageType
    arr, audit, regions = out[7]
    assert audit.get("text_series_header") == 1 and audit.get("text_checked") == 1
    assert _text_left(arr, box) == 0 and regions
    assert not any(out[i][2] for i in range(N) if i != 7)


@pytest.mark.slow
def test_scanner_text_on_every_slice_is_blanked_on_every_slice(key):
    require_ocr()
    series = ct_series(N)
    boxes = [burn_text(ds, SCANNER_TEXT, CORNER, CAP) for ds in series]
    out = _run(series, key)
    assert all(_text_left(out[i][0], boxes[i]) == 0 and out[i][2] for i in range(N))
    # the first slice sent to the full read by the detector, every later one because the series holds text
    assert out[0][1].get("text_series_precheck") == 1
    assert [i for i in range(N) if out[i][1].get("text_series_series_text")] == list(range(1, N))


@pytest.mark.slow
def test_medreco_deid_blanks_text_on_one_slice(tmp_path, key):
    require_ocr()
    from medreco.cli.deid_folder import deidentify_folder

    series = ct_series(N)
    box = burn_text(series[7], SCANNER_TEXT, CORNER, CAP)
    src = tmp_path / "src"
    src.mkdir()
    for i, ds in enumerate(series):
        ds.save_as(src / f"IM{i:04d}.dcm", enforce_file_format=True)
    balance = deidentify_folder(src, tmp_path / "out", key, "inst")
    assert balance["balanced"] and balance.get("quarantined", 0) == 0
    files = [pydicom.dcmread(p) for p in sorted((tmp_path / "out" / "files").glob("*.dcm"))]
    assert len(files) == N
    (slice7,) = [ds for ds in files if int(ds.InstanceNumber) == 8]
    assert _text_left(slice7.pixel_array, box) == 0
    assert sum(int((ds.pixel_array == TEXT_VALUE).sum()) for ds in files) == 0


@pytest.mark.slow
def test_gate_sends_every_case_file_with_text_to_the_full_read(tmp_path):
    """The pre-check and its row reads on the burned-in case generator's files (../shared/tools/burned_in_cases.py,
    drawn on real images of the shared data, none written for these rules): every file with PHI text would be read
    in full, and at most 2 of the 10 negative controls."""
    require_ocr()
    import json
    import subprocess
    import sys

    from etl.deid.series_text import _displayed
    from schemas.config import PROJECT_ROOT

    tool = PROJECT_ROOT.parent / "shared" / "tools" / "burned_in_cases.py"
    subprocess.run([sys.executable, str(tool), str(tmp_path)], check=True, capture_output=True)
    answer = json.loads((tmp_path / "answer_key.json").read_text())
    policy, sp = load_text_policy(), load_series_policy()
    missed, negatives, with_text = [], [], 0
    for entry in answer["files"]:
        ds = pydicom.dcmread(tmp_path / entry["path"])
        disp, phi = _displayed(ds, policy), header_phi(ds, policy)
        read = disp is None or any(
            row_has_text(f, r, policy, phi, sp) for f in disp for r in glyph_rows(f, sp.precheck)
        )
        if any(item["expected"] == "must_remove" for item in entry["planted"]):
            with_text += 1
            if not read:
                missed.append(entry["path"])
        elif entry["negative_control"] and read:
            negatives.append(entry["path"])
    assert with_text == 39 and missed == []
    # negative controls sent to the full read cost a read and stay unchanged (test_burned_in_cases); measured: 2
    # (N04, a real MR, and N10, a radiograph with its marker removed)
    assert len(negatives) <= 2, negatives


#: measured (issue 35): of 200 random placements on held-out real MR slices (seed 2035; the detector and its row reads
#: were tuned on seed 8, where the gate of a sample and a pre-check let 8 through and this one 2), this many pass the
#: gate where the full read acts (blanks or quarantines); the gate of a sample and a pre-check let 4 through on 2035
HELD_OUT_SEED = 2035
MAX_GATE_HOLES = 1


@pytest.mark.slow
def test_gate_on_random_text_over_held_out_real_slices():
    """Held out (no threshold was chosen on these images or this seed): PHI-like text in the fonts `make tools`
    installs, 9-18 px, full or half contrast, at random places on the real 256 x 256 MR series of TCIA's pseudo-PHI
    set and the two MR slices of dcm_qa_deident (../shared/data/deid). A placement the gate lets pass
    counts as a hole when the full read would have blanked it or quarantined the file. Prints the figures."""
    require_ocr()
    import copy
    import glob
    import random

    from PIL import Image, ImageDraw, ImageFont

    from etl.deid.burned_in_text import BurnedInTextError, clean_text
    from etl.deid.series_text import _displayed
    from schemas.config import PROJECT_ROOT

    root = PROJECT_ROOT.parent / "shared" / "data" / "deid"
    files = sorted(glob.glob(str(root / "tcia-pseudo-phi-mr" / "phi" / "*.dcm"))) + sorted(
        glob.glob(str(root / "already-deidentified" / "*.dcm"))
    )
    bases = [pydicom.dcmread(f) for f in files]
    assert len(bases) == 15
    policy, sp = load_text_policy(), load_series_policy()

    def gate(ds) -> bool:
        disp, phi = _displayed(ds, policy), header_phi(ds, policy)
        return disp is None or any(
            row_has_text(f, r, policy, phi, sp) for f in disp for r in glyph_rows(f, sp.precheck)
        )

    fonts = [
        "dejavu/DejaVuSans.ttf",
        "liberation/LiberationSans-Regular.ttf",
        "noto/NotoSansMono-Regular.ttf",
        "dejavu/DejaVuSansMono.ttf",
    ]
    words = [
        "HALVORSEN",
        "PRIYA",
        "OKAFOR",
        "LINDQVIST",
        "MARTA",
        "BEAUREGARD",
        "ID 5518203",
        "DOB 03/11/1958",
        "ACC A7731904",
        "12-FEB-2019",
        "ST. BRENDAN HOSP",
        "74Y",
        "14:22:07",
    ]
    rng = random.Random(HELD_OUT_SEED)
    passed, holes = 0, []
    for _ in range(200):
        ds = copy.deepcopy(rng.choice(bases))
        arr = ds.pixel_array.copy()
        rows, cols = arr.shape
        cap, text = rng.choice([9, 10, 11, 12, 14, 16, 18]), " ".join(rng.sample(words, rng.choice([1, 2])))
        font = ImageFont.truetype(f"/usr/share/fonts/truetype/{rng.choice(fonts)}", cap)
        im = Image.new("L", (cols, rows), 0)
        draw = ImageDraw.Draw(im)
        x = rng.randrange(0, max(1, int(cols - draw.textlength(text, font=font))))
        y = rng.randrange(0, rows - 2 * cap)
        draw.text((x, y), text, fill=255, font=font)
        mask = np.asarray(im) > 128
        contrast = rng.choice([1.0, 1.0, 0.5])
        top = float(np.percentile(arr, 99.9)) if contrast < 1 else float(arr.max())
        bg = float(np.median(arr[mask]))
        arr[mask] = np.clip(bg + contrast * (top - bg), arr.min(), np.iinfo(arr.dtype).max).astype(arr.dtype)
        ds.set_pixel_data(arr, str(ds.PhotometricInterpretation), int(ds.BitsStored), generate_instance_uid=False)
        if gate(ds):
            continue
        passed += 1
        try:
            acted = bool(clean_text(copy.deepcopy(ds), policy, header_phi(ds, policy)).regions)
        except BurnedInTextError:
            acted = True
        if acted:
            holes.append((text, cap, contrast, (x, y)))
    print(f"SERIES_GATE held_out placements=200 passed_gate={passed} holes={len(holes)}")
    assert len(holes) <= MAX_GATE_HOLES, holes


@pytest.mark.slow
def test_contiguous_head_ct_is_a_series_of_neighbouring_slices():
    """The benchmark's second series (etl/demo/real_series.contiguous_head_ct): 1 mm apart, brain window, a real
    scanner's header; neighbouring slices hold neighbouring anatomy (their Hounsfield units change far less from one
    slice to the next than the cycled chest slices of ct_series do)."""
    from etl.demo.real_series import HEAD_WINDOW, contiguous_head_ct

    series = contiguous_head_ct(6)
    assert [int(ds.InstanceNumber) for ds in series] == [1, 2, 3, 4, 5, 6]
    assert [float(ds.ImagePositionPatient[2]) for ds in series] == [0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    assert (float(series[0].WindowCenter), float(series[0].WindowWidth)) == HEAD_WINDOW
    assert series[0].Rows == series[0].Columns == 512 and len({ds.SeriesInstanceUID for ds in series}) == 1
    # a real scanner's header (the first real chest CT slice of the shared data), fictional patient values
    assert series[0].PatientName == "QUENNELL^MARGIT" and series[0].Manufacturer == ct_series(1)[0].Manufacturer

    def step(a, b) -> float:  # mean absolute change of the stored values (HU) from one slice to the next
        return float(np.mean(np.abs(a.pixel_array.astype(float) - b.pixel_array.astype(float))))

    # measured: 40-45 HU between neighbouring head slices (mostly the 8 HU noise), 300-335 HU between cycled ones
    assert max(step(series[i], series[i + 1]) for i in range(5)) < 60
    cycled = ct_series(3)
    assert min(step(cycled[0], cycled[1]), step(cycled[1], cycled[2])) > 200
