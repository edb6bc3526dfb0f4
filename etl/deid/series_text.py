"""Burned-in text per series: a Tesseract-free text detector on every slice, OCR only where it finds candidates.

A scanner or workstation draws its text in the same places on every slice of a series, or on the localizer and
secondary captures only; most slices of a CT or MR series hold none, and a full read
(:func:`etl.deid.burned_in_text.clean_text`, about 0.45 s of one core for a 512 x 512 slice) costs a hundred times
the de-identification of the slice without OCR. So, per series (all files of a series are in one shard; ``series``
in ``schemas/deid/burned_in_text.yaml``):

1. the files are put in order (:meth:`SeriesTextGate.order`): per series, its sample first (``sample_slices``
   files in source order: the first, the last, the middle and evenly spaced ones between, :func:`sample_positions`;
   0 by default: no sample), then the rest in source order; a series of ``read_whole_up_to`` files or fewer (a
   radiograph, a single image) is all sample;
2. a file is read in full (layout, recognition, blanking, verification, PHI sweep) when it is in the sample, when
   its header makes text likely (:func:`text_likely`: ImageType DERIVED / SECONDARY / SCREEN SAVE / LOCALIZER,
   secondary capture and other SOP classes, modalities such as US, XA, RF, NM, OT, BurnedInAnnotation YES), or
   when an earlier file of its series held text (then the text lines found there are read first, ``hints``);
3. any other file goes through the detector (:func:`etl.deid.text_precheck.glyph_rows`: rows of glyph-like
   strokes on the top-hats of every frame, no Tesseract, about 1 ms for a 512 x 512 slice); each row found is
   read on its own as the full read reads a region (:func:`row_text`: recognition, classification, glyphs OCR
   cannot read, plus a looser word test); a row read as text, or a frame too dense to tell, makes the file read
   in full, which then decides as in 2. A file whose frames hold no such row skips OCR: a clean slice with no
   candidate costs no Tesseract call (fail closed: text is read where the detector finds its glyphs; what it
   cannot tell from texture is read).

:class:`SeriesSlot` is what one file carries through :func:`etl.deid.dicom.deidentify_dataset`
(``series_text=``); its outcome (``read`` / ``skipped`` and why) lands in the file's audit counts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from etl.deid.burned_in_text import (
    TEXT_POLICY_FILE,
    BurnedInTextError,
    PhiTokens,
    Region,
    TextCleaning,
    TextPolicy,
    _decode,
    _first,
    _norm,
    clean_text,
    display_frames,
    group_lines,
    read_lines,
)
from etl.deid.text_precheck import GlyphRow, PrecheckPolicy, glyph_rows


@dataclass(frozen=True)
class SeriesPolicy:
    """``series`` of ``schemas/deid/burned_in_text.yaml`` as read (see the file for each field's reason)."""

    enabled: bool
    sample_slices: int
    read_whole_up_to: int
    image_types: frozenset[str]
    sop_class_prefixes: tuple[str, ...]
    modalities: frozenset[str]
    burned_in_annotation_yes: bool
    precheck: PrecheckPolicy
    pad: float
    reach: float
    word_min_chars: int
    long_word_chars: int
    long_word_confidence: float


@lru_cache(maxsize=4)
def load_series_policy(path: str | None = None) -> SeriesPolicy:
    """Read the ``series`` section of the burned-in text policy (default ``schemas/deid/burned_in_text.yaml``).

    Raises
    ------
    BurnedInTextError
        ``invalid_text_policy`` for a missing or malformed field, or a sample of fewer than 3 slices.
    """
    data = yaml.safe_load(Path(path or TEXT_POLICY_FILE).read_text(encoding="utf-8"))
    try:
        s = data["series"]
        likely, read = s["text_likely"], s["targeted_read"]
        out = SeriesPolicy(
            enabled=bool(s["enabled"]),
            sample_slices=int(s["sample_slices"]),
            read_whole_up_to=int(s["read_whole_up_to"]),
            image_types=frozenset(str(v).upper() for v in likely["image_type"]),
            sop_class_prefixes=tuple(str(v) for v in likely["sop_class_prefixes"]),
            modalities=frozenset(str(v).upper() for v in likely["modalities"]),
            burned_in_annotation_yes=bool(likely["burned_in_annotation_yes"]),
            precheck=PrecheckPolicy.from_dict(s["precheck"]),
            pad=float(read["pad"]),
            reach=float(read["reach"]),
            word_min_chars=int(read["word_min_chars"]),
            long_word_chars=int(read["long_word_chars"]),
            long_word_confidence=float(read["long_word_confidence"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BurnedInTextError("invalid_text_policy", f"{TEXT_POLICY_FILE.name}: bad or missing field {err}") from None
    if out.sample_slices != 0 and out.sample_slices < 3 or out.read_whole_up_to < 0:
        raise BurnedInTextError(
            "invalid_text_policy", f"{TEXT_POLICY_FILE.name}: series.sample_slices is neither 0 nor 3 or more"
        )
    return out


def sample_positions(n: int, k: int) -> list[int]:
    """The positions (0-based, ascending) of the sample of a series of ``n`` slices: ``k`` evenly spaced
    (``numpy.linspace`` rounded, so the first and the last), the one nearest the middle moved onto it
    (``(n - 1) // 2``); all of them when ``n <= k``; none when ``k`` is 0."""
    if k <= 0:
        return []
    if n <= k:
        return list(range(n))
    picks = [int(round(v)) for v in np.linspace(0, n - 1, k)]
    mid = (n - 1) // 2
    near = min(range(1, k - 1), key=lambda i: abs(picks[i] - mid))  # k >= 3: never the first or the last
    picks[near] = mid
    return sorted(set(picks))


def text_likely(ds, sp: SeriesPolicy) -> str | None:
    """Why the header of ``ds`` makes burned-in text likely (``text_likely`` of the policy), or None."""

    def value(kw: str) -> str:
        v = ds.get(kw)
        return "" if v is None else str(v).strip().upper()

    if sp.burned_in_annotation_yes and value("BurnedInAnnotation") == "YES":
        return "BurnedInAnnotation"
    image_type = ds.get("ImageType")
    parts = (
        {str(x).strip().upper() for x in image_type}
        if type(image_type).__name__ == "MultiValue"
        else {p.strip().upper() for p in str(image_type or "").split("\\")}
    )
    if parts & sp.image_types:
        return "ImageType"
    if value("Modality") in sp.modalities:
        return "Modality"
    sop = str(ds.get("SOPClassUID", "") or "").strip()
    if any(sop.startswith(p) for p in sp.sop_class_prefixes):
        return "SOPClassUID"
    return None


@dataclass
class SeriesState:
    """What the files of one series read so far showed: ``has_text`` once any held text; ``hints`` the text
    lines of the last file where text was blanked (regions, frame pixels)."""

    has_text: bool = False
    hints: list[Region] = field(default_factory=list)


@dataclass
class SeriesSlot:
    """One file's place in its series: the series' shared ``state`` and whether the file is in the sample."""

    state: SeriesState
    sampled: bool
    policy: SeriesPolicy


class SeriesTextGate:
    """The series of one shard (or folder) and their samples.

    Parameters
    ----------
    members : iterable of (file id, series key)
        every file to de-identify, in source order; the series key is any hashable (a keyed pseudonym of the
        SeriesInstanceUID), or None when unknown (the file is then a series of its own).
    policy : SeriesPolicy, optional
        default :func:`load_series_policy`.
    """

    def __init__(self, members: Iterable[tuple[Hashable, Hashable | None]], policy: SeriesPolicy | None = None):
        self.policy = policy or load_series_policy()
        self._series: dict[Hashable, list[Hashable]] = {}
        self._key: dict[Hashable, Hashable] = {}
        for i, (file_id, series) in enumerate(members):
            key = ("file", i) if series is None else ("series", series)
            self._series.setdefault(key, []).append(file_id)
            self._key[file_id] = key
        self._sampled: set[Hashable] = set()
        for files in self._series.values():
            if len(files) <= self.policy.read_whole_up_to:
                self._sampled.update(files)
            else:
                self._sampled.update(files[i] for i in sample_positions(len(files), self.policy.sample_slices))
        self._state = {key: SeriesState() for key in self._series}

    def order(self) -> list[Hashable]:
        """Every file id: series in the order of their first file, each series' sample first, then its other
        files (source order within both)."""
        out: list[Hashable] = []
        for files in self._series.values():
            out += [f for f in files if f in self._sampled] + [f for f in files if f not in self._sampled]
        return out

    def record(self, file_id: Hashable, text_regions: list[dict] | None) -> None:
        """Mark the series of ``file_id`` as holding text when its de-identification blanked text lines
        (``text_regions`` of :class:`etl.deid.dicom.DeidResult`; device rule regions do not count). :func:`clean_slice`
        does this itself; the caller records it too, so the series state holds where de-identification ran in
        another process."""
        if any(r.get("reason") != "rule" for r in text_regions or []):
            self._state[self._key[file_id]].has_text = True

    def slot(self, file_id: Hashable) -> SeriesSlot | None:
        """The slot of one file (None when OCR per series is off in the policy: every file is read in full)."""
        if not self.policy.enabled:
            return None
        return SeriesSlot(self._state[self._key[file_id]], file_id in self._sampled, self.policy)


def row_text(frame: np.ndarray, row: GlyphRow, policy: TextPolicy, phi: PhiTokens, sp: SeriesPolicy) -> str | None:
    """Why one pre-check row of a displayed frame (rows, cols uint8) sends its slice to the full read, or None.

    The row's box, grown by ``pad`` x its height across and ``reach`` x its height along its reading direction
    (clipped to the frame), is read as the full read reads a candidate region (:func:`read_lines` without the
    layout pass: recognition on the top-hat page of the row's polarity, lines, classification, the second look,
    and the search for glyph rows OCR cannot read): ``line`` when a text line the full read would blank is found
    (allow-listed markers alone do not count), ``unreadable`` for a row of character-like glyphs OCR cannot read
    (the full read would blank it in the margin or quarantine the file). Then, looser than the full read (the
    crop may cut a line): ``word`` for a word of ``word_min_chars`` letters/digits or more at ``min_join_confidence``
    or more, or of ``long_word_chars`` or more at ``long_word_confidence`` or more, ``phi`` for a header PHI value.
    A ``dense`` row is always read (the frame cannot be told from texture)."""
    if row.dense:
        return "dense"
    rows, cols = frame.shape
    x0, y0, x1, y1 = row.box
    p = max(policy.pad_px, int(round(sp.pad * row.height)))
    r = int(round(sp.reach * row.height))
    px, py = (p, p + r) if row.vertical else (p + r, p)
    line_px = int(np.clip(row.height, policy.min_line_px, policy.max_line_px))
    region = Region(
        (max(0, x0 - px), max(0, y0 - py), min(cols, x1 + px), min(rows, y1 + py)), row.bright, line_px, row.vertical
    )
    unread: list = []
    words: list = []
    lines = read_lines(frame, policy, phi, unread=unread, hints=[region], layout=False, words_read=words)
    if any(ln.reason is not None and not ln.allowed for ln in lines):
        return "line"
    if unread:
        return "unreadable"
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    for w in words:
        chars = len(_norm(w.text))
        if chars >= sp.word_min_chars and w.conf >= policy.min_join_confidence:
            return "word"
        if chars >= sp.long_word_chars and w.conf >= sp.long_word_confidence:
            return "word"
        if w.conf >= policy.phi["min_confidence"] and phi.matches(w.text, fuzzy):
            return "phi"
    for ln in group_lines([w for w in words if _norm(w.text)], policy.join_gap, policy.max_height_ratio):
        if len(ln.words) > 1 and phi.matches("".join(w.text for w in ln.words), fuzzy):
            return "phi"  # a PHI value OCR split in two
    return None


def row_has_text(frame: np.ndarray, row: GlyphRow, policy: TextPolicy, phi: PhiTokens, sp: SeriesPolicy) -> bool:
    """Whether one pre-check row sends its slice to the full read (:func:`row_text` gives a reason)."""
    return row_text(frame, row, policy, phi, sp) is not None


def _displayed(ds, policy: TextPolicy) -> np.ndarray | None:
    """The displayed frames (frames, rows, cols) uint8 of ``ds``, or None where :func:`clean_text` must decide
    (pixels it cannot decode or refuses to read, images too small to hold text: it raises or returns itself).
    A single grey frame of 8 or 16-bit integers with a VOI window is displayed through a lookup table of every
    stored value (:func:`_display_lut`: the values :func:`display_frames` gives, at a fifth of its cost)."""
    rows, cols = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    raw = ds.get("NumberOfFrames", 1)
    frames = int(_first(raw or 1)) if str(raw if raw is not None else "1").strip() else 1
    if rows * cols * max(frames, 1) > policy.max_pixels or min(rows, cols) < policy.min_side_px:
        return None
    try:
        arr = _decode(ds, view_only=True)  # only read here: no copy of native pixel data
    except Exception:  # noqa: BLE001  clean_text decodes again and raises the reason-coded error
        return None
    color = int(ds.get("SamplesPerPixel", 1) or 1) > 1
    stacked = arr if (frames > 1 and arr.ndim == (4 if color else 3)) else arr[None]
    if min(stacked.shape[1], stacked.shape[2]) < policy.min_side_px:
        return None
    if stacked.ndim == 3 and stacked.shape[0] == 1 and stacked.dtype.itemsize <= 2 and stacked.dtype.kind in "iu":
        key = _lut_key(ds, stacked.dtype)
        if key is not None:
            unsigned = stacked.view(stacked.dtype.str.replace("i", "u"))
            return np.take(_display_lut(*key), unsigned)
    return display_frames(ds, stacked)


def _lut_key(ds, dtype: np.dtype) -> tuple | None:
    """What :func:`display_frames` computes a grey frame of ``dtype`` from (photometric, rescale, window), hashable;
    None where no table applies (palette colour, no finite window: the percentile window depends on the pixels)."""
    photometric = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    c, w = _first(ds.get("WindowCenter")), _first(ds.get("WindowWidth"))
    if photometric == "PALETTE COLOR" or not (np.isfinite(c) and np.isfinite(w) and w > 1):
        return None
    slope, intercept = _first(ds.get("RescaleSlope", 1) or 1), _first(ds.get("RescaleIntercept", 0) or 0)
    return (dtype.str, photometric, slope, intercept, c, w)


@lru_cache(maxsize=64)
def _display_lut(dtype: str, photometric: str, slope: float, intercept: float, c: float, w: float) -> np.ndarray:
    """The displayed value (uint8) of every stored value of ``dtype`` (256 or 65,536 entries), indexed by the
    stored value's bits read as unsigned: :func:`display_frames`' own arithmetic applied to each value once."""
    from pydicom.dataset import Dataset

    dt = np.dtype(dtype)
    values = np.arange(1 << (8 * dt.itemsize), dtype=dt.str.replace("i", "u")).view(dt)
    ds = Dataset()
    ds.PhotometricInterpretation = photometric or "MONOCHROME2"
    ds.RescaleSlope, ds.RescaleIntercept, ds.WindowCenter, ds.WindowWidth = slope, intercept, c, w
    return display_frames(ds, values[None, None, :])[0, 0]


def clean_slice(
    ds, policy: TextPolicy, phi: PhiTokens | Callable[[], PhiTokens], slot: SeriesSlot
) -> tuple[TextCleaning | None, str]:
    """Burned-in text of one file of a series: read in full or pre-checked (module docstring).

    Parameters
    ----------
    ds : pydicom.Dataset
        the source instance (before its header is de-identified); modified in place when text is blanked.
    policy : TextPolicy
    phi : PhiTokens or callable
        the header PHI tokens of ``ds``, or a function of no argument that gives them (called only when a row or
        the file is read: a slice the detector clears never needs them).
    slot : SeriesSlot
        the file's series state (updated: ``has_text``, ``hints``) and sample membership.

    Returns
    -------
    (TextCleaning or None, str)
        the full read's result and why it was read (``sample``, ``series_text``, ``header:<keyword>``,
        ``precheck``), or (None, ``skipped``) when the pre-check found no row OCR reads as a word.

    Raises
    ------
    BurnedInTextError
        as :func:`etl.deid.burned_in_text.clean_text`.
    """
    sp = slot.policy
    tokens: list[PhiTokens] = [phi] if isinstance(phi, PhiTokens) else []
    make_tokens = None if isinstance(phi, PhiTokens) else phi

    def phi_tokens() -> PhiTokens:
        if not tokens and make_tokens is not None:
            tokens.append(make_tokens())
        return tokens[0]

    likely = text_likely(ds, sp)
    why = "sample" if slot.sampled else "series_text" if slot.state.has_text else f"header:{likely}" if likely else None
    if why is None:
        disp = _displayed(ds, policy)
        if disp is None:
            why = "precheck"
        elif any(
            row_text(frame, row, policy, phi_tokens(), sp) for frame in disp for row in glyph_rows(frame, sp.precheck)
        ):
            why = "precheck"
        else:
            return None, "skipped"
    done = clean_text(ds, policy, phi_tokens(), hints=slot.state.hints if slot.state.has_text else None)
    if done.blanked:
        slot.state.has_text = True
        if done.lines:
            slot.state.hints = done.lines
    return done, why


def audit_key(why: str) -> str:
    """The audit count a slice's outcome adds to (``text_series_<why>``, the header keyword dropped)."""
    return "text_series_" + why.split(":", 1)[0]
