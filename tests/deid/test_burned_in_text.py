"""Burned-in text in pixels (etl/deid/burned_in_text.py): header PHI tokens, lines, the allow-list, the config
switch, and one synthetic image through de-identification (text blanked, verified, 113101 recorded; an image
without text unchanged)."""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
from ocr_required import require_ocr
from PIL import Image, ImageDraw, ImageFont
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from etl.deid.burned_in_text import PhiTokens, TextLine, Word, classify, group_lines, load_text_policy, uncut
from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.deid.policy import build_policy
from schemas.config import BurnedInTextConfig, DeidConfig, OcrOffRule


def _header() -> Dataset:
    ds = Dataset()
    ds.PatientName, ds.PatientID, ds.AccessionNumber = "DAVIDSON^DOUGLAS", "7712093", "ACC55120"
    ds.PatientBirthDate, ds.StudyDate, ds.StudyTime = "19760616", "20120109", "143205"
    ds.PatientAge, ds.InstitutionName = "035Y", "Kingsbridge Royal Infirmary"
    return ds


def test_phi_tokens_names_any_order_ids_and_dates_in_any_format():
    phi = PhiTokens.from_dataset(_header())
    for word in (
        "DAVIDSON",
        "Douglas,",
        "7712093",
        "ACC55120",
        "06.16.1976",
        "1976-06-16",
        "16-JUN-1976",
        "01/09/2012",
        "1/9/12",
        "14:32:05",
        "14:32",
        "Kingsbridge",
        "INFIRMARY",
        "35",
    ):
        assert phi.matches(word), word
    assert phi.matches("DAVIDS0N")  # one OCR edit on a long token
    for word in ("PORTABLE", "L", "1234567", "03.02.1990", "SUPINE"):
        assert not phi.matches(word), word


def test_an_age_is_a_token_with_its_unit_and_a_one_digit_age_only_with_it():
    ds = _header()
    ds.PatientAge = "008Y"
    phi = PhiTokens.from_dataset(ds)
    for word in ("8Y", "8 Y", "008Y"):
        assert phi.matches(word), word
    assert not phi.matches("8") and not phi.matches("Y")
    assert PhiTokens.from_dataset(_header()).matches("35 Y")  # 035Y


def test_a_phi_token_ocr_split_in_two_words_makes_the_line_phi():
    ds = _header()
    ds.PatientAge = "008Y"
    policy, phi = load_text_policy(), PhiTokens.from_dataset(ds)
    words = [Word("8", 72, (10, 10, 22, 28)), Word("Y", 72, (28, 10, 42, 28))]
    (line,) = group_lines(words, 1.6)
    assert classify(line, policy, phi).reason == "phi"
    far = [Word("8", 72, (10, 10, 22, 28)), Word("Q", 72, (28, 10, 42, 28))]
    (other,) = group_lines(far, 1.6)
    assert classify(other, policy, phi).reason is None


def _bars(rows: list[tuple[int, int]]) -> np.ndarray:
    """A 120 x 200 dark frame with glyph-like bright strokes (2 px wide, every 6 px) in the given row bands."""
    frame = np.full((120, 200), 20, np.uint8)
    for y0, y1 in rows:
        for x in range(20, 180, 6):
            frame[y0:y1, x : x + 2] = 230
    return frame


def test_a_blank_edge_that_cuts_a_neighbouring_line_moves_past_it_and_one_in_background_stays():
    policy = load_text_policy()
    frame = _bars([(30, 44), (50, 64)])  # two stacked lines, 6 px apart
    # the first line's box, grown by a margin that ends inside the second line (row 54)
    x0, y0, x1, y1 = uncut(frame, (15, 25, 185, 54), 14, False, True, policy)
    assert (x0, x1) == (15, 185) and y0 == 25
    assert y1 >= 64 + policy.margin_px  # the whole second line and a margin
    assert uncut(_bars([(30, 44)]), (15, 25, 185, 49), 14, False, True, policy) == (15, 25, 185, 49)


def _line(*texts: str, conf: float = 90.0) -> TextLine:
    words = [Word(t, conf, (10 + 60 * i, 10, 60 + 60 * i, 24)) for i, t in enumerate(texts)]
    (line,) = group_lines(words, 1.6)
    return line


def test_words_join_into_one_line_and_other_heights_or_rows_do_not():
    words = [
        Word("MRN", 90, (10, 10, 40, 24)),
        Word("4829173", 90, (46, 10, 110, 24)),
        Word("NEXT", 90, (10, 40, 50, 54)),
        Word("BIG", 90, (116, 0, 200, 60)),
    ]
    lines = sorted(group_lines(words, 1.6), key=lambda ln: ln.box)
    assert [len(ln.words) for ln in lines] == [2, 1, 1]
    assert lines[0].box == (10, 10, 110, 24)


def test_allow_listed_markers_stay_unless_a_word_is_phi():
    policy, phi = load_text_policy(), PhiTokens.from_dataset(_header())
    assert classify(_line("PORTABLE", "SUPINE"), policy, phi).allowed
    marker_and_name = classify(_line("PORTABLE", "DAVIDSON"), policy, phi)
    assert marker_and_name.reason == "phi" and not marker_and_name.allowed
    assert classify(_line("Ng", conf=70), policy, phi).reason is None  # OCR noise on anatomy: not text
    assert classify(_line("HOSPITAL", conf=85), policy, phi).reason == "word"


def test_config_switch_turns_ocr_off_per_institution_and_modality():
    cfg = BurnedInTextConfig(
        ocr_off=[OcrOffRule(institution="inst_a", modality="CT"), OcrOffRule(institution="inst_b")]
    )
    assert not cfg.enabled("inst_a", "CT") and cfg.enabled("inst_a", "CR")
    assert not cfg.enabled("inst_b", "US") and cfg.enabled("inst_c", "CT")
    assert not BurnedInTextConfig(ocr=False).enabled("inst_c", "CR")


def _image(text: str | None, photometric: str = "MONOCHROME2", modality: str = "CR") -> Dataset:
    """A 384 x 320 12-bit radiograph-like gradient, with ``text`` burned into the top-left corner."""
    yy, xx = np.mgrid[0:320, 0:384]
    arr = (600 + 1200 * np.exp(-(((xx - 192) / 120.0) ** 2 + ((yy - 170) / 110.0) ** 2))).astype(np.uint16)
    if text:
        im = Image.new("L", (384, 320), 0)
        ImageDraw.Draw(im).text((8, 8), text, fill=255, font=ImageFont.load_default(size=16))
        mask = np.asarray(im) > 128
        arr[mask] = 4095 if photometric == "MONOCHROME2" else 0
    ds = _header()
    ds.SOPClassUID, ds.SOPInstanceUID = "1.2.840.10008.5.1.4.1.1.1", generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.Modality = generate_uid(), generate_uid(), modality
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = 320, 384, 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.WindowCenter, ds.WindowWidth = "2048", "4096"
    ds.PixelData = arr.tobytes()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    return pydicom.dcmread(io.BytesIO(_bytes(ds)))


def _bytes(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_burned_in_name_and_date_are_blanked_and_recorded(key, photometric):
    require_ocr()
    ds = _image("DAVIDSON DOUGLAS 01.09.2012", photometric)
    before = ds.pixel_array.copy()
    result = deidentify_dataset(ds, key, "inst")
    out = pydicom.dcmread(io.BytesIO(result.payload))
    after = out.pixel_array
    assert result.text_regions and all(r["reason"] in ("phi", "word", "line") for r in result.text_regions)
    ink = np.argwhere(before != _image(None, photometric).pixel_array)
    (y0, x0), (y1, x1) = ink.min(axis=0), ink.max(axis=0) + 1
    assert len(np.unique(after[y0:y1, x0:x1])) == 1  # the whole line is one blank value
    changed = after != before
    blank = np.zeros_like(changed)
    for r in result.text_regions:
        x0, y0, x1, y1 = r["box"]
        blank[y0:y1, x0:x1] = True
    assert not (changed & ~blank).any()  # nothing changed outside the blanked regions
    assert changed.sum() < 0.1 * changed.size
    assert out.BurnedInAnnotation == "NO"
    assert "113101" in [item.CodeValue for item in out.DeidentificationMethodCodeSequence]
    assert result.audit["text_images_blanked"] == 1 and result.audit["text_checked"] == 1


def test_image_without_text_keeps_its_pixels(key):
    require_ocr()
    ds = _image(None)
    before = ds.pixel_array.copy()
    result = deidentify_dataset(ds, key, "inst")
    out = pydicom.dcmread(io.BytesIO(result.payload))
    assert np.array_equal(out.pixel_array, before)
    assert not result.text_regions and result.audit["text_checked"] == 1
    assert "113101" not in [item.CodeValue for item in out.DeidentificationMethodCodeSequence]


def test_ultrasound_is_read_not_quarantined_wholesale_and_ocr_off_restores_the_header_rule(key):
    require_ocr()
    ds = _image(None, modality="US")
    assert deidentify_dataset(ds, key, "inst").audit["text_checked"] == 1
    off = build_policy(DeidConfig(burned_in_text=BurnedInTextConfig(ocr_off=[OcrOffRule(modality="US")])))
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(_image(None, modality="US"), key, "inst", off)
    assert err.value.reason == "burned_in_annotation_risk"


def test_pixels_ocr_cannot_read_are_quarantined_with_the_decoders_reason(key):
    """Fail closed: a CR (no header risk) whose Pixel Data is shorter than its Image Pixel module implies is
    withheld at de-identification with normalisation's reason, not passed on unread."""
    require_ocr()
    ds = _image("DAVIDSON 01.09.2012")
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 2]
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(ds, key, "inst")
    assert err.value.reason == "pixel_data_length_mismatch"
    assert "DAVIDSON" not in str(err.value)


def test_an_image_too_small_for_a_line_of_text_is_checked_and_passes(key):
    require_ocr()
    ds = _image(None)
    arr = ds.pixel_array[:6, :40].copy()
    ds.Rows, ds.Columns = arr.shape
    ds.PixelData = arr.tobytes()
    result = deidentify_dataset(ds, key, "inst")
    assert result.audit["text_checked"] == 1 and not result.text_regions


def _glyph_ink(text: str, size: int = 24) -> np.ndarray:
    """A stroke-contrast map (float32) of ``text`` printed in capitals 120 levels over a flat background."""
    im = Image.new("L", (40 + size * len(text), 3 * size), 0)
    ImageDraw.Draw(im).text((10, size), text, fill=120, font=ImageFont.load_default(size=size))
    return np.asarray(im, dtype=np.float32)


def test_a_row_of_character_like_glyphs_is_found_and_blobs_or_a_ragged_row_are_not():
    from etl.deid.text_regions import glyph_row

    ink = _glyph_ink("ZELENKA 8841207")
    row = glyph_row(ink, 24.0)
    assert row is not None
    x0, y0, x1, y1 = row
    cols = np.flatnonzero((ink >= 60).any(axis=0))
    assert x0 <= cols[0] + 30 and y0 >= 20 and y1 <= 52  # the line of 24 px glyphs, from its first letters
    blobs = np.zeros((80, 400), np.float32)  # filled discs on one baseline: no strokes
    yy, xx = np.mgrid[0:80, 0:400]
    for cx in range(30, 380, 40):
        blobs[(xx - cx) ** 2 + (yy - 40) ** 2 <= 15**2] = 120
    assert glyph_row(blobs, 24.0) is None
    ragged = np.zeros((120, 400), np.float32)  # rings of one size on a baseline that wanders (ribs, vessels)
    for i, cx in enumerate(range(30, 380, 40)):
        cy = 40 + (0, 9, 3, 12, 1, 8, 14, 2, 10)[i]
        ring = ((xx - cx) ** 2 + (yy - cy) ** 2 <= 14**2) & ((xx - cx) ** 2 + (yy - cy) ** 2 >= 10**2)
        ragged[np.pad(ring, ((0, 40), (0, 0)))[:120]] = 120
    assert glyph_row(ragged, 24.0) is None


def test_a_line_box_taller_than_its_one_glyph_band_shrinks_to_it():
    from etl.deid.burned_in_text import tight_across

    policy = load_text_policy()
    ink = np.zeros((60, 200), np.float32)
    ink[20:34, 10:190:6] = 100  # a band of 14 px strokes ...
    ink[:, 5] = 100  # ... and one vertical edge across the whole box (a backdrop box's side)
    x0, y0, x1, y1 = tight_across(ink, (0, 0, 200, 60), False, policy)
    pad = int(np.ceil(0.5 * (policy.max_line_growth - 1.0) * 14))
    assert (x0, x1) == (0, 200) and (y0, y1) == (20 - pad, 34 + pad)
    assert tight_across(ink, (0, 16, 200, 38), False, policy) == (0, 16, 200, 38)  # within 1.6 x: as it was


def test_text_ocr_cannot_read_inside_the_image_quarantines_the_file(key, monkeypatch):
    """Glyphs OCR reads with no confidence (here: every word's confidence forced to 0) are still a row of
    characters: the file is quarantined as burned_in_text_unreadable, naming the frame and the box."""
    require_ocr()
    import etl.deid.burned_in_text as bit

    real = bit.ocr_words
    monkeypatch.setattr(
        bit, "ocr_words", lambda *a, **k: [bit.Word(w.text, 0.0, w.box, w.vertical) for w in real(*a, **k)]
    )
    ds = _image(None)
    arr = ds.pixel_array.copy()
    im = Image.new("L", (384, 320), 0)
    ImageDraw.Draw(im).text((100, 150), "ZELENKA 8841207", fill=255, font=ImageFont.load_default(size=24))
    arr[np.asarray(im) > 128] = 4095
    ds.PixelData = arr.tobytes()
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(ds, key, "inst")
    assert err.value.reason == "burned_in_text_unreadable"
    assert "frame 0" in str(err.value) and "box [" in str(err.value) and "ZELENKA" not in str(err.value)


def test_a_date_or_id_read_in_part_and_a_phi_field_label_are_phi():
    policy = load_text_policy()
    from etl.deid.burned_in_text import header_phi

    phi = header_phi(_header(), policy)
    for word in ("06.16.1", "0616197", "16.1976", "DOB:", "MRN"):  # 06.16.1976 cut; labels of the policy
        assert phi.matches(word), word
    for word in ("06.1", "12345", "DOBBS", "0616"):  # too short a part, digits of no token, a name, 4 digits
        assert not phi.matches(word), word
    assert not PhiTokens.from_dataset(_header()).matches("DOB")  # labels only from the policy


def test_a_line_read_again_larger_on_the_other_polarity_is_dropped():
    from etl.deid.burned_in_text import _read_once

    small = TextLine(
        [Word("MAKEPEACE", 95, (8, 7, 120, 21)), Word("ILSE", 95, (126, 7, 155, 21))],
        (8, 7, 155, 21),
        False,
        "phi",
        bright=True,
    )
    large = TextLine([Word("MAKEPEACE", 95, (0, 8, 130, 32))], (0, 8, 387, 32), False, "phi", bright=False)
    other = TextLine([Word("DOB", 95, (8, 27, 40, 39))], (0, 20, 387, 40), False, "phi", bright=False)
    assert _read_once([small, large, other]) == [small, other]  # DOB was not read in the small line
    same = TextLine([Word("MAKEPEACE", 95, (0, 8, 130, 32))], (0, 8, 387, 32), False, "phi", bright=True)
    assert _read_once([small, same]) == [small, same]  # one polarity: two readings of the page, both kept


def test_a_blank_box_shrinks_to_the_strokes_of_each_line_it_holds():
    from etl.deid.text_regions import trim_to_ink

    frame = np.full((80, 200), 20, np.uint8)
    frame[10:20, 10:150:6] = frame[10:20, 11:150:6] = 255  # a long line of glyph strokes (2 px wide)
    frame[26:36, 10:60:6] = frame[26:36, 11:60:6] = 255  # a short line under it
    frame[12:14, 160] = 40  # a faint stroke (20 levels, over 5% of the strongest): text, kept in the blank
    boxes = trim_to_ink(frame, (0, 0, 190, 50), 15, 4, 0.05, 2)
    assert boxes == [(8, 8, 163, 22), (8, 24, 62, 38)]
    assert trim_to_ink(np.full((80, 200), 20, np.uint8), (5, 5, 50, 30), 15, 4, 0.05, 2) == [(5, 5, 50, 30)]


def test_a_line_fading_along_its_length_keeps_its_faint_end_and_vertical_text_is_trimmed_turned():
    from etl.deid.text_regions import trim_to_ink

    frame = np.full((60, 220), 20, np.uint8)
    for i, x in enumerate(range(10, 200, 6)):  # strokes fading from 255 to 40 along the line
        frame[20:30, x : x + 2] = int(round(255 - i * (215 / 31)))
    frame[5, 100] = 70  # a lone speck above the line, under a quarter of the strongest strokes: no band
    assert trim_to_ink(frame, (0, 0, 220, 50), 15, 4, 0.25, 2, along_share=0.05) == [(8, 18, 200, 32)]
    assert trim_to_ink(frame, (0, 0, 220, 50), 15, 4, 0.25, 2)[0][2] < 200  # one share: the faint end cut
    turned = np.ascontiguousarray(frame.T)
    assert trim_to_ink(turned, (0, 0, 50, 220), 15, 4, 0.25, 2, vertical=True, along_share=0.05) == [(18, 8, 32, 200)]


def test_the_unread_line_of_a_label_block_is_bridged_and_adjacent_lines_are_not():
    from etl.deid.burned_in_text import bridges

    policy = load_text_policy()
    name = TextLine([Word("VANTERPOOL", 95, (258, 927, 582, 948))], (258, 927, 582, 948), False, "phi")
    date = TextLine([Word("08-MAR-2012", 95, (330, 991, 509, 1012))], (330, 991, 509, 1012), False, "phi")
    (box,) = bridges([name, date], 1024, 841, policy)  # room for one line (the age) between them
    m = max(policy.margin_px, round(policy.margin_fraction * 21))
    assert box == (330 - m, 948 - m, 509 + m, 991 + m)
    under = TextLine([Word("4829173", 95, (258, 952, 400, 973))], (258, 952, 400, 973), False, "phi")
    assert bridges([name, under], 1024, 841, policy) == []  # stacked lines, no line missing between them
    aside = TextLine([Word("4829173", 95, (600, 991, 700, 1012))], (600, 991, 700, 1012), False, "phi")
    assert bridges([name, aside], 1024, 841, policy) == []  # not one above the other


def _noisy_frame(seed: int = 3) -> np.ndarray:
    """A 16-bit CR-like frame (rows 80, cols 300): texture 3000..3400, brighter (3900..4300) from column 150 on."""
    rng = np.random.default_rng(seed)
    stored = rng.integers(3000, 3400, (80, 300)).astype(np.uint16)
    stored[:, 150:] += 900
    return stored


def test_a_line_drawn_in_one_stored_value_has_it_and_anatomy_or_a_common_value_has_none():
    from etl.deid.text_regions import stroke_value

    stored = _noisy_frame()
    for x in range(20, 140, 8):  # glyph cores of one value, far brighter than the texture here
        stored[30:42, x : x + 2] = 6000
    shown = (stored.astype(np.float32) / stored.max() * 255).astype(np.uint8)
    assert stroke_value(stored, shown, (15, 28, 145, 44), 15, min_mode_share=0.3, max_frame_share=0.02) == 6000
    plain = _noisy_frame()  # texture only: no value holds 30% of its strongest pixels
    shown = (plain.astype(np.float32) / plain.max() * 255).astype(np.uint8)
    assert stroke_value(plain, shown, (15, 28, 145, 44), 15, min_mode_share=0.3, max_frame_share=0.02) is None
    flat = np.full((80, 300), 100, np.uint16)
    flat[30:42, 20:140:8] = 900  # the value of the strokes is the frame's background elsewhere too
    flat[60:, :] = 900
    assert (
        stroke_value(
            flat, (flat // 4).astype(np.uint8), (15, 28, 145, 44), 15, min_mode_share=0.3, max_frame_share=0.02
        )
        is None
    )
    assert (
        stroke_value(stored.astype(np.float32), shown, (15, 28, 145, 44), 15, min_mode_share=0.3, max_frame_share=0.02)
        is None
    )  # float pixels: no exact stored value to follow


def test_a_box_grows_over_its_stroke_value_where_the_line_fades_into_bright_anatomy():
    from etl.deid.text_regions import extend_over_value

    stored = _noisy_frame()
    for x in range(20, 230, 8):  # one line drawn in 3450: brighter than the texture, then darker from column 150
        stored[30:42, x : x + 2] = 3450
    stored[30:42, 260:262] = 3450  # a lone stroke past a gap of 30 px (2.5 x the line height): not the line's
    kw = {"gap": 1.2, "reach": 12, "margin": 2}
    assert extend_over_value(stored, (18, 28, 100, 44), 3450, 12, vertical=False, **kw) == (18, 28, 232, 44)
    turned = np.ascontiguousarray(stored.T)  # the same line written top to bottom
    assert extend_over_value(turned, (28, 18, 44, 100), 3450, 12, vertical=True, **kw) == (28, 18, 44, 232)
    assert (
        extend_over_value(stored, (18, 28, 100, 44), 3450, 12, vertical=False, gap=1.2, reach=5, margin=2)[2] == 158 + 2
    )  # at most reach x the height: the stroke at 156..158
    stored[42:45, 20:60] = 3450  # rows of the line that the box cut off: its lower edge moves over them
    assert extend_over_value(stored, (18, 28, 100, 42), 3450, 12, vertical=False, **kw) == (18, 28, 232, 47)


def test_words_read_without_confidence_beside_a_text_line_are_read_again_on_their_own():
    from etl.deid.burned_in_text import Region, _second_look

    require_ocr()
    im = Image.new("L", (320, 120), 20)
    draw = ImageDraw.Draw(im)
    draw.text((20, 10), "QUIGLEY, MARISOL", fill=230, font=ImageFont.load_default(size=18))
    draw.text((20, 36), "35 Y", fill=230, font=ImageFont.load_default(size=18))  # the header's age, 035Y
    tx0, ty0, tx1, ty1 = draw.textbbox((20, 36), "35 Y", font=ImageFont.load_default(size=18))
    draw.text((20, 92), "35 Y", fill=230, font=ImageFont.load_default(size=18))  # 3.5 line heights below
    frame = np.asarray(im)
    policy, phi = load_text_policy(), PhiTokens.from_dataset(_header())
    name = TextLine([Word("MARISOL", 95, (20, 12, 190, 30))], (20, 12, 190, 30), False, "word")
    region = Region((0, 0, 320, 120), True, 18)
    beside = [Word("p35", 24, (18, 36, 62, 56))]  # what a crowded region read there
    (age,) = _second_look(frame, region, beside, [name], policy, phi, verify=False)
    x0, y0, x1, y1 = age.box  # the age's own glyphs, not the name above it
    assert age.reason == "phi" and y0 >= 30 and x0 <= tx0 + 2 and x1 >= tx1 - 2 and y0 <= ty0 + 2 and y1 >= ty1 - 2
    far = [Word("p35", 24, (18, 92, 62, 112))]
    assert _second_look(frame, region, far, [name], policy, phi, verify=False) == []
    assert _second_look(frame, region, beside, [], policy, phi, verify=False) == []  # no text line to be beside


def _rf(frame: np.ndarray) -> Dataset:
    """An 8-bit MONOCHROME2 fluoroscopy frame (rows, cols uint8) with the PHI header of :func:`_header`."""
    ds = _header()
    ds.SOPClassUID, ds.SOPInstanceUID = "1.2.840.10008.5.1.4.1.1.12.2", generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.Modality = generate_uid(), generate_uid(), "RF"
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = *frame.shape, 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.WindowCenter, ds.WindowWidth = "127.5", "256"  # displayed as stored
    ds.PixelData = frame.tobytes()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    return pydicom.dcmread(io.BytesIO(_bytes(ds)))


def _faint_beside_strong(faint: str) -> np.ndarray:
    """A 464 x 512 fluoroscopy-like frame (background 78 +- 3): the header's name in black at the top and
    ``faint`` 35 levels darker than the background below it."""
    im = Image.new("L", (512, 464), 0)
    draw = ImageDraw.Draw(im)
    draw.text((120, 44), "DAVIDSON DOUGLAS", fill=255, font=ImageFont.load_default(size=20))
    draw.text((276, 370), faint, fill=255, font=ImageFont.load_default(size=17))
    glyphs = np.asarray(im, np.float32) / 255
    bg = 78 + np.random.default_rng(5).normal(0, 3, glyphs.shape)
    depth = np.where(np.arange(464)[:, None] < 200, 78.0, 35.0)
    return np.clip(bg - depth * glyphs, 0, 255).astype(np.uint8)


def test_a_faint_id_beside_a_full_contrast_name_is_found_by_the_phi_sweep_and_quarantines():
    from etl.deid.burned_in_text import BurnedInTextError, _norm, _phi_sweep, read_lines

    require_ocr()
    frame = _faint_beside_strong("7712093")  # the PatientID
    policy, phi = load_text_policy(), PhiTokens.from_dataset(_header())

    def holds_id(lines):
        return any(ln.reason == "phi" and any(_norm(w.text) == "7712093" for w in ln.words) for ln in lines)

    assert not holds_id(read_lines(frame, policy, phi, verify=True))  # one global threshold: not laid out
    assert holds_id(read_lines(frame, policy, phi, verify=True, thresholding=1))  # tiled thresholds: found
    mask = np.zeros((1, *frame.shape), bool)
    mask[0, 40:75, 110:330] = True  # the name blanked (black), as the sweep sees a cleaned frame
    cleaned = np.where(mask[0], 0, frame).astype(np.uint8)
    with pytest.raises(BurnedInTextError) as err:
        _phi_sweep(_rf(cleaned), cleaned[None], mask, [(0, frame)], policy, phi)
    assert err.value.reason == "burned_in_text_remaining" and "adaptive" in str(err.value)
    other = np.where(mask[0], 0, _faint_beside_strong("4418806")).astype(np.uint8)  # no header value
    _phi_sweep(_rf(other), other[None], mask, [(0, other)], policy, phi)  # the sweep lets it be


def test_an_image_where_the_first_read_finds_no_text_still_gets_the_phi_sweep():
    import dataclasses

    from etl.deid.burned_in_text import BurnedInTextError, clean_text

    require_ocr()
    frame = _faint_beside_strong("7712093")
    policy = load_text_policy()
    blind = dataclasses.replace(  # a first read that calls nothing text (no word, line or PHI is sure enough)
        policy,
        word={**policy.word, "min_confidence": 101, "short_min_confidence": 101},
        line={**policy.line, "min_word_confidence": 101},
        phi={**policy.phi, "min_confidence": 101},
        unreadable={**policy.unreadable, "enabled": False},
    )
    with pytest.raises(BurnedInTextError) as err:
        clean_text(_rf(frame), blind)
    assert err.value.reason == "burned_in_text_remaining" and "adaptive" in str(err.value)
    off = dataclasses.replace(blind, verify={**blind.verify, "phi_sweep_thresholding": 0})
    ds = _rf(frame)
    assert not clean_text(ds, off).blanked  # without the sweep it ships as read: nothing found, nothing blanked


def test_vertical_text_in_a_side_margin_is_read_though_its_letters_laid_out_unturned_grow_into_anatomy(shared_data):
    """A name and birth date written bottom to top in DejaVu Sans at the right edge of a real head CT (the case
    B11 of ../shared/tools/burned_in_cases.py drawn on a machine without Liberation fonts): laid out unturned,
    their letters are short horizontal lines that grow along the ink into the skull beside them and cover the
    vertical lines; in the side margin only horizontal lines as long as the vertical one hide it."""
    import copy
    import dataclasses

    from etl.deid.burned_in_text import clean_text

    require_ocr()
    ds = pydicom.dcmread(shared_data / "dicom" / "ct-other" / "wg04_CT2_JPLL_toshiba.dcm")
    arr = ds.pixel_array.copy()
    ds.PatientName, ds.PatientBirthDate = "HOLLISTER^AMBROSE", "19480929"
    value = int((2000 - float(ds.RescaleIntercept)) / float(ds.RescaleSlope))  # +2000 HU: displayed white
    font = ImageFont.truetype(str(_fonts("DejaVuSans.ttf")[0]), 18)
    boxes = []
    for i, text in enumerate(["Hollister, Ambrose", "DOB: 09.29.1948"]):
        im = Image.new("L", (200, 24), 0)
        ImageDraw.Draw(im).text((0, 0), text, fill=255, font=font)
        glyphs = np.rot90(np.asarray(im) > 127)  # reads bottom to top
        ys, xs = np.nonzero(glyphs)
        glyphs = glyphs[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        h, w = glyphs.shape
        x0, y0 = 468 + 23 * i, 338 - h
        arr[y0 : y0 + h, x0 : x0 + w][glyphs] = value
        boxes.append((x0, y0, x0 + w, y0 + h))
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.PixelData = arr.tobytes()
    policy = load_text_policy()

    def blanked(band):
        d = copy.deepcopy(ds)
        clean_text(d, dataclasses.replace(policy, layout_vertical_side_band=band))
        out = d.pixel_array
        return [len(np.unique(out[y0:y1, x0:x1])) == 1 for x0, y0, x1, y1 in boxes]

    assert blanked(policy.layout_vertical_side_band) == [True, True]
    assert blanked(0.0) == [False, False]  # every horizontal region hides it: shipped as drawn, unread


def _fonts(name: str):
    from pathlib import Path

    found = sorted(Path("/usr/share/fonts").rglob(name))
    if not found:
        pytest.fail(f"{name} is not installed: `make tools` installs fonts-dejavu-core")
    return found
