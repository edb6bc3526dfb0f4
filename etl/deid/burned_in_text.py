"""Burned-in text in pixels: find text with Tesseract OCR in every 2D image and frame, blank it, verify after.

Policy as data: ``schemas/deid/burned_in_text.yaml`` (views, resolution, confidence thresholds, allow-list,
margins, verification). The steps, per frame of an object with pixels:

1. the displayed image (:func:`display_frames`): VOI window (first WindowCenter/WindowWidth, else the 0.5-99.5
   percentile window), MONOCHROME1 inverted, colour as luminance, 8-bit;
2. views of it (:func:`views`): white and black morphological top-hats (thin strokes on their local background:
   low-contrast text and text on bright anatomy) and the display itself, each as dark text on a light page,
   read at a resolution where 9 px text is about 18 px (small images upscaled, large ones capped), some also
   turned 90 degrees for text written bottom to top;
3. Tesseract (PSM 11, sparse text) reads every view; words of one orientation join into lines
   (:func:`group_lines`); a line is text when one word is sure enough, when its words together are, or when a
   word equals a header PHI token (:class:`PhiTokens`: name parts in any order, IDs, accession, dates in any
   format, times, age, institution words; one edit allowed on long tokens);
4. a text line whose words are all allow-listed clinical markers (L, R, PA, PORTABLE, ...) stays, unless a
   word is PHI; every other text line is blanked (the line box grown by a margin) with the value that
   displays black;
5. verification: the cleaned image is read again; any line that still passes the ``verify`` thresholds, or any
   PHI word, raises ``burned_in_text_remaining`` (the file is quarantined).

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
TESSDATA_DIRS = ("/usr/share/tesseract-ocr/5/tessdata", "/usr/share/tesseract-ocr/4.00/tessdata",
                 "/usr/share/tessdata", "/usr/local/share/tessdata")
_MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()


class BurnedInTextError(ReasonCodedError):
    """Burned-in text that cannot be handled with certainty; ``reason`` is a reason code, no value is quoted."""

    message_format = "{message}"


# ---- policy ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TextPolicy:
    """``schemas/deid/burned_in_text.yaml`` as read (see the file for each field's meaning)."""

    version: str
    language: str
    psm: int
    views: tuple[str, ...]
    rotated_views: tuple[str, ...]
    tophat_px: int
    tophat_gain: float
    upscale_below_px: int
    upscale: float
    max_side_px: int
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

    def scale_for(self, rows: int, cols: int) -> float:
        """The factor an image of rows x cols pixels is read at."""
        long = max(rows, cols)
        if long < self.upscale_below_px:
            return self.upscale
        return min(1.0, self.max_side_px / long)


_VIEWS = {"tophat_bright", "tophat_dark", "display", "display_inverted"}


@lru_cache(maxsize=4)
def load_text_policy(path: str | None = None) -> TextPolicy:
    """Read the burned-in text policy (default ``schemas/deid/burned_in_text.yaml``).

    Raises
    ------
    BurnedInTextError
        ``invalid_text_policy`` for an unknown view or a missing field.
    """
    data = yaml.safe_load(Path(path or TEXT_POLICY_FILE).read_text(encoding="utf-8"))
    try:
        views = tuple(data["views"])
        rotated = tuple(data.get("rotated_views") or ())
        if not set(views) | set(rotated) <= _VIEWS:
            raise KeyError("views")
        return TextPolicy(
            version=str(data["version"]), language=str(data["language"]), psm=int(data["page_segmentation_mode"]),
            views=views, rotated_views=rotated, tophat_px=int(data["tophat_px"]),
            tophat_gain=float(data["tophat_gain"]), upscale_below_px=int(data["upscale_below_px"]),
            upscale=float(data["upscale"]), max_side_px=int(data["max_side_px"]), min_side_px=int(data["min_side_px"]),
            max_frames_each=int(data["max_frames_each"]), sample_frames=int(data["sample_frames"]),
            max_pixels=int(data["max_pixels"]), word=dict(data["word"]), line=dict(data["line"]),
            phi=dict(data["phi"]), join_gap=float(data["join_gap"]),
            extend_gap=float(data["extend_gap"]), extend_max=float(data["extend_max"]),
            max_height_ratio=float(data["max_height_ratio"]), min_join_confidence=float(data["min_join_confidence"]),
            margin_px=int(data["margin_px"]),
            margin_fraction=float(data["margin_fraction"]),
            allow_list=frozenset(_norm(w) for w in data["allow_list"]), verify=dict(data["verify"]))
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
        return ("Tesseract's English language data (eng.traineddata, Debian package tesseract-ocr-eng) is not "
                "installed: run `make tools`")
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

            api = tesserocr.PyTessBaseAPI(path=tessdata_dir(), lang=policy.language,
                                          psm=policy.psm)
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
    """Words of one 8-bit page (rows, cols; dark text on light) read at ``scale``; boxes in ``page`` pixels.

    With ``vertical`` the page is read turned 90 degrees clockwise (text written bottom to top becomes
    horizontal) and the boxes are mapped back.
    """
    import tesserocr
    from PIL import Image

    rows, cols = page.shape
    img = np.ascontiguousarray(np.rot90(page, -1)) if vertical else page
    im = Image.fromarray(img)
    if scale != 1.0:
        im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))),
                       Image.Resampling.BICUBIC if scale > 1 else Image.Resampling.BOX)
    api = _Engine.api(policy)
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
        x0, y0, x1, y1 = (int(np.floor(bb[0] / scale)), int(np.floor(bb[1] / scale)),
                          int(np.ceil(bb[2] / scale)), int(np.ceil(bb[3] / scale)))
        if vertical:  # turned clockwise: (r', c') = (c, rows - 1 - r)
            x0, y0, x1, y1 = y0, rows - x1, y1, rows - x0
        out.append(Word(text.strip(), conf, (max(0, x0), max(0, y0), min(cols, x1), min(rows, y1)), vertical))
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
        lo, hi = (float(v) for v in np.percentile(x, (0.5, 99.5)))
    if hi <= lo:
        lo, hi = float(x.min()), float(x.max())
    unit = np.clip((x - lo) / max(hi - lo, 1e-6), 0, 1)
    if photometric == "MONOCHROME1":
        unit = 1.0 - unit
    return np.rint(unit * 255).astype(np.uint8)


def views(frame: np.ndarray, policy: TextPolicy) -> dict[str, np.ndarray]:
    """The pages Tesseract reads for one displayed frame (rows, cols uint8): name -> dark text on light page."""
    from scipy import ndimage as ndi

    out: dict[str, np.ndarray] = {}
    wanted = set(policy.views) | set(policy.rotated_views)
    size = (policy.tophat_px, policy.tophat_px)
    f16 = frame.astype(np.int16)
    bright = f16 - ndi.grey_opening(frame, size=size)
    dark = ndi.grey_closing(frame, size=size).astype(np.int16) - f16
    out["ink"] = np.maximum(bright, dark).astype(np.uint8)  # stroke contrast either way (not a page)
    if "tophat_bright" in wanted:
        out["tophat_bright"] = 255 - np.clip(bright * policy.tophat_gain, 0, 255).astype(np.uint8)
    if "tophat_dark" in wanted:
        out["tophat_dark"] = 255 - np.clip(dark * policy.tophat_gain, 0, 255).astype(np.uint8)
    if "display" in wanted:
        out["display"] = 255 - frame
    if "display_inverted" in wanted:
        out["display_inverted"] = frame
    return out


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
    forms = {d, m + dd + y, dd + m + y, dd + mon + y, m + dd + y[2:], dd + m + y[2:],
             str(int(m)) + str(int(dd)) + y[2:], str(int(dd)) + str(int(m)) + y[2:],
             str(int(m)) + str(int(dd)) + y, dd + mon + y[2:]}
    return {f for f in forms if len(f) >= 4}


@dataclass
class PhiTokens:
    """Normalised header PHI values (upper case, letters and digits) looked for in OCR words.

    Built by :meth:`from_dataset` before de-identification changes the header: person-name parts, IDs,
    accession, dates (birth, study, series, acquisition, content) in the usual written forms, times (HHMMSS,
    HHMM), the age number and the institution's words of four letters or more.
    """

    tokens: set[str] = field(default_factory=set)
    min_chars: int = 2

    @classmethod
    def from_dataset(cls, ds, min_chars: int = 2) -> PhiTokens:
        def s(kw: str) -> str:
            v = ds.get(kw)
            if v is None:
                return ""
            return " ".join(str(x) for x in v) if type(v).__name__ == "MultiValue" else str(v)

        toks: set[str] = set()
        for kw in ("PatientName", "OtherPatientNames", "PatientBirthName", "PatientMotherBirthName",
                   "ReferringPhysicianName", "PerformingPhysicianName", "OperatorsName"):
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
        age = re.fullmatch(r"0*(\d{1,3})[DWMY]", s("PatientAge").strip())
        if age:
            toks.add(age.group(1))
        for kw in ("InstitutionName", "InstitutionAddress", "InstitutionalDepartmentName"):
            for part in re.split(r"[\s,.'-]+", s(kw)):
                if len(_norm(part)) >= 4:
                    toks.add(_norm(part))
        return cls({t for t in toks if len(t) >= min_chars}, min_chars)

    @staticmethod
    def tokens_of(text: str, min_chars: int = 2) -> set[str]:
        """The normalised words of a free text (e.g. an answer key's planted text), as tokens."""
        return {t for t in (_norm(p) for p in re.split(r"[\s,]+", text)) if len(t) >= min_chars}

    def matches(self, word: str, fuzzy_min: int = 5) -> bool:
        """True when the word (or its digits, for dates and IDs) equals a token, or is one edit away from a token
        of at least ``fuzzy_min`` characters."""
        w = _norm(word)
        if len(w) < self.min_chars:
            return False
        digits = re.sub(r"\D", "", w)
        if w in self.tokens or (len(digits) >= 4 and digits in self.tokens):
            return True
        if len(w) >= fuzzy_min:
            return any(abs(len(t) - len(w)) <= 1 and len(t) >= fuzzy_min and _one_edit(w, t) for t in self.tokens)
        return False


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
    return a[i + 1:] == b[i + 1:] if len(a) == len(b) else a[i:] == b[i + 1:]


# ---- lines and decisions ---------------------------------------------------------------------------------

@dataclass
class TextLine:
    """Words of one line: ``box`` [x0, y0, x1, y1] (exclusive ends) around them; ``reason`` why it is text
    (``phi``, ``word``, ``line``) or None; ``allowed`` when every word is an allow-listed marker."""

    words: list[Word]
    box: tuple[int, int, int, int]
    vertical: bool
    reason: str | None = None
    allowed: bool = False

    @property
    def height(self) -> int:
        """Line height across its reading direction (pixels)."""
        x0, y0, x1, y1 = self.box
        return (x1 - x0) if self.vertical else (y1 - y0)


def group_lines(words: list[Word], join_gap: float, max_height_ratio: float = 1.7) -> list[TextLine]:
    """Join words of one orientation and similar height (ratio at most ``max_height_ratio``) into lines: boxes
    that overlap across the reading direction by half the smaller height with a gap under ``join_gap`` x the
    taller height."""
    n = len(words)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

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
                parent[find(i)] = find(j)
    groups: dict[int, list[Word]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(words[i])
    lines = []
    for ws in groups.values():
        box = (min(w.box[0] for w in ws), min(w.box[1] for w in ws), max(w.box[2] for w in ws),
               max(w.box[3] for w in ws))
        lines.append(TextLine(ws, box, ws[0].vertical))
    return lines


def classify(line: TextLine, policy: TextPolicy, phi: PhiTokens, *, verify: bool = False) -> TextLine:
    """Set ``line.reason`` (``phi``, ``word``, ``line`` or None) and ``line.allowed`` by the policy thresholds
    (the ``verify`` ones when ``verify``)."""
    w_conf = policy.verify["word_min_confidence"] if verify else policy.word["min_confidence"]
    w_chars = policy.verify["min_chars"] if verify else policy.word["min_chars"]
    p_conf = policy.verify["phi_min_confidence"] if verify else policy.phi["min_confidence"]
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    line.reason = None
    if any(w.conf >= p_conf and phi.matches(w.text, fuzzy) for w in line.words):
        line.reason = "phi"
    elif any(w.conf >= w_conf and len(_norm(w.text)) >= w_chars for w in line.words):
        line.reason = "word"
    else:
        good = [w for w in line.words if len(_norm(w.text)) >= 2 and w.conf >= policy.line["min_word_confidence"]]
        chars = sum(len(_norm(w.text)) for w in good)
        if good and chars >= policy.line["min_chars"] and (
                sum(w.conf for w in good) / len(good)) >= policy.line["min_mean_confidence"]:
            line.reason = "line"
    sure = [w for w in line.words if _norm(w.text)]
    line.allowed = line.reason != "phi" and bool(sure) and all(_norm(w.text) in policy.allow_list for w in sure)
    return line


def read_lines(frame: np.ndarray, policy: TextPolicy, phi: PhiTokens, *, verify: bool = False) -> list[TextLine]:
    """Text lines of one displayed frame (rows, cols uint8) that the policy calls text (allowed ones included,
    flagged); each line's box is grown along its reading direction over the ink that continues it
    (:func:`extend_along_ink`), so words OCR did not read with confidence are covered too."""
    scale = policy.scale_for(*frame.shape)
    pages = views(frame, policy)
    words: list[Word] = []
    for name in policy.views:
        words += ocr_words(pages[name], policy, scale)
    for name in policy.rotated_views:
        words += ocr_words(pages[name], policy, scale, vertical=True)
    p_conf = policy.verify["phi_min_confidence"] if verify else policy.phi["min_confidence"]
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    words = [w for w in words if _norm(w.text) and w.box[2] > w.box[0] and w.box[3] > w.box[1]
             and (w.conf >= policy.min_join_confidence or (w.conf >= p_conf and phi.matches(w.text, fuzzy)))]
    lines = [classify(ln, policy, phi, verify=verify)
             for ln in group_lines(words, policy.join_gap, policy.max_height_ratio)]
    lines = [ln for ln in lines if ln.reason is not None]
    for ln in lines:
        if not ln.allowed:
            ln.box = extend_along_ink(pages["ink"], ln.box, ln.vertical, policy)
    return lines


def extend_along_ink(ink: np.ndarray, box: tuple[int, int, int, int], vertical: bool,
                     policy: TextPolicy) -> tuple[int, int, int, int]:
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
    thr = max(8.0, 0.5 * float(np.percentile(inside, 90)))
    has = (band >= thr).any(axis=0)
    h = band.shape[0]
    gap_max, reach = max(2, int(policy.extend_gap * h)), int(policy.extend_max * h)
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


def grown(box: tuple[int, int, int, int], height: int, policy: TextPolicy, rows: int, cols: int) -> tuple[int, int, int, int]:
    """A line box grown by the policy margin, clipped to the image."""
    m = max(policy.margin_px, int(round(policy.margin_fraction * height)))
    x0, y0, x1, y1 = box
    return max(0, x0 - m), max(0, y0 - m), min(cols, x1 + m), min(rows, y1 + m)


# ---- the step --------------------------------------------------------------------------------------------

@dataclass
class TextCleaning:
    """What the burned-in text step did to one object.

    ``regions``: blanked boxes, each {"frame": int or "all", "box": [x0, y0, x1, y1], "reason": phi|word|line};
    ``kept_markers``: allow-listed marker lines left in place; ``frames_read``: frames (or composites) read;
    ``pixels_blanked``: pixels set to the fill value (all frames).
    """

    regions: list[dict] = field(default_factory=list)
    kept_markers: int = 0
    frames_read: int = 0
    pixels_blanked: int = 0

    @property
    def blanked(self) -> bool:
        """True when any region was blanked."""
        return bool(self.regions)


def _frames_to_read(disp: np.ndarray, policy: TextPolicy) -> list[tuple[Any, np.ndarray]]:
    n = disp.shape[0]
    if n <= policy.max_frames_each:
        return [(i if n > 1 else 0, disp[i]) for i in range(n)]
    picks = np.linspace(0, n - 1, policy.sample_frames).round().astype(int)
    out: list[tuple[Any, np.ndarray]] = [("all", disp.max(axis=0)), ("all", disp.min(axis=0)),
                                         ("all", np.median(disp, axis=0).astype(np.uint8))]
    return out + [("all", disp[int(i)]) for i in sorted(set(picks.tolist()))]


def fill_value(arr: np.ndarray, photometric: str) -> Any:
    """The stored value that displays black: the minimum (maximum for MONOCHROME1) of the stored values; 0 for
    colour."""
    if arr.ndim == 4 or photometric in ("RGB", "PALETTE COLOR") or photometric.startswith("YBR"):
        return 0
    return arr.max() if photometric == "MONOCHROME1" else arr.min()


def clean_text(ds, policy: TextPolicy | None = None, phi: PhiTokens | None = None) -> TextCleaning:
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

    Returns
    -------
    TextCleaning

    Raises
    ------
    BurnedInTextError
        ``ocr_unavailable``; ``pixel_cleaning_failed`` (pixels that cannot be decoded, larger than
        ``max_pixels`` or smaller than ``min_side_px`` on a side); ``burned_in_text_remaining`` (text still read after blanking).
    """
    policy = policy or load_text_policy()
    phi = phi if phi is not None else PhiTokens.from_dataset(ds, int(policy.phi["min_token_chars"]))
    problem = ocr_available()
    if problem:
        raise BurnedInTextError("ocr_unavailable", problem)
    rows, cols = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    frames = int(_first(ds.get("NumberOfFrames", 1) or 1)) if str(ds.get("NumberOfFrames", "1")).strip() else 1
    if rows * cols * max(frames, 1) > policy.max_pixels:
        raise BurnedInTextError("pixel_cleaning_failed", "the image is too large to be read for burned-in text")
    try:
        arr = ds.pixel_array
    except Exception as err:  # noqa: BLE001  any decoder failure: the text cannot be checked
        raise BurnedInTextError("pixel_cleaning_failed",
                                f"cannot decode pixels to read burned-in text: {type(err).__name__}") from None
    photometric = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    color = int(ds.get("SamplesPerPixel", 1) or 1) > 1
    stacked = arr if (frames > 1 and arr.ndim == (4 if color else 3)) else arr[None]
    out = TextCleaning()
    if min(stacked.shape[1], stacked.shape[2]) < policy.min_side_px:
        raise BurnedInTextError("pixel_cleaning_failed", f"the image is smaller than {policy.min_side_px} pixels "
                                "on a side: too small to be read for burned-in text")
    disp = display_frames(ds, stacked)
    todo = _frames_to_read(disp, policy)
    out.frames_read = len(todo)
    n, h, w = stacked.shape[:3]
    boxes: list[tuple[Any, tuple[int, int, int, int], str]] = []
    for label, frame in todo:
        for ln in read_lines(frame, policy, phi):
            if ln.allowed:
                out.kept_markers += 1
                continue
            boxes.append((label, grown(ln.box, ln.height, policy, h, w), ln.reason or "word"))
    if not boxes:
        return out
    cleaned = np.array(stacked, copy=True)
    fill = fill_value(stacked, photometric)
    mask = np.zeros((n, h, w), dtype=bool)
    for label, (x0, y0, x1, y1), reason in boxes:
        sel = slice(None) if label == "all" else slice(int(label), int(label) + 1)
        mask[sel, y0:y1, x0:x1] = True
        out.regions.append({"frame": label, "box": [x0, y0, x1, y1], "reason": reason})
    cleaned[mask] = fill
    out.pixels_blanked = int(mask.sum())
    # verify: read the cleaned frames again (same frames / composites), fail closed on anything left
    disp2 = display_frames(ds, cleaned)
    for _label, frame in _frames_to_read(disp2, policy):
        left = [ln for ln in read_lines(frame, policy, phi, verify=True) if not ln.allowed]
        if left:
            raise BurnedInTextError(
                "burned_in_text_remaining",
                f"{len(left)} text region(s) still read after blanking ({', '.join(sorted({ln.reason or '' for ln in left}))})")
    _write_pixels(ds, cleaned if frames > 1 else cleaned[0], photometric)
    ds.BurnedInAnnotation = "NO"
    return out


def _write_pixels(ds, arr: np.ndarray, photometric: str) -> None:
    """Store cleaned pixels uncompressed (Explicit VR Little Endian), keeping BitsStored and the colour model
    (YBR decoded to RGB by pydicom is written as RGB)."""
    if photometric.startswith("YBR"):
        photometric = "RGB"
    if photometric == "PALETTE COLOR":
        ds.set_pixel_data(arr, "PALETTE COLOR", int(ds.BitsStored), generate_instance_uid=False)
        return
    ds.set_pixel_data(arr, photometric, int(ds.BitsStored), generate_instance_uid=False)
