"""Burned-in text once per series: OCR on a sample of each series, a Tesseract-free pre-check on the other slices.

A scanner or workstation draws its text in the same places on every slice of a series, or on the localizer and
secondary captures only. So, per series (all files of a series are in one shard; ``series`` in
``schemas/deid/burned_in_text.yaml``):

1. the files are put in order (:meth:`SeriesTextGate.order`): per series, its sample first (``sample_slices``
   files in source order: the first, the last, the middle and evenly spaced ones between, :func:`sample_positions`),
   then the rest in source order;
2. a file is read in full by :func:`etl.deid.burned_in_text.clean_text` (layout, recognition, blanking,
   verification, PHI sweep) when it is in the sample, when its header makes text likely (:func:`text_likely`:
   ImageType DERIVED / SECONDARY / SCREEN SAVE / LOCALIZER, secondary capture and other SOP classes, modalities
   such as US, XA, RF, NM, OT, BurnedInAnnotation YES), or when an earlier file of its series held text (then the
   text lines found there are read first, ``hints``);
3. any other file is pre-checked (:func:`etl.deid.text_precheck.glyph_rows`: rows of glyph-like strokes on the
   top-hats of every frame, no Tesseract); each row found is recognised on its own (:func:`row_has_text`); a row
   read as a word, or a frame too dense to tell, makes the file read in full, which then decides as in 2. A file
   whose frames hold no such row skips OCR (fail closed: text the sample did not see is read where the pre-check
   finds its glyphs; what it cannot tell from texture is read).

:class:`SeriesSlot` is what one file carries through :func:`etl.deid.dicom.deidentify_dataset`
(``series_text=``); its outcome (``read`` / ``skipped`` and why) lands in the file's audit counts.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
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
    read_region,
)
from etl.deid.text_precheck import GlyphRow, PrecheckPolicy, glyph_rows


@dataclass(frozen=True)
class SeriesPolicy:
    """``series`` of ``schemas/deid/burned_in_text.yaml`` as read (see the file for each field's reason)."""

    enabled: bool
    sample_slices: int
    image_types: frozenset[str]
    sop_class_prefixes: tuple[str, ...]
    modalities: frozenset[str]
    burned_in_annotation_yes: bool
    precheck: PrecheckPolicy
    pad: float
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
            image_types=frozenset(str(v).upper() for v in likely["image_type"]),
            sop_class_prefixes=tuple(str(v) for v in likely["sop_class_prefixes"]),
            modalities=frozenset(str(v).upper() for v in likely["modalities"]),
            burned_in_annotation_yes=bool(likely["burned_in_annotation_yes"]),
            precheck=PrecheckPolicy.from_dict(s["precheck"]),
            pad=float(read["pad"]),
            word_min_chars=int(read["word_min_chars"]),
            long_word_chars=int(read["long_word_chars"]),
            long_word_confidence=float(read["long_word_confidence"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BurnedInTextError("invalid_text_policy", f"{TEXT_POLICY_FILE.name}: bad or missing field {err}") from None
    if out.sample_slices < 3:
        raise BurnedInTextError("invalid_text_policy", f"{TEXT_POLICY_FILE.name}: series.sample_slices is under 3")
    return out


def sample_positions(n: int, k: int) -> list[int]:
    """The positions (0-based, ascending) of the sample of a series of ``n`` slices: ``k`` evenly spaced
    (``numpy.linspace`` rounded, so the first and the last), the one nearest the middle moved onto it
    (``(n - 1) // 2``); all of them when ``n <= k``."""
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


def row_has_text(frame: np.ndarray, row: GlyphRow, policy: TextPolicy, phi: PhiTokens, sp: SeriesPolicy) -> bool:
    """Whether OCR reads a word in one pre-check row of a displayed frame (rows, cols uint8): the row's box grown
    by ``pad`` x its height, recognised on the top-hat page of its polarity (:func:`read_region`); a word of
    ``word_min_chars`` letters/digits or more at ``min_join_confidence`` or more, one of ``long_word_chars`` or more
    at ``long_word_confidence`` or more, or a header PHI value (``phi.min_confidence``), is text. A ``dense`` row is
    always text (the frame cannot be told from it)."""
    if row.dense:
        return True
    rows, cols = frame.shape
    x0, y0, x1, y1 = row.box
    p = max(policy.pad_px, int(round(sp.pad * row.height)))
    line_px = int(np.clip(row.height, policy.min_line_px, policy.max_line_px))
    region = Region(
        (max(0, x0 - p), max(0, y0 - p), min(cols, x1 + p), min(rows, y1 + p)), row.bright, line_px, row.vertical
    )
    words, _, _ = read_region(frame, region, policy)
    fuzzy = int(policy.phi["fuzzy_min_chars"])
    for w in words:
        chars = len(_norm(w.text))
        if chars >= sp.word_min_chars and w.conf >= policy.min_join_confidence:
            return True
        if chars >= sp.long_word_chars and w.conf >= sp.long_word_confidence:
            return True
        if w.conf >= policy.phi["min_confidence"] and phi.matches(w.text, fuzzy):
            return True
    for ln in group_lines([w for w in words if _norm(w.text)], policy.join_gap, policy.max_height_ratio):
        if len(ln.words) > 1 and phi.matches("".join(w.text for w in ln.words), fuzzy):
            return True  # a PHI value OCR split in two
    return False


def _displayed(ds, policy: TextPolicy) -> np.ndarray | None:
    """The displayed frames (frames, rows, cols) uint8 of ``ds``, or None where :func:`clean_text` must decide
    (pixels it cannot decode or refuses to read, images too small to hold text: it raises or returns itself)."""
    rows, cols = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    raw = ds.get("NumberOfFrames", 1)
    frames = int(_first(raw or 1)) if str(raw if raw is not None else "1").strip() else 1
    if rows * cols * max(frames, 1) > policy.max_pixels or min(rows, cols) < policy.min_side_px:
        return None
    try:
        arr = _decode(ds)
    except Exception:  # noqa: BLE001  clean_text decodes again and raises the reason-coded error
        return None
    color = int(ds.get("SamplesPerPixel", 1) or 1) > 1
    stacked = arr if (frames > 1 and arr.ndim == (4 if color else 3)) else arr[None]
    if min(stacked.shape[1], stacked.shape[2]) < policy.min_side_px:
        return None
    return display_frames(ds, stacked)


def clean_slice(ds, policy: TextPolicy, phi: PhiTokens, slot: SeriesSlot) -> tuple[TextCleaning | None, str]:
    """Burned-in text of one file of a series: read in full or pre-checked (module docstring).

    Parameters
    ----------
    ds : pydicom.Dataset
        the source instance (before its header is de-identified); modified in place when text is blanked.
    policy : TextPolicy
    phi : PhiTokens
        the header PHI tokens of ``ds``.
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
    likely = text_likely(ds, sp)
    why = "sample" if slot.sampled else "series_text" if slot.state.has_text else f"header:{likely}" if likely else None
    if why is None:
        disp = _displayed(ds, policy)
        if disp is None:
            why = "precheck"
        elif any(row_has_text(frame, row, policy, phi, sp) for frame in disp for row in glyph_rows(frame, sp.precheck)):
            why = "precheck"
        else:
            return None, "skipped"
    done = clean_text(ds, policy, phi, hints=slot.state.hints if slot.state.has_text else None)
    if done.blanked:
        slot.state.has_text = True
        if done.lines:
            slot.state.hints = done.lines
    return done, why


def audit_key(why: str) -> str:
    """The audit count a slice's outcome adds to (``text_series_<why>``, the header keyword dropped)."""
    return "text_series_" + why.split(":", 1)[0]
