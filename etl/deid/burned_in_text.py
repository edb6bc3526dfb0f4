"""Burned-in text in pixels: find text with Tesseract OCR in every 2D image and frame, blank it, verify after.

Policy as data: ``schemas/deid/burned_in_text.yaml`` (views, resolution, confidence thresholds, allow-list,
margins, verification). The steps, per frame of an object with pixels:

1. the displayed image (:func:`display_frames`): VOI window (first WindowCenter/WindowWidth, else the 0.5-99.5
   percentile window), MONOCHROME1 inverted, colour as luminance, 8-bit;
2. candidate regions, found cheaply (:func:`candidate_regions`): Tesseract's layout analysis only (no
   recognition) on a working copy (large frames reduced to about 1000 pixels a side, small ones enlarged),
   read on the white and the black morphological top-hat (thin strokes brighter / darker than their local
   background as black print; texture under ``min_ink`` left white, so a frame without text costs little
   more than its decode), the white one also turned for text written bottom to top; line boxes grow along
   the stroke ink that continues them and merge per line;
3. recognition at full resolution of the candidate regions only (:func:`read_region`), one polarity, the one
   whose top-hat found the region, enlarged so the text is about 22 px high, with one fallback read of the
   displayed crop where the top-hat page gave no sure word; words of one orientation join into lines
   (:func:`group_lines`); a line is text when one word is sure enough, when its words together are, or when a
   word equals a header PHI token (:class:`PhiTokens`: name parts in any order, IDs, accession, dates in any
   format, times, age, institution words; one edit allowed on long tokens, two misread digits on dates/IDs);
   words read without confidence beside a text line are read again on their own (:func:`_second_look`);
4. a text line whose words are all allow-listed clinical markers (L, R, PA, PORTABLE, ...) stays, unless a
   word is PHI; every other text line is blanked (the line box grown by a margin, over the pixels of the
   line's stroke value that continue it: :func:`etl.deid.text_regions.stroke_value`) with the value that
   displays black, then the same lines tight to their strokes (kept when they verify too);
5. verification: the cleaned image is read again; any line that still passes the ``verify`` thresholds, or any
   PHI word, raises ``burned_in_text_remaining`` (the file is quarantined); a row of character-like glyphs
   OCR could not read (:func:`unreadable_row`) left in a candidate region is blanked in the image margin on
   the first read, else raises ``burned_in_text_unreadable`` (the frame and box named); last, on every image
   read (blanked or not), the PHI sweep (:func:`_phi_sweep`) lays the pixels that ship out again with tiled
   thresholds and raises ``burned_in_text_remaining`` on any header PHI value read.

Errors are :class:`etl.deid.dicom.DeidentificationError` subclasses' reason codes: ``ocr_unavailable`` (no
Tesseract language data or no tesserocr), ``pixel_cleaning_failed`` (pixels that cannot be decoded, too large),
``burned_in_text_remaining``. Messages never quote a value: text read from pixels is never logged or stored.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError

TEXT_POLICY_FILE = PROJECT_ROOT / "schemas" / "deid" / "burned_in_text.yaml"
#: where Debian's tesseract-ocr-eng puts its language data (TESSDATA_PREFIX wins)
TESSDATA_DIRS = (
    "/usr/share/tesseract-ocr/5/tessdata",
    "/usr/share/tesseract-ocr/4.00/tessdata",
    "/usr/share/tessdata",
    "/usr/local/share/tessdata",
)
_MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()


class BurnedInTextError(ReasonCodedError):
    """Burned-in text that cannot be handled with certainty; ``reason`` is a reason code, no value is quoted.

    ``preview`` (:class:`etl.deid.preview.Preview` or None): for ``burned_in_text_remaining``, the cleaned frame
    that was read with the boxes of the lines still read (red) and of the blanks (cyan), for the curator's review
    (the stage stores it in the restricted ledger zone; it is never logged)."""

    message_format = "{message}"
    preview = None

    def with_preview(self, preview) -> BurnedInTextError:
        """This error with ``preview`` set (returned, to be raised)."""
        self.preview = preview
        return self


# ---- policy ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPolicy:
    """``schemas/deid/burned_in_text.yaml`` as read (see the file for each field's meaning)."""

    version: str
    language: str
    psm: int
    layout_psm: int
    layout_max_side_px: int
    layout_upscale_below_px: int
    layout_upscale: int
    tophat_px: int
    tophat_gain: float
    min_ink: float
    layout_vertical: bool
    layout_extend_max: float
    layout_vertical_side_band: float
    display_fallback: bool
    min_line_px: int
    max_line_px: int
    pad_px: int
    pad_fraction: float
    target_line_px: int
    max_upscale: float
    min_side_px: int
    max_frames_each: int
    sample_frames: int
    max_pixels: int
    word: dict[str, float]
    line: dict[str, float]
    phi: dict[str, float]
    join_gap: float
    extend_gap: float
    extend_max: float
    max_height_ratio: float
    min_join_confidence: float
    margin_px: int
    margin_fraction: float
    allow_list: frozenset[str]
    verify: dict[str, float]
    unreadable: dict[str, float]
    max_line_growth: float
    trim: dict[str, float]
    bridge: dict[str, float]
    value: dict[str, float]
    second_look: dict[str, float]


@lru_cache(maxsize=4)
def load_text_policy(path: str | None = None) -> TextPolicy:
    """Read the burned-in text policy (default ``schemas/deid/burned_in_text.yaml``).

    Raises
    ------
    BurnedInTextError
        ``invalid_text_policy`` for a missing or malformed field.
    """
    data = yaml.safe_load(Path(path or TEXT_POLICY_FILE).read_text(encoding="utf-8"))
    try:
        lay, rec = data["layout"], data["recognition"]
        return TextPolicy(
            version=str(data["version"]),
            language=str(data["language"]),
            psm=int(rec["page_segmentation_mode"]),
            layout_psm=int(lay["page_segmentation_mode"]),
            layout_max_side_px=int(lay["max_side_px"]),
            layout_upscale_below_px=int(lay["upscale_below_px"]),
            layout_upscale=int(lay["upscale"]),
            tophat_px=int(data["tophat_px"]),
            tophat_gain=float(data["tophat_gain"]),
            min_ink=float(data["min_ink"]),
            layout_vertical=bool(lay["vertical"]),
            layout_extend_max=float(lay["extend_max"]),
            layout_vertical_side_band=float(lay["vertical_side_band"]),
            display_fallback=bool(rec["display_fallback"]),
            min_line_px=int(lay["min_line_px"]),
            max_line_px=int(lay["max_line_px"]),
            pad_px=int(lay["pad_px"]),
            pad_fraction=float(lay["pad_fraction"]),
            target_line_px=int(rec["target_line_px"]),
            max_upscale=float(rec["max_upscale"]),
            min_side_px=int(data["min_side_px"]),
            max_frames_each=int(data["max_frames_each"]),
            sample_frames=int(data["sample_frames"]),
            max_pixels=int(data["max_pixels"]),
            word=dict(data["word"]),
            line=dict(data["line"]),
            phi=dict(data["phi"]),
            join_gap=float(data["join_gap"]),
            extend_gap=float(data["extend_gap"]),
            extend_max=float(data["extend_max"]),
            max_height_ratio=float(data["max_height_ratio"]),
            min_join_confidence=float(data["min_join_confidence"]),
            margin_px=int(data["margin_px"]),
            margin_fraction=float(data["margin_fraction"]),
            allow_list=frozenset(_norm(w) for w in data["allow_list"]),
            verify=dict(data["verify"]),
            unreadable=dict(data["unreadable"]),
            max_line_growth=float(data["max_line_growth"]),
            trim=dict(data["trim"]),
            bridge=dict(data["bridge"]),
            value=dict(data["value"]),
            second_look=dict(data["second_look"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BurnedInTextError("invalid_text_policy", f"{TEXT_POLICY_FILE.name}: bad or missing field {err}") from None


# ---- OCR engine ------------------------------------------------------------------------------------------


def tessdata_dir() -> str | None:
    """The folder holding ``eng.traineddata`` (``TESSDATA_PREFIX`` first, then Debian's paths), or None."""
    env = os.environ.get("TESSDATA_PREFIX")
    for d in ([env] if env else []) + list(TESSDATA_DIRS):
        if d and (Path(d) / "eng.traineddata").is_file():
            return d
    return None


def ocr_available() -> str | None:
    """None when OCR can run here, else why not (names the missing package)."""
    try:
        import tesserocr  # noqa: F401
    except ImportError:
        return "the Python package tesserocr is not installed (pip install tesserocr, see constraints)"
    if tessdata_dir() is None:
        return (
            "Tesseract's English language data (eng.traineddata, Debian package tesseract-ocr-eng) is not "
            "installed: run `make tools`"
        )
    return None


class _Engine:
    """One Tesseract instance per thread (the C++ API is not thread-safe), kept loaded between images."""

    _local = threading.local()

    @classmethod
    def api(cls, policy: TextPolicy):
        api = getattr(cls._local, "api", None)
        if api is None:
            problem = ocr_available()
            if problem:
                raise BurnedInTextError("ocr_unavailable", problem)
            import tesserocr

            # Leptonica's own stderr lines ("Error in pixScanForForeground: invalid box", for an empty crop) are
            # not failures of ours: every outcome is judged from the API's results (process-wide setting)
            tesserocr.set_leptonica_log_level(tesserocr.LeptLogLevel.NONE)
            api = tesserocr.PyTessBaseAPI(path=tessdata_dir(), lang=policy.language, psm=policy.psm)
            cls._local.api = api
        return api


@dataclass(frozen=True)
class Word:
    """One word Tesseract read: ``text`` (never logged), ``conf`` 0..100, ``box`` [x0, y0, x1, y1] in image
    pixels (x1/y1 exclusive), ``vertical`` when read on the turned view."""

    text: str
    conf: float
    box: tuple[int, int, int, int]
    vertical: bool = False


def ocr_words(page: np.ndarray, policy: TextPolicy, scale: float, vertical: bool = False) -> list[Word]:
    """Words Tesseract recognises on one 8-bit page (rows, cols; dark text on light) read at ``scale``, with
    the policy's recognition PSM; boxes in ``page`` pixels.

    With ``vertical`` the page is read turned 90 degrees clockwise (text written bottom to top becomes
    horizontal) and the boxes are mapped back.
    """
    import tesserocr
    from PIL import Image

    rows, cols = page.shape
    img = np.ascontiguousarray(np.rot90(page, -1)) if vertical else page
    im = Image.fromarray(img)
    if scale != 1.0:
        im = im.resize(
            (max(1, round(im.width * scale)), max(1, round(im.height * scale))),
            Image.Resampling.BICUBIC if scale > 1 else Image.Resampling.BOX,
        )
    api = _Engine.api(policy)
    api.SetPageSegMode(policy.psm)
    api.SetImage(im)
    api.Recognize()
    level = tesserocr.RIL.WORD
    out = []
    it = api.GetIterator()
    for r in tesserocr.iterate_level(it, level):
        try:
            text = r.GetUTF8Text(level)
            conf = float(r.Confidence(level))
            bb = r.BoundingBox(level)
        except RuntimeError:
            continue
        if not text or not text.strip() or bb is None:
            continue
        x0, y0, x1, y1 = (
            int(np.floor(bb[0] / scale)),
            int(np.floor(bb[1] / scale)),
            int(np.ceil(bb[2] / scale)),
            int(np.ceil(bb[3] / scale)),
        )
        if vertical:  # turned clockwise: (r', c') = (c, rows - 1 - r)
            x0, y0, x1, y1 = y0, rows - x1, y1, rows - x0
        out.append(Word(text.strip(), conf, (max(0, x0), max(0, y0), min(cols, x1), min(rows, y1)), vertical))
    return out


def layout_lines(page: np.ndarray, policy: TextPolicy, thresholding: int = 0) -> list[tuple[int, int, int, int]]:
    """Text line boxes [x0, y0, x1, y1] of Tesseract's layout analysis alone (no recognition) on one 8-bit page
    (dark text on light), with the layout PSM (sparse text); in ``page`` pixels. ``thresholding`` is
    Tesseract's ``thresholding_method`` for this page (0: one global Otsu threshold; 1: Leptonica's tiled
    adaptive Otsu, so a faint line beside strong ones is binarised by its own tile)."""
    import tesserocr
    from PIL import Image

    api = _Engine.api(policy)
    api.SetPageSegMode(policy.layout_psm)
    api.SetVariable("thresholding_method", str(int(thresholding)))
    try:
        api.SetImage(Image.fromarray(page))
        it = api.AnalyseLayout()
    finally:
        api.SetVariable("thresholding_method", "0")  # recognition always binarises with the default
    if it is None:
        return []
    out = []
    for r in tesserocr.iterate_level(it, tesserocr.RIL.TEXTLINE):
        bb = r.BoundingBox(tesserocr.RIL.TEXTLINE)
        if bb is not None and bb[2] > bb[0] and bb[3] > bb[1]:
            out.append((int(bb[0]), int(bb[1]), int(bb[2]), int(bb[3])))
    return out


# ---- display and views -----------------------------------------------------------------------------------


def _first(v: Any) -> float:
    try:
        return float(v[0]) if isinstance(v, (list, tuple)) or type(v).__name__ == "MultiValue" else float(v)
    except (TypeError, ValueError, IndexError):
        return float("nan")


def display_frames(ds, arr: np.ndarray) -> np.ndarray:
    """The displayed 8-bit image of every frame: (frames, rows, cols) uint8.

    Parameters
    ----------
    ds : pydicom.Dataset
        the instance (PhotometricInterpretation, Rescale*, Window*, palette).
    arr : numpy.ndarray
        its decoded stored values with a leading frames axis: (frames, rows, cols) or (frames, rows, cols, 3).
    """
    photometric = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    if photometric == "PALETTE COLOR" and arr.ndim == 3:
        from pydicom.pixels import apply_color_lut

        rgb = apply_color_lut(arr, ds)
        arr = (rgb >> 8).astype(np.uint8) if rgb.dtype != np.uint8 else rgb
    if arr.ndim == 4:
        lum = arr[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        hi = 255.0 if arr.dtype == np.uint8 else float(max(lum.max(), 1.0))
        return np.clip(lum * (255.0 / hi), 0, 255).astype(np.uint8)
    x = arr.astype(np.float32)
    slope, intercept = _first(ds.get("RescaleSlope", 1) or 1), _first(ds.get("RescaleIntercept", 0) or 0)
    if np.isfinite(slope) and np.isfinite(intercept) and (slope, intercept) != (1.0, 0.0):
        x = x * slope + intercept
    c, w = _first(ds.get("WindowCenter")), _first(ds.get("WindowWidth"))
    if np.isfinite(c) and np.isfinite(w) and w > 1:
        lo, hi = c - w / 2, c + w / 2
    else:
        step = max(1, int(np.sqrt(x.size / 250_000)))  # the percentiles of a strided sample (>= 250,000 values)
        lo, hi = (float(v) for v in np.percentile(x[..., ::step, ::step], (0.5, 99.5)))
    if hi <= lo:
        lo, hi = float(x.min()), float(x.max())
    unit = np.clip((x - lo) / max(hi - lo, 1e-6), 0, 1)
    if photometric == "MONOCHROME1":
        unit = 1.0 - unit
    return np.rint(unit * 255).astype(np.uint8)


# ---- header PHI tokens -----------------------------------------------------------------------------------


def _norm(text: str) -> str:
    """Upper case, letters and digits only."""
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def _date_forms(d: str) -> set[str]:
    """The digit/letter forms (normalised) an 8-digit date can be written in."""
    if not re.fullmatch(r"\d{8}", d):
        return set()
    y, m, dd = d[:4], d[4:6], d[6:8]
    if not (1 <= int(m) <= 12):
        return {d}
    mon = _MONTHS[int(m) - 1]
    forms = {
        d,
        m + dd + y,
        dd + m + y,
        dd + mon + y,
        m + dd + y[2:],
        dd + m + y[2:],
        str(int(m)) + str(int(dd)) + y[2:],
        str(int(dd)) + str(int(m)) + y[2:],
        str(int(m)) + str(int(dd)) + y,
        dd + mon + y[2:],
    }
    return {f for f in forms if len(f) >= 4}


@dataclass
class PhiTokens:
    """Normalised header PHI values (upper case, letters and digits) looked for in OCR words.

    Built by :meth:`from_dataset` before de-identification changes the header: person-name parts, IDs,
    accession, dates (birth, study, series, acquisition, content) in the usual written forms, times (HHMMSS,
    HHMM), the age number alone and with its unit (PatientAge ``074Y``: ``74``, ``74Y``, ``074Y``; a one-digit
    age is a token only with its unit, ``8Y``) and the institution's words of four letters or more.
    """

    tokens: set[str] = field(default_factory=set)
    min_chars: int = 2
    labels: frozenset[str] = frozenset()

    @classmethod
    def from_dataset(cls, ds, min_chars: int = 2, labels: frozenset[str] = frozenset()) -> PhiTokens:
        """The tokens of ``ds``'s header; ``labels`` (normalised words such as ``DOB``, ``MRN``: the labels of
        PHI fields written before their value, policy ``phi.labels``) match as PHI too."""

        def s(kw: str) -> str:
            v = ds.get(kw)
            if v is None:
                return ""
            return " ".join(str(x) for x in v) if type(v).__name__ == "MultiValue" else str(v)

        toks: set[str] = set()
        for kw in (
            "PatientName",
            "OtherPatientNames",
            "PatientBirthName",
            "PatientMotherBirthName",
            "ReferringPhysicianName",
            "PerformingPhysicianName",
            "OperatorsName",
        ):
            for part in re.split(r"[\^=\s,]+", s(kw)):
                toks.add(_norm(part))
        for kw in ("PatientID", "OtherPatientIDs", "AccessionNumber", "StudyID", "IssuerOfPatientID"):
            for part in re.split(r"[\s\\]+", s(kw)):
                toks.add(_norm(part))
        for kw in ("PatientBirthDate", "StudyDate", "SeriesDate", "AcquisitionDate", "ContentDate"):
            toks |= _date_forms(s(kw).strip()[:8])
        for kw in ("StudyTime", "SeriesTime", "AcquisitionTime", "ContentTime"):
            t = re.sub(r"\D", "", s(kw).split(".")[0])
            if len(t) >= 4:
                toks |= {t[:6], t[:4]}
        age = re.fullmatch(r"(0*(\d{1,3}))([DWMY])", s("PatientAge").strip())
        if age:  # "74", and as written with its unit: "74Y" ("74 Y" normalised), "074Y", "8Y"
            toks |= {age.group(2), age.group(2) + age.group(3), age.group(1) + age.group(3)}
        for kw in ("InstitutionName", "InstitutionAddress", "InstitutionalDepartmentName"):
            for part in re.split(r"[\s,.'-]+", s(kw)):
                if len(_norm(part)) >= 4:
                    toks.add(_norm(part))
        return cls({t for t in toks if len(t) >= min_chars}, min_chars, labels)

    @staticmethod
    def tokens_of(text: str, min_chars: int = 2) -> set[str]:
        """The normalised words of a free text (e.g. an answer key's planted text), as tokens."""
        return {t for t in (_norm(p) for p in re.split(r"[\s,]+", text)) if len(t) >= min_chars}

    def matches(self, word: str, fuzzy_min: int = 5) -> bool:
        """True when the word (or its digits, for dates and IDs) equals a token, is one edit away from a token
        of at least ``fuzzy_min`` characters, or its digits (six or more) differ from a digit token's in at most
        two places."""
        w = _norm(word)
        if len(w) < self.min_chars:
            return False
        digits = re.sub(r"\D", "", w)
        if w in self.tokens or (len(digits) >= 4 and digits in self.tokens):
            return True
        if len(digits) >= 6 and any(
            len(t) == len(digits) and t.isdigit() and sum(a != b for a, b in zip(t, digits)) <= 2 for t in self.tokens
        ):
            return True  # a date or ID with two digits misread (0/8, 1/7, 0/6 ...)
        if (
            len(digits) >= 5
            and len(digits) >= len(w) - 1
            and any(
                len(t) >= len(digits) + 2 and t.isdigit() and (t.startswith(digits) or t.endswith(digits))
                for t in self.tokens
            )
        ):
            return True  # a date or ID read in part ("04.21.1" of 04.21.1967: its last glyphs faint or cut)
        if w in self.labels:
            return True  # the label of a PHI field ("DOB", "MRN"): its value follows on the line
        if len(w) >= fuzzy_min:
            return any(abs(len(t) - len(w)) <= 1 and len(t) >= fuzzy_min and _one_edit(w, t) for t in self.tokens)
        return False


def header_phi(ds, policy: TextPolicy) -> PhiTokens:
    """The header PHI tokens of ``ds`` with the policy's token length and PHI field labels (``phi``)."""
    labels: list[str] = list(policy.phi.get("labels") or [])  # type: ignore[arg-type]
    return PhiTokens.from_dataset(ds, int(policy.phi["min_token_chars"]), frozenset(_norm(w) for w in labels))


def _one_edit(a: str, b: str) -> bool:
    """Levenshtein distance of a and b is at most 1."""
    if a == b:
        return True
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) > 1:
        return False
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i + 1 :] == b[i + 1 :] if len(a) == len(b) else a[i:] == b[i + 1 :]


# ---- lines and decisions ---------------------------------------------------------------------------------


@dataclass
class TextLine:
    """Words of one line: ``box`` [x0, y0, x1, y1] (exclusive ends) around them; ``reason`` why it is text
    (``phi``, ``word``, ``line``) or None; ``allowed`` when every word is an allow-listed marker; ``bright`` the
    polarity of the region it was read in."""

    words: list[Word]
    box: tuple[int, int, int, int]
    vertical: bool
    reason: str | None = None
    allowed: bool = False
    bright: bool = True  # the text is brighter than its background (the polarity of the region it was read in)

    @property
    def height(self) -> int:
        """Line height across its reading direction (pixels)."""
        x0, y0, x1, y1 = self.box
        return (x1 - x0) if self.vertical else (y1 - y0)


def group_lines(words: list[Word], join_gap: float, max_height_ratio: float = 1.7) -> list[TextLine]:
    """Join words of one orientation and similar height (ratio at most ``max_height_ratio``) into lines: boxes
    that overlap across the reading direction by half the smaller height with a gap under ``join_gap`` x the
    taller height."""
    from etl.deid.text_regions import components

    n = len(words)
    edges = []
    for i in range(n):
        a = words[i]
        for j in range(i + 1, n):
            b = words[j]
            if a.vertical != b.vertical:
                continue
            ax0, ay0, ax1, ay1 = a.box
            bx0, by0, bx1, by1 = b.box
            if a.vertical:  # swap axes: the reading direction is y
                ax0, ay0, ax1, ay1 = ay0, ax0, ay1, ax1
                bx0, by0, bx1, by1 = by0, bx0, by1, bx1
            h = min(ay1 - ay0, by1 - by0)
            overlap = min(ay1, by1) - max(ay0, by0)
            gap = max(bx0 - ax1, ax0 - bx1)
            ratio = max(ay1 - ay0, by1 - by0) / max(h, 1)
            if overlap >= 0.5 * max(h, 1) and ratio <= max_height_ratio and gap <= join_gap * max(ay1 - ay0, by1 - by0):
                edges.append((i, j))
    groups = [[words[i] for i in g] for g in components(n, edges)]
    lines = []
    for ws in groups:
        box = (
            min(w.box[0] for w in ws),
            min(w.box[1] for w in ws),
            max(w.box[2] for w in ws),
            max(w.box[3] for w in ws),
        )
        lines.append(TextLine(ws, box, ws[0].vertical))
    return lines


def classify(line: TextLine, policy: TextPolicy, phi: PhiTokens, *, verify: bool = False) -> TextLine:
    """Set ``line.reason`` (``phi``, ``word``, ``line`` or None) and ``line.allowed`` by the policy thresholds
    (the ``verify`` ones when ``verify``). A PHI token is looked for in each word and in each pair of
    neighbouring words joined (OCR often splits "74 Y" or "01.09. 2012" in two)."""
    w_conf = policy.verify["word_min_confidence"] if verify else policy.word["min_confidence"]
    w_chars = policy.verify["min_chars"] if verify else policy.word["min_chars"]
    p_conf = policy.verify["phi_min_confidence"] if verify else policy.phi["min_confidence"]
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    line.reason = None
    sure = [w for w in line.words if w.conf >= p_conf]
    along = sorted(sure, key=lambda w: w.box[1] if line.vertical else w.box[0])
    pairs = [a.text + b.text for a, b in zip(along, along[1:])]  # a token OCR split in two ("74" "Y")
    if any(phi.matches(w.text, fuzzy) for w in sure) or any(phi.matches(t, fuzzy) for t in pairs):
        line.reason = "phi"
    elif any(w.conf >= w_conf and len(_norm(w.text)) >= w_chars for w in line.words) or any(
        w.conf >= policy.word["short_min_confidence"] and len(_norm(w.text)) >= policy.word["short_min_chars"]
        for w in line.words
    ):
        line.reason = "word"
    else:
        good = [w for w in line.words if len(_norm(w.text)) >= 2 and w.conf >= policy.line["min_word_confidence"]]
        chars = sum(len(_norm(w.text)) for w in good)
        if (
            good
            and chars >= policy.line["min_chars"]
            and (sum(w.conf for w in good) / len(good)) >= policy.line["min_mean_confidence"]
        ):
            line.reason = "line"
    sure = [w for w in line.words if _norm(w.text)]
    line.allowed = line.reason != "phi" and bool(sure) and all(_norm(w.text) in policy.allow_list for w in sure)
    return line


@dataclass(frozen=True)
class Region:
    """One region to recognise: ``box`` [x0, y0, x1, y1] in frame pixels, ``bright`` when its text is brighter
    than its background (white top-hat), ``line_px`` the smallest candidate line height in it (pixels),
    ``vertical`` when its lines run top to bottom (text written in a margin)."""

    box: tuple[int, int, int, int]
    bright: bool
    line_px: int
    vertical: bool = False


def candidate_regions(frame: np.ndarray, policy: TextPolicy, thresholding: int = 0) -> list[Region]:
    """Where text may be in one displayed frame (rows, cols uint8), found cheaply: Tesseract's layout analysis
    (no recognition) on the white and on the black top-hat page of the working copy
    (:func:`etl.deid.text_regions.working_copy`), the white one also turned 90 degrees; line boxes of a
    plausible height (``min_line_px`` .. ``max_line_px`` at full resolution) grow along their line over the
    stroke ink that continues it (:func:`extend_along_ink`, so a line the layout split is read whole), merge
    where they overlap or continue one another, and are padded by ``max(pad_px, pad_fraction x height)``.
    ``thresholding``: the layout's binarisation (:func:`layout_lines`)."""
    from etl.deid.text_regions import ink_maps, merge_lines, page, working_copy

    rows, cols = frame.shape
    work, f = working_copy(frame, policy.layout_max_side_px, policy.layout_upscale_below_px, policy.layout_upscale)
    bright_ink, dark_ink = ink_maps(work, round(policy.tophat_px * f))
    out: list[Region] = []
    passes = [(True, bright_ink, False), (False, dark_ink, False), (True, bright_ink, True)]
    laid: list[tuple[int, int, int, int]] = []  # horizontal layout lines as laid out (not grown), frame pixels
    for bright, ink, vertical in passes:
        if vertical and not policy.layout_vertical:
            continue
        if float(ink.max()) < policy.min_ink + 8:  # no stroke stands out: nothing to lay out
            continue
        pg = page(ink, policy.min_ink, policy.tophat_gain)
        wr, wc = pg.shape
        boxes, heights = [], []
        for bx0, by0, bx1, by1 in layout_lines(
            np.ascontiguousarray(np.rot90(pg, -1)) if vertical else pg, policy, thresholding
        ):
            if vertical:  # turned clockwise: back to the page's pixels
                bx0, by0, bx1, by1 = by0, wr - bx1, by1, wr - bx0
            across = (bx1 - bx0) if vertical else (by1 - by0)
            if not policy.min_line_px <= across / f <= policy.max_line_px:
                continue
            if not vertical:
                laid.append((int(bx0 / f), int(by0 / f), int(np.ceil(bx1 / f)), int(np.ceil(by1 / f))))
            bx0, by0, bx1, by1 = extend_along_ink(ink, (bx0, by0, bx1, by1), vertical, policy, policy.layout_extend_max)
            boxes.append((int(bx0 / f), int(by0 / f), int(np.ceil(bx1 / f)), int(np.ceil(by1 / f))))
            heights.append(max(1, int(round(across / f))))
        t = [(b[1], b[0], b[3], b[2]) for b in boxes] if vertical else boxes  # merge along the reading direction
        for mb, members in merge_lines(t, heights, policy.join_gap):
            x0, y0, x1, y1 = (mb[1], mb[0], mb[3], mb[2]) if vertical else mb
            h = min(heights[i] for i in members)
            p = max(policy.pad_px, int(round(policy.pad_fraction * h)))
            box = (max(0, x0 - p), max(0, y0 - p), min(cols, x1 + p), min(rows, y1 + p))
            if vertical and _overlap_share(box, _turned_letters_of(box, out, laid, rows, cols, policy)) > 0.3:
                continue  # letters of horizontal lines laid out turned: read as horizontal text already
            out.append(Region(box, bright, h, vertical))
    return out


def _turned_letters_of(
    box: tuple[int, int, int, int],
    out: list[Region],
    laid: list[tuple[int, int, int, int]],
    rows: int,
    cols: int,
    policy: TextPolicy,
) -> list[tuple[int, int, int, int]]:
    """The horizontal boxes that make a vertical layout line ``box`` [x0, y0, x1, y1] the letters of horizontal
    text laid out turned (so it is not read again). Inside the image, every horizontal region. In a side margin
    (``layout.vertical_side_band`` of the width, left or right), where vertical text is written, only the
    horizontal lines as laid out (``laid``, not grown along the ink) at least as long as ``box``: the letters of
    vertical text, laid out unturned, are short lines that grow along the ink into the anatomy beside them."""
    x0, y0, x1, y1 = box
    band = policy.layout_vertical_side_band
    if x1 <= band * cols or x0 >= (1 - band) * cols:
        return [b for b in laid if b[2] - b[0] >= y1 - y0]
    return [r.box for r in out if not r.vertical]


def _overlap_share(box: tuple[int, int, int, int], others: list[tuple[int, int, int, int]]) -> float:
    """The share of ``box``'s area covered by the union of ``others`` (0..1)."""
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return 0.0
    cover = np.zeros((y1 - y0, x1 - x0), bool)
    for ox0, oy0, ox1, oy1 in others:
        cover[max(0, oy0 - y0) : max(0, oy1 - y0), max(0, ox0 - x0) : max(0, ox1 - x0)] = True
    return float(cover.mean())


def read_region(
    frame: np.ndarray, region: Region, policy: TextPolicy
) -> tuple[list[Word], np.ndarray, tuple[int, int]]:
    """Recognise one region at full resolution: its top-hat page of the region's polarity (structure
    ``max(tophat_px, 0.8 x line height)``, so thick strokes of large text stay whole; contrast stretched so the
    region's strongest strokes print black, so faint text reads like print), enlarged so its smallest
    line is about ``target_line_px`` high (at most ``max_upscale`` x), turned for a vertical region.

    Returns the words (frame pixels), the stroke-contrast map (float32, rows x cols of a window: the region
    widened along its reading direction by ``extend_max`` x its line height, clipped to the frame, so that a
    text line can grow past the region over the ink that continues it) and the window's (x0, y0) in the frame.
    """
    from etl.deid.text_regions import ink_maps, page

    rows, cols = frame.shape
    x0, y0, x1, y1 = region.box
    reach = int(policy.extend_max * region.line_px)
    wx0, wx1 = (x0, x1) if region.vertical else (max(0, x0 - reach), min(cols, x1 + reach))
    wy0, wy1 = (max(0, y0 - reach), min(rows, y1 + reach)) if region.vertical else (y0, y1)
    window = frame[wy0:wy1, wx0:wx1].astype(np.float32)
    k = max(policy.tophat_px, int(round(0.8 * region.line_px)) | 1)
    bright_w, dark_w = ink_maps(window, k)
    inner = np.s_[y0 - wy0 : y1 - wy0, x0 - wx0 : x1 - wx0]
    crop, ink = window[inner], (bright_w if region.bright else dark_w)[inner]
    top = float(np.percentile(ink, 99.5)) if ink.size else 0.0  # the region's strongest strokes print black
    pg = page(ink, policy.min_ink, max(policy.tophat_gain, 255.0 / max(top - policy.min_ink, 16.0)))
    height = min(region.line_px, _stroke_rows(ink, policy.min_ink, region.vertical) or region.line_px)
    scale = float(np.clip(policy.target_line_px / max(height, 1), 1.0, policy.max_upscale))
    words = ocr_words(pg, policy, scale, vertical=region.vertical)
    if policy.display_fallback and not any(
        w.conf >= policy.word["min_confidence"] and len(_norm(w.text)) >= policy.word["min_chars"] for w in words
    ):
        # nothing sure on the top-hat page (outlined or shadowed glyphs, strokes wider than the structure):
        # the displayed crop itself, text made dark, stretched between its 1st and 99.5th percentiles
        lo, hi = (float(v) for v in np.percentile(crop, (1, 99.5)))
        shown = np.clip((crop - lo) * (255.0 / max(hi - lo, 8.0)), 0, 255)
        words += ocr_words(
            (255 - shown if region.bright else shown).astype(np.uint8), policy, scale, vertical=region.vertical
        )
    shifted = [
        Word(w.text, w.conf, (w.box[0] + x0, w.box[1] + y0, w.box[2] + x0, w.box[3] + y0), w.vertical) for w in words
    ]
    return shifted, np.maximum(bright_w, dark_w), (wx0, wy0)


def _stroke_rows(ink: np.ndarray, floor: float, vertical: bool) -> int:
    """The median height (pixels) of the bands of consecutive rows (columns, for vertical text) holding
    strokes above ``floor``: the text height of a region where layout joined lines; 0 when none."""
    from etl.deid.text_regions import runs

    starts, ends = runs((ink >= floor).any(axis=0 if vertical else 1))
    lengths = ends - starts
    lengths = lengths[lengths >= 4]
    return int(np.median(lengths)) if lengths.size else 0


def read_lines(
    frame: np.ndarray,
    policy: TextPolicy,
    phi: PhiTokens,
    *,
    verify: bool = False,
    unread: list | None = None,
    blanked: np.ndarray | None = None,
    thresholding: int = 0,
    hints: list[Region] | None = None,
    layout: bool = True,
    words_read: list | None = None,
) -> list[TextLine]:
    """Text lines of one displayed frame (rows, cols uint8) that the policy calls text (allowed ones included,
    flagged): :func:`candidate_regions`, then :func:`read_region` on each; words join into lines
    (:func:`group_lines`), are classified (:func:`classify`), and each text line's box is grown along its
    reading direction over the stroke ink that continues it within the line height
    (:func:`extend_along_ink`), so words OCR did not read with confidence are covered too.

    With ``unread`` (a list), the box [x0, y0, x1, y1] (frame pixels) of each row of character-like glyphs
    (:func:`unreadable_row`) in a candidate region outside its text lines and outside ``blanked`` (rows, cols
    bool, pixels already blanked) is appended to it: text OCR could not read. ``thresholding``: the layout's
    binarisation (:func:`layout_lines`). ``hints``: regions read before the layout's own (the text lines found on
    the previous slice of the series, :mod:`etl.deid.series_text`), so a line the layout misses here is read.
    Without ``layout`` only the ``hints`` are read (a targeted read of regions found another way); ``words_read`` (a
    list) receives every word recognised in the regions, sure or not."""
    p_conf = policy.verify["phi_min_confidence"] if verify else policy.phi["min_confidence"]
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    lines: list[TextLine] = []
    for region in list(hints or []) + (candidate_regions(frame, policy, thresholding) if layout else []):
        words, ink, (rx0, ry0) = read_region(frame, region, policy)
        if words_read is not None:
            words_read.extend(words)
        kept = [
            w
            for w in words
            if _norm(w.text)
            and w.box[2] > w.box[0]
            and w.box[3] > w.box[1]
            and (w.conf >= policy.min_join_confidence or (w.conf >= p_conf and phi.matches(w.text, fuzzy)))
        ]
        found = [
            classify(ln, policy, phi, verify=verify)
            for ln in group_lines(kept, policy.join_gap, policy.max_height_ratio)
        ]
        if policy.second_look["enabled"]:
            found += _second_look(
                frame, region, [w for w in words if w not in kept and _norm(w.text)], found, policy, phi, verify
            )
        for ln in found:
            if ln.reason is None:
                continue
            if not ln.allowed:
                x0, y0, x1, y1 = ln.box
                local = (x0 - rx0, y0 - ry0, x1 - rx0, y1 - ry0)
                if not ln.vertical:  # vertical margin lines keep their OCR box (two lines written side by side)
                    local = tight_across(ink, local, False, policy)
                local = extend_along_ink(ink, local, ln.vertical, policy)
                ln.box = (local[0] + rx0, local[1] + ry0, local[2] + rx0, local[3] + ry0)
            ln.bright = region.bright
            lines.append(ln)
        if unread is not None and policy.unreadable["enabled"]:
            row = unreadable_row(frame, region, [ln.box for ln in found if ln.reason is not None], policy, blanked)
            if row is not None:
                unread.append(row)
    return _read_once(lines)


def _second_look(
    frame: np.ndarray,
    region: Region,
    unsure: list[Word],
    found: list[TextLine],
    policy: TextPolicy,
    phi: PhiTokens,
    verify: bool,
) -> list[TextLine]:
    """Text lines found by reading again, on their own, the words OCR read without confidence beside a text
    line (``second_look`` of the policy).

    A region laid out over a label block and the anatomy around it is recognised as one page; a short line
    of it (an age under a name, shadowed glyphs) can come out as low-confidence fragments ("p27"). Here the
    horizontal words of ``unsure`` (read in ``region`` of the displayed ``frame``, rows x cols uint8, under
    ``min_join_confidence``) that lie above or below a horizontal text line of ``found``, within ``within`` x
    its height and over its span, are grouped into lines (:func:`group_lines`), and each group's box, padded
    like a candidate line, is recognised as a region of its own (:func:`read_region`). Returns the new lines
    that :func:`classify` calls text (frame pixels)."""
    text = [ln for ln in found if ln.reason is not None and not ln.vertical]
    near = []
    for w in unsure:
        if w.vertical:
            continue
        x0, y0, x1, y1 = w.box
        for ln in text:
            lx0, ly0, lx1, ly1 = ln.box
            h = ln.height
            reach = float(policy.second_look["within"]) * h
            if min(x1, lx1 + h) > max(x0, lx0 - h) and (0 <= y0 - ly1 <= reach or 0 <= ly0 - y1 <= reach):
                near.append(w)
                break
    out = []
    rows, cols = frame.shape
    for grp in group_lines(near, policy.join_gap, policy.max_height_ratio):
        h = grp.height
        p = max(policy.pad_px, int(round(policy.pad_fraction * h)))
        x0, y0, x1, y1 = grp.box
        sub = Region(
            (max(0, x0 - p), max(0, y0 - p), min(cols, x1 + p), min(rows, y1 + p)),
            region.bright,
            max(policy.min_line_px, min(h, region.line_px)),
            False,
        )
        words, _, _ = read_region(frame, sub, policy)
        words = [w for w in words if _norm(w.text) and w.conf >= policy.min_join_confidence]
        out += [
            ln
            for ln in (
                classify(g, policy, phi, verify=verify)
                for g in group_lines(words, policy.join_gap, policy.max_height_ratio)
            )
            if ln.reason is not None
        ]
    return out


def _read_once(lines: list[TextLine]) -> list[TextLine]:
    """The lines without those read again, larger, on the other polarity's page: a text line whose words (each
    of 2 or more letters and digits) were all read in a smaller line of the other polarity that it overlaps is
    the same text seen through its negative space (the black top-hat of bright glyphs is their background), and
    its box grew over the ink around it; the smaller line covers the text."""

    def words(ln: TextLine) -> set[str]:
        return {t for t in (_norm(w.text) for w in ln.words) if len(t) >= 2}

    def area(b: tuple[int, int, int, int]) -> int:
        return max(0, b[2] - b[0]) * max(0, b[3] - b[1])

    def overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
        return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])

    read = [words(ln) for ln in lines]
    keep = []
    for ln, own in zip(lines, read):
        twice = (
            ln.reason is not None
            and not ln.allowed
            and bool(own)
            and any(
                m is not ln
                and m.reason is not None
                and m.bright != ln.bright
                and m.vertical == ln.vertical
                and area(m.box) < area(ln.box)
                and overlap(m.box, ln.box)
                and own <= theirs
                for m, theirs in zip(lines, read)
            )
        )
        if not twice:
            keep.append(ln)
    return keep


def unreadable_row(
    frame: np.ndarray,
    region: Region,
    text_boxes: list[tuple[int, int, int, int]],
    policy: TextPolicy,
    blanked: np.ndarray | None = None,
) -> tuple[int, int, int, int] | None:
    """A row of character-like glyphs (:func:`etl.deid.text_regions.glyph_row`, thresholds ``unreadable`` of
    the policy) in one candidate region of a displayed frame (rows, cols uint8), on the top-hat of the
    region's polarity (structure ``max(tophat_px, 0.8 x line height)``), with the boxes of its text lines
    (read, blanked or allowed) and the pixels of ``blanked`` (rows, cols bool, grown by 2 px: a blank edge is
    no glyph) left out. Returns its box [x0, y0, x1, y1] in frame pixels, or None."""
    from scipy import ndimage as ndi

    from etl.deid.text_regions import glyph_row, ink_maps

    x0, y0, x1, y1 = region.box
    if x1 - x0 < 3 or y1 - y0 < 3:
        return None
    k = max(policy.tophat_px, int(round(0.8 * region.line_px)) | 1)
    b, d = ink_maps(frame[y0:y1, x0:x1].astype(np.float32), k)
    ink = b if region.bright else d
    for bx0, by0, bx1, by1 in text_boxes:
        ink[max(0, by0 - y0) : max(0, by1 - y0), max(0, bx0 - x0) : max(0, bx1 - x0)] = 0
    if blanked is not None and blanked[y0:y1, x0:x1].any():
        ink[ndi.binary_dilation(blanked[y0:y1, x0:x1], iterations=2)] = 0
    u = policy.unreadable
    if region.vertical:
        ink = np.ascontiguousarray(np.rot90(ink, -1))  # bottom-to-top text read left to right
    row = glyph_row(
        ink,
        policy.min_ink,
        min_px=int(u["min_glyph_px"]),
        max_px=int(u["max_glyph_px"]),
        min_glyphs=int(u["min_glyphs"]),
        height_ratio=float(u["height_ratio"]),
        baseline_tol=float(u["baseline_tol"]),
        max_gap=float(u["max_gap"]),
        max_stroke=float(u["max_stroke"]),
        min_fill=float(u["min_fill"]),
        max_fill=float(u["max_fill"]),
    )
    if row is None:
        return None
    rx0, ry0, rx1, ry1 = row
    if region.vertical:  # turned clockwise: (r', c') = (c, rows - 1 - r)
        h = y1 - y0
        rx0, ry0, rx1, ry1 = ry0, h - rx1, ry1, h - rx0
    return (rx0 + x0, ry0 + y0, rx1 + x0, ry1 + y0)


def bridges(lines: list[TextLine], rows: int, cols: int, policy: TextPolicy) -> list[tuple[int, int, int, int]]:
    """Boxes [x0, y0, x1, y1] (frame pixels) over a line of a label block that OCR did not read: two horizontal
    text lines of one frame, heights within ``max_height_ratio``, one above the other and overlapping along by
    ``min_overlap`` of the shorter or more, with room for one line between them (a gap of ``min_gap`` to
    ``max_gap`` x their height; ``bridge`` in the policy): the rows between them over their common span, grown
    by the line margin (:func:`grown`). A shadowed age between a name and a date is blanked so; tight blanks
    (:func:`etl.deid.text_regions.trim_to_ink`) shrink the box to what holds strokes."""
    b = policy.bridge
    if not b["enabled"]:
        return []
    flat = [ln for ln in lines if ln.reason is not None and not ln.allowed and not ln.vertical]
    out: list[tuple[int, int, int, int]] = []
    for i, p in enumerate(flat):
        for q in flat[i + 1 :]:
            hp, hq = p.height, q.height
            if max(hp, hq) > policy.max_height_ratio * max(1, min(hp, hq)):
                continue
            top, low = (p.box, q.box) if p.box[1] < q.box[1] else (q.box, p.box)
            x0, x1 = max(top[0], low[0]), min(top[2], low[2])
            h = max(hp, hq)
            if x1 - x0 < b["min_overlap"] * min(top[2] - top[0], low[2] - low[0]):
                continue
            if b["min_gap"] * h <= low[1] - top[3] <= b["max_gap"] * h:
                out.append(grown((x0, top[3], x1, low[1]), h, policy, rows, cols))
    return out


def along_ink(frame: np.ndarray, box: tuple[int, int, int, int], policy: TextPolicy) -> tuple[int, int, int, int]:
    """A horizontal glyph row ``box`` [x0, y0, x1, y1] of a displayed frame (rows, cols uint8) grown along the
    stroke ink of either polarity (top-hats, structure ``tophat_px``) that continues it (:func:`extend_along_ink`,
    within ``extend_max`` x its height), so the words the row did not reach are blanked with it."""
    from etl.deid.text_regions import ink_maps

    rows, cols = frame.shape
    x0, y0, x1, y1 = box
    reach = int(policy.extend_max * (y1 - y0))
    wx0, wx1 = max(0, x0 - reach), min(cols, x1 + reach)
    b, d = ink_maps(frame[y0:y1, wx0:wx1].astype(np.float32), policy.tophat_px)
    lx0, _, lx1, _ = extend_along_ink(np.maximum(b, d), (x0 - wx0, 0, x1 - wx0, y1 - y0), False, policy)
    return (lx0 + wx0, y0, lx1 + wx0, y1)


def in_margin(box: tuple[int, int, int, int], rows: int, cols: int, band: float) -> bool:
    """True when ``box`` [x0, y0, x1, y1] lies wholly in the outer ``band`` share of the image on one side
    (top, bottom, left or right strip), where labels are written, not anatomy."""
    x0, y0, x1, y1 = box
    return x1 <= band * cols or x0 >= (1 - band) * cols or y1 <= band * rows or y0 >= (1 - band) * rows


def tight_across(
    ink: np.ndarray, box: tuple[int, int, int, int], vertical: bool, policy: TextPolicy
) -> tuple[int, int, int, int]:
    """A line box no taller than its strokes: when it holds one glyph band and is more than ``max_line_growth`` x
    its height (a run of 4 or more rows holding strokes, pixels of at least half the 99th percentile of the box's
    ``ink``, the top-hat stroke contrast, rows x cols; columns for vertical text), its edges across the reading
    direction move in to the band widened by half of ``max_line_growth - 1`` x its height each side (the
    ascenders and descenders around the x-height band of mixed-case text). A row holds strokes when a quarter of the
    densest row's stroke pixels or more lie on it (text is dense along its line; anatomy texture is not). OCR word boxes
    can be much taller than the text (a backdrop box, anatomy read with it); the blank then follows the glyphs. ``box``
    [x0, y0, x1, y1] in ``ink`` pixels."""
    x0, y0, x1, y1 = box
    inside = ink[y0:y1, x0:x1]
    if inside.size == 0:
        return box
    thr = max(policy.min_ink, 0.5 * float(np.percentile(inside, 99)))
    counts = (inside >= thr).sum(axis=0 if vertical else 1)
    prof = counts >= max(2, 0.25 * int(counts.max()))  # rows dense with strokes along the line, not anatomy
    from etl.deid.text_regions import runs

    starts, ends = runs(prof)
    keep = (ends - starts) >= 4
    if not keep.any():
        return box
    starts, ends = starts[keep], ends[keep]
    across = (x1 - x0) if vertical else (y1 - y0)
    if len(starts) > 1 or across <= policy.max_line_growth * float(ends[0] - starts[0]):
        return box  # several bands (stacked lines, split glyphs): the edges are left to uncut()
    lo, hi = int(starts[0]), int(ends[-1])
    # the dense band of mixed-case text is its x-height: ascenders and descenders reach ~0.3 of it either side
    pad = int(np.ceil(0.5 * (policy.max_line_growth - 1.0) * (hi - lo)))
    lo, hi = max(0, lo - pad), min(across, hi + pad)
    return (x0 + lo, y0, x0 + hi, y1) if vertical else (x0, y0 + lo, x1, y0 + hi)


def extend_along_ink(
    ink: np.ndarray, box: tuple[int, int, int, int], vertical: bool, policy: TextPolicy, reach: float | None = None
) -> tuple[int, int, int, int]:
    """Grow a line box along its reading direction while stroke ink continues it.

    ``ink`` (rows, cols uint8) is the top-hat stroke contrast; a column (row, for vertical text) of the line's
    band holds ink when a pixel there reaches half the 90th percentile of the ink inside the box. The box grows
    over ink with gaps up to ``extend_gap`` x the line height, at most ``extend_max`` x the height per side.
    """
    x0, y0, x1, y1 = box
    band = ink[y0:y1, :] if not vertical else ink[:, x0:x1].T
    lo, hi = (x0, x1) if not vertical else (y0, y1)
    inside = band[:, lo:hi]
    if inside.size == 0:
        return box
    thr = max(policy.min_ink, 0.5 * float(np.percentile(inside, 90)))
    has = (band >= thr).any(axis=0)
    h = band.shape[0]
    gap_max, reach = max(2, int(policy.extend_gap * h)), int((policy.extend_max if reach is None else reach) * h)
    new_hi, gap, i = hi, 0, hi
    while i < min(len(has), hi + reach):
        gap = 0 if has[i] else gap + 1
        if gap > gap_max:
            break
        if has[i]:
            new_hi = i + 1
        i += 1
    new_lo, gap, i = lo, 0, lo - 1
    while i >= max(0, lo - reach):
        gap = 0 if has[i] else gap + 1
        if gap > gap_max:
            break
        if has[i]:
            new_lo = i
        i -= 1
    return (new_lo, y0, new_hi, y1) if not vertical else (x0, new_lo, x1, new_hi)


def grown(
    box: tuple[int, int, int, int], height: int, policy: TextPolicy, rows: int, cols: int
) -> tuple[int, int, int, int]:
    """A line box grown by the policy margin, clipped to the image."""
    m = max(policy.margin_px, int(round(policy.margin_fraction * height)))
    x0, y0, x1, y1 = box
    return max(0, x0 - m), max(0, y0 - m), min(cols, x1 + m), min(rows, y1 + m)


def uncut(
    frame: np.ndarray, box: tuple[int, int, int, int], height: int, vertical: bool, bright: bool, policy: TextPolicy
) -> tuple[int, int, int, int]:
    """A blank box whose edges across the reading direction do not cut through strokes.

    A margin that ends inside a neighbouring line (stacked lines of a label block, parallel lines written in a
    margin) would leave that line's glyphs cut in half: unreadable to the verifying OCR, still readable to a
    person. Each of the two edges (top / bottom; left / right for vertical text) moves outward while the
    pixel line just outside it holds stroke ink (top-hat of the line's polarity, structure ``tophat_px``) as
    strong as the line's own strokes (half their 99th percentile, at least ``min_ink``) over 8% of the box's
    length or more, at most ``1.5 x height`` per side; an edge that moved gets the line margin
    (:func:`grown`) again. ``frame`` (rows, cols uint8) is
    the displayed frame, ``box`` [x0, y0, x1, y1] and ``height`` in its pixels. Returns the box (clipped).
    """
    from etl.deid.text_regions import ink_maps

    rows, cols = frame.shape
    x0, y0, x1, y1 = box
    reach = int(1.5 * height) + 1
    wx0, wy0 = (max(0, x0 - reach), y0) if vertical else (x0, max(0, y0 - reach))
    wx1, wy1 = (min(cols, x1 + reach), y1) if vertical else (x1, min(rows, y1 + reach))
    if wx1 <= wx0 or wy1 <= wy0:
        return box
    b, d = ink_maps(frame[wy0:wy1, wx0:wx1].astype(np.float32), policy.tophat_px)
    strokes = (b if bright else d).T if vertical else (b if bright else d)  # (across, along)
    lo, hi = ((x0 - wx0), (x1 - wx0)) if vertical else ((y0 - wy0), (y1 - wy0))
    own = strokes[lo:hi]
    thr = max(policy.min_ink, 0.5 * float(np.percentile(own, 99))) if own.size else policy.min_ink
    need = max(2, int(0.08 * strokes.shape[1]))
    lines = strokes >= thr
    lo0, hi0 = lo, hi
    while lo > 0 and int(lines[lo - 1].sum()) >= need:
        lo -= 1
    while hi < lines.shape[0] and int(lines[hi].sum()) >= need:
        hi += 1
    m = max(policy.margin_px, int(round(policy.margin_fraction * height)))  # a moved edge gets the margin again
    lo, hi = (max(0, lo - m) if lo < lo0 else lo), (min(lines.shape[0], hi + m) if hi > hi0 else hi)
    return (lo + wx0, y0, hi + wx0, y1) if vertical else (x0, lo + wy0, x1, hi + wy0)


# ---- the step --------------------------------------------------------------------------------------------


@dataclass
class TextCleaning:
    """What the burned-in text step did to one object.

    ``regions``: blanked boxes, each {"frame": int or "all", "box": [x0, y0, x1, y1], "reason": phi|word|line|
    unreadable|bridge} (tight boxes when they verified, see ``trim`` in the policy);
    ``kept_markers``: allow-listed marker lines left in place; ``frames_read``: frames (or composites) read;
    ``pixels_blanked``: pixels set to the fill value (all frames); ``too_small``: fewer than ``min_side_px``
    rows or columns, so no line of legible text fits (nothing read); ``lines``: the text lines blanked, as
    regions to read first on the next slice of the series (``hints`` of :func:`clean_text`).
    """

    regions: list[dict] = field(default_factory=list)
    kept_markers: int = 0
    frames_read: int = 0
    pixels_blanked: int = 0
    too_small: bool = False
    lines: list[Region] = field(default_factory=list)

    @property
    def blanked(self) -> bool:
        """True when any region was blanked."""
        return bool(self.regions)


def _frames_to_read(disp: np.ndarray, policy: TextPolicy) -> list[tuple[Any, np.ndarray]]:
    n = disp.shape[0]
    if n <= policy.max_frames_each:
        return [(i if n > 1 else 0, disp[i]) for i in range(n)]
    picks = np.linspace(0, n - 1, policy.sample_frames).round().astype(int)
    out: list[tuple[Any, np.ndarray]] = [
        ("all", disp.max(axis=0)),
        ("all", disp.min(axis=0)),
        ("all", np.median(disp, axis=0).astype(np.uint8)),
    ]
    return out + [("all", disp[int(i)]) for i in sorted(set(picks.tolist()))]


def fill_value(arr: np.ndarray, photometric: str) -> Any:
    """The stored value that displays black: the minimum (maximum for MONOCHROME1) of the stored values; 0 for
    colour."""
    if arr.ndim == 4 or photometric in ("RGB", "PALETTE COLOR") or photometric.startswith("YBR"):
        return 0
    return arr.max() if photometric == "MONOCHROME1" else arr.min()


def clean_text(
    ds, policy: TextPolicy | None = None, phi: PhiTokens | None = None, hints: list[Region] | None = None
) -> TextCleaning:
    """Find, blank and verify burned-in text in every frame of ``ds`` (modified in place when text is blanked:
    PixelData re-encoded uncompressed, BurnedInAnnotation NO).

    Parameters
    ----------
    ds : pydicom.Dataset
        the source instance with pixel data (before its header is de-identified).
    policy : TextPolicy, optional
        default :func:`load_text_policy`.
    phi : PhiTokens, optional
        header PHI tokens; default read from ``ds``.
    hints : list of Region, optional
        regions read first on every frame (frame pixels; the text lines of the previous slice of the series,
        :mod:`etl.deid.series_text`); regions outside the frame are clipped.

    Returns
    -------
    TextCleaning

    Raises
    ------
    BurnedInTextError
        ``ocr_unavailable``; ``pixel_cleaning_failed`` (pixels that cannot be decoded, larger than
        ``max_pixels``); ``burned_in_text_remaining`` (text still read after blanking, or a header PHI value
        read by the PHI sweep);
        ``burned_in_text_unreadable`` (a row of character-like glyphs OCR cannot read, not in the margin).
    """
    policy = policy or load_text_policy()
    phi = phi if phi is not None else header_phi(ds, policy)
    problem = ocr_available()
    if problem:
        raise BurnedInTextError("ocr_unavailable", problem)
    rows, cols = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    frames = int(_first(ds.get("NumberOfFrames", 1) or 1)) if str(ds.get("NumberOfFrames", "1")).strip() else 1
    if rows * cols * max(frames, 1) > policy.max_pixels:
        raise BurnedInTextError("pixel_cleaning_failed", "the image is too large to be read for burned-in text")
    from etl.pixels.decode import NormalisationError

    try:
        arr = _decode(ds)
    except NormalisationError:
        raise  # the decoder's own reason (sizes, crashes): the caller quarantines with it
    except Exception as err:  # noqa: BLE001  any decoder failure: the text cannot be checked
        raise BurnedInTextError(
            "pixel_cleaning_failed", f"cannot decode pixels to read burned-in text: {type(err).__name__}"
        ) from None
    photometric = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    color = int(ds.get("SamplesPerPixel", 1) or 1) > 1
    stacked = arr if (frames > 1 and arr.ndim == (4 if color else 3)) else arr[None]
    out = TextCleaning()
    if min(stacked.shape[1], stacked.shape[2]) < policy.min_side_px:
        out.too_small = True  # no line of the smallest legible text fits: checked, nothing to read
        return out
    disp = display_frames(ds, stacked)
    todo = _frames_to_read(disp, policy)
    out.frames_read = len(todo)
    n, h, w = stacked.shape[:3]
    boxes: list[
        tuple[Any, tuple[int, int, int, int], str, np.ndarray, bool]
    ] = []  # label, box, reason, frame, vertical
    values: list[tuple[int, int] | None] = []  # per box: (stroke value, line height) of its line, or None
    band = float(policy.unreadable["margin_band"])
    pending: list[tuple[Any, tuple[int, int, int, int]]] = []
    hints = [_clipped(r, h, w) for r in hints or []]
    hints = [r for r in hints if r.box[2] > r.box[0] and r.box[3] > r.box[1]]
    for label, frame in todo:
        unread: list = []
        found = read_lines(frame, policy, phi, unread=unread, hints=hints)
        for box in bridges(found, h, w, policy):
            boxes.append((label, box, "bridge", frame, False))
            values.append(None)
        for ln in found:
            if ln.allowed:
                out.kept_markers += 1
                continue
            box = grown(ln.box, ln.height, policy, h, w)
            if ln.height <= policy.max_line_px:  # a line of legible text, not a "line" OCR drew over anatomy
                box = uncut(frame, box, ln.height, ln.vertical, ln.bright, policy)
            boxes.append((label, box, ln.reason or "word", frame, ln.vertical))
            values.append(_line_value(stacked, label, ln.box, frame, ln.height, policy))
            p = max(policy.pad_px, int(round(policy.pad_fraction * ln.height)))
            out.lines.append(
                _clipped(
                    Region(
                        (ln.box[0] - p, ln.box[1] - p, ln.box[2] + p, ln.box[3] + p),
                        ln.bright,
                        max(1, ln.height),
                        ln.vertical,
                    ),
                    h,
                    w,
                )
            )
        for row in unread:  # glyphs OCR cannot read: blanked in the image margin, else the verify pass decides
            if in_margin(row, h, w, band):
                rh = row[3] - row[1]
                row = along_ink(frame, row, policy)
                boxes.append(
                    (
                        label,
                        uncut(frame, grown(row, rh, policy, h, w), rh, False, True, policy),
                        "unreadable",
                        frame,
                        False,
                    )
                )
                values.append(None)
            else:
                pending.append((label, row))
    if not boxes:
        if pending:  # nothing blanked, so no verify pass: the unread rows stand as they were found
            _raise_unreadable(*pending[0])
        _phi_sweep(ds, stacked, np.zeros((n, h, w), bool), todo, policy, phi)  # no text found: PHI still is
        return out
    from etl.deid.text_regions import trim_to_ink

    wide = [
        (label, _over_value(stacked, label, box, vertical, lv, policy), reason)
        for (label, box, reason, _, vertical), lv in zip(boxes, values)
    ]
    cleaned, mask = _blank_and_verify(ds, stacked, wide, todo, photometric, policy, phi)  # fail closed here
    chosen = wide
    if policy.trim["enabled"]:  # the same lines blanked tight to their strokes, kept when they verify too
        t = policy.trim
        tight = [
            (label, _over_value(stacked, label, box2, vertical, lv, policy), reason)
            for (label, box, reason, frame, vertical), lv in zip(boxes, values)
            for box2 in trim_to_ink(
                frame,
                box,
                policy.tophat_px,
                float(t["floor"]),
                float(t["share"]),
                int(t["margin_px"]),
                vertical=vertical,
                along_share=float(t["along_share"]),
            )
        ]
        if tight != wide:
            try:
                cleaned, mask = _blank_and_verify(ds, stacked, tight, todo, photometric, policy, phi)
                chosen = tight
            except BurnedInTextError:
                pass  # text read after the tight blanks: the wide ones stand
    _phi_sweep(ds, cleaned, mask, todo, policy, phi)  # fail closed: raises on header PHI still read
    for label, (x0, y0, x1, y1), reason in chosen:
        out.regions.append({"frame": label, "box": [x0, y0, x1, y1], "reason": reason})
    out.pixels_blanked = int(mask.sum())
    _write_pixels(ds, cleaned if frames > 1 else cleaned[0], photometric)
    ds.BurnedInAnnotation = "NO"
    return out


def _clipped(region: Region, rows: int, cols: int) -> Region:
    """``region`` with its box clipped to a frame of ``rows`` x ``cols``."""
    x0, y0, x1, y1 = region.box
    return Region(
        (max(0, x0), max(0, y0), min(cols, x1), min(rows, y1)), region.bright, region.line_px, region.vertical
    )


def _line_value(
    stacked: np.ndarray, label: Any, box: tuple[int, int, int, int], frame: np.ndarray, height: int, policy: TextPolicy
) -> tuple[int, int] | None:
    """(stroke value, line height) of one text line of a single grey frame (``value`` of the policy,
    :func:`etl.deid.text_regions.stroke_value`), or None (off, colour, a composite of many frames, no value)."""
    from etl.deid.text_regions import stroke_value

    v = policy.value
    if not v["enabled"] or label == "all" or stacked.ndim != 3:
        return None
    found = stroke_value(
        stacked[int(label)],
        frame,
        box,
        policy.tophat_px,
        min_mode_share=float(v["min_mode_share"]),
        max_frame_share=float(v["max_frame_share"]),
    )
    return None if found is None else (found, height)


def _over_value(
    stacked: np.ndarray,
    label: Any,
    box: tuple[int, int, int, int],
    vertical: bool,
    lv: tuple[int, int] | None,
    policy: TextPolicy,
) -> tuple[int, int, int, int]:
    """``box`` grown over its line's stroke value (:func:`etl.deid.text_regions.extend_over_value`)."""
    if lv is None:
        return box
    from etl.deid.text_regions import extend_over_value

    return extend_over_value(
        stacked[int(label)],
        box,
        lv[0],
        lv[1],
        vertical=vertical,
        gap=policy.extend_gap,
        reach=policy.extend_max,
        margin=int(policy.value["margin_px"]),
    )


def _blank_and_verify(
    ds,
    stacked: np.ndarray,
    boxes: list[tuple[Any, tuple[int, int, int, int], str]],
    todo: list[tuple[Any, np.ndarray]],
    photometric: str,
    policy: TextPolicy,
    phi: PhiTokens,
) -> tuple[np.ndarray, np.ndarray]:
    """Blank ``boxes`` (frame label, [x0, y0, x1, y1], reason) in a copy of ``stacked`` (frames, rows, cols[, 3]
    stored values) with :func:`fill_value` and read the cleaned frames again (the frames or composites of
    ``todo``). Returns (cleaned stored values, blanked mask (frames, rows, cols) bool).

    Raises
    ------
    BurnedInTextError
        ``burned_in_text_remaining`` (a text line still read, verify thresholds), ``burned_in_text_unreadable``
        (a row of glyphs OCR cannot read left outside the blanks).
    """
    n, h, w = stacked.shape[:3]
    cleaned = np.array(stacked, copy=True)
    mask = np.zeros((n, h, w), dtype=bool)
    for label, (x0, y0, x1, y1), _ in boxes:
        sel = slice(None) if label == "all" else slice(int(label), int(label) + 1)
        mask[sel, y0:y1, x0:x1] = True
    cleaned[mask] = fill_value(stacked, photometric)
    disp2 = display_frames(ds, cleaned)
    for (label, frame), fmask in zip(_frames_to_read(disp2, policy), _frame_masks(mask, todo)):
        unread: list = []
        left = [
            ln for ln in read_lines(frame, policy, phi, verify=True, unread=unread, blanked=fmask) if not ln.allowed
        ]
        if left:
            raise BurnedInTextError(
                "burned_in_text_remaining",
                f"{len(left)} text region(s) still read after blanking "
                f"({', '.join(sorted({ln.reason or '' for ln in left}))})",
            ).with_preview(
                _text_preview(label, frame, [ln.box for ln in left], [b for lb, b, _ in boxes if lb in ("all", label)])
            )
        if unread:
            _raise_unreadable(label, unread[0])
    return cleaned, mask


def _phi_sweep(
    ds, cleaned: np.ndarray, mask: np.ndarray, todo: list[tuple[Any, np.ndarray]], policy: TextPolicy, phi: PhiTokens
) -> None:
    """Read the frames that ship once more, laid out with Leptonica's tiled adaptive Otsu threshold
    (``verify.phi_sweep_thresholding``), and fail closed on any header PHI value found (``verify`` thresholds).
    Run on every image read: after blanking, and where the first read found no text at all (low-contrast
    corner text whose layout a little noise tips over).

    Tesseract lays a page out after one global (Otsu) threshold, so a faint line beside strong ones (a
    half-contrast ID on the page of a full-contrast name) is never a candidate, in the first read or in the
    verifying one. Tiled thresholds find it, and also the remnants of blanked lines and the edges of anatomy,
    so only a PHI value counts here. ``cleaned`` (frames, rows, cols[, 3]) stored values that ship,
    ``mask`` (frames, rows, cols) bool the blanked pixels, ``todo`` the frames or composites read.

    Raises
    ------
    BurnedInTextError
        ``burned_in_text_remaining`` naming the frame (never the text).
    """
    method = int(policy.verify.get("phi_sweep_thresholding", 0) or 0)
    if not method:
        return
    frames = _frames_to_read(display_frames(ds, cleaned), policy) if mask.any() else todo  # nothing blanked: as read
    for (label, frame), fmask in zip(frames, _frame_masks(mask, todo)):
        found = [
            ln.box
            for ln in read_lines(frame, policy, phi, verify=True, blanked=fmask, thresholding=method)
            if ln.reason == "phi" and not ln.allowed
        ]
        if found:
            raise BurnedInTextError(
                "burned_in_text_remaining", f"header PHI still read after blanking in frame {label} (adaptive layout)"
            ).with_preview(_text_preview(label, frame, found, _mask_boxes(fmask)))


def _text_preview(label: Any, frame: np.ndarray, failed: list, blanked: list):
    """A :class:`etl.deid.preview.Preview` of one frame read (rows, cols uint8 as displayed after blanking) with
    the ``failed`` line boxes and the ``blanked`` boxes, each (x0, y0, x1, y1)."""
    from etl.deid.preview import Preview, PreviewView

    def boxes(items: list) -> list[tuple[int, int, int, int]]:
        return [(int(b[0]), int(b[1]), int(b[2]), int(b[3])) for b in items]

    name = "composite of frames" if label == "all" else f"frame {label}"
    return Preview([PreviewView(name, np.asarray(frame, np.uint8), boxes(failed), boxes(blanked))])


def _mask_boxes(mask: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Bounding boxes (x0, y0, x1, y1) of the connected blanked areas of one frame mask (rows, cols bool)."""
    from scipy import ndimage

    if not mask.any():
        return []
    labels, _ = ndimage.label(mask)
    return [(s[1].start, s[0].start, s[1].stop, s[0].stop) for s in ndimage.find_objects(labels) if s is not None]


def _raise_unreadable(label: Any, box: tuple[int, int, int, int]) -> None:
    """Fail closed on a row of glyphs OCR could not read (``burned_in_text_unreadable``, naming frame and box)."""
    raise BurnedInTextError(
        "burned_in_text_unreadable",
        f"frame {label}: a row of character-like glyphs at box {list(box)} that OCR cannot read with confidence "
        "was not blanked",
    )


def _frame_masks(mask: np.ndarray, todo: list[tuple[Any, np.ndarray]]) -> list[np.ndarray]:
    """The blanked pixels (rows, cols bool) of each frame or composite read, in the order of ``todo``."""
    return [mask.any(axis=0) if label == "all" else mask[int(label)] for label, _ in todo]


def _decode(ds, view_only: bool = False) -> np.ndarray:
    """``ds.pixel_array``; a dataset without File Meta Information (no preamble, no group 0002) is decoded with
    the transfer syntax it was read with, as normalisation does (:func:`etl.pixels.decode.transfer_syntax`). With
    ``view_only`` the array may be a read-only view of the pixel data (for a caller that only reads it)."""
    meta = getattr(ds, "file_meta", None)
    from etl.pixels.contained import pixel_array  # bounded, compressed syntaxes in the decoder worker

    if meta is not None and meta.get("TransferSyntaxUID"):
        return pixel_array(ds, view_only)
    from pydicom.dataset import FileMetaDataset

    from etl.pixels.decode import transfer_syntax

    ts = transfer_syntax(ds)
    had = meta is not None
    if not had:
        ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ts
    try:
        return pixel_array(ds, view_only)
    finally:  # the header is left as it was read: de-identification writes the file meta
        del ds.file_meta.TransferSyntaxUID
        if not had:
            del ds.file_meta


def _write_pixels(ds, arr: np.ndarray, photometric: str) -> None:
    """Store cleaned pixels uncompressed (Explicit VR Little Endian; a big-endian file keeps its syntax), keeping
    BitsStored and the colour model (YBR decoded to RGB by pydicom is written as RGB)."""
    ts = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if ts is not None and ts.is_transfer_syntax and not ts.is_little_endian:
        # Explicit VR Big Endian (retired, native): pydicom writes no pixels there; stored as they were read,
        # each value big-endian, colour interleaved or planar as PlanarConfiguration says
        out = arr
        if int(ds.get("SamplesPerPixel", 1) or 1) > 1 and int(ds.get("PlanarConfiguration", 0) or 0) == 1:
            out = np.moveaxis(arr, -1, -3)
        ds.PixelData = np.ascontiguousarray(out).astype(out.dtype.newbyteorder(">")).tobytes()
        return
    if photometric.startswith("YBR"):
        photometric = "RGB"
    if photometric == "PALETTE COLOR":
        ds.set_pixel_data(arr, "PALETTE COLOR", int(ds.BitsStored), generate_instance_uid=False)
        return
    ds.set_pixel_data(arr, photometric, int(ds.BitsStored), generate_instance_uid=False)
