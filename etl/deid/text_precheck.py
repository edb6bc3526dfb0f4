"""A cheap pre-check for burned-in text that never calls Tesseract: rows of glyph-like strokes in a frame.

:mod:`etl.deid.series_text` reads a sample of each series with OCR (:func:`etl.deid.burned_in_text.clean_text`)
and skips OCR on the other slices of a series whose sample holds no text, but only where this pre-check finds no
row of glyph-like strokes on the slice (fail closed: a slice with text the sample did not see is read in full).

The test is the usual connected-component text test (Epshtein et al., CVPR 2010, section 3.3; the same idea as
:func:`etl.deid.text_regions.glyph_row`, made permissive and vectorised): on the white and the black
morphological top-hat of the displayed frame (strokes brighter / darker than their local background, structure
``tophat_px`` as in the layout pass), pixels of stroke contrast at or above each level of ``min_ink`` (display
levels; the first is the floor under which the layout's page is white, so text fainter than that is not text to
the OCR pass either; higher ones part glyphs from anatomy their faint edges touch) form 8-connected components. A
component is glyph-like when its height is ``min_glyph_px``..``max_glyph_px``, its width at most ``max_width`` x its
height and it fills ``min_fill``..``max_fill`` of its box (strokes, not blobs). Glyphs on one line (bottoms and tops
within ``align`` x the taller height, heights within ``height_ratio``, gaps of at most ``max_gap`` x the taller height)
join into rows; a row of ``min_glyphs`` glyphs or more makes the frame suspect, and :mod:`etl.deid.series_text`
recognises each such row on its own. Rows are looked for along the rows and along the columns (text written bottom to
top in a margin). Thresholds are data: ``series.precheck`` in ``schemas/deid/burned_in_text.yaml``.

Cost: this runs on every slice of a series that is not read in full, so it is written for speed: OpenCV's top-hats
and connected components (16-bit labels), the component filters on the statistics arrays, rows joined by one
pairwise comparison per level and direction. It looks at full resolution up to ``max_side_px``: at half resolution a
512 x 512 slice costs a quarter, but the 1-pixel gaps between the digits of an 11-pixel date close and its glyphs
merge into one component (a real slice with such text over the lung was missed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from etl.deid.text_regions import Box, work_factor


@dataclass(frozen=True)
class PrecheckPolicy:
    """``series.precheck`` of the burned-in text policy (see the policy file for each field's reason)."""

    min_ink: tuple[float, ...]
    tophat_px: tuple[int, ...]
    max_side_px: int
    min_glyph_px: int
    max_glyph_px: int
    max_width: float
    min_fill: float
    max_fill: float
    height_ratio: float
    align: float
    both_edges: bool
    max_gap: float
    min_glyphs: int
    max_glyphs: int

    @classmethod
    def from_dict(cls, d: dict) -> PrecheckPolicy:
        """From the policy file's mapping. Raises KeyError / TypeError / ValueError for a missing or bad field."""
        return cls(
            min_ink=tuple(float(v) for v in d["min_ink"]),
            tophat_px=tuple(int(k) for k in d["tophat_px"]),
            max_side_px=int(d["max_side_px"]),
            min_glyph_px=int(d["min_glyph_px"]),
            max_glyph_px=int(d["max_glyph_px"]),
            max_width=float(d["max_width"]),
            min_fill=float(d["min_fill"]),
            max_fill=float(d["max_fill"]),
            height_ratio=float(d["height_ratio"]),
            align=float(d["align"]),
            both_edges=bool(d["both_edges"]),
            max_gap=float(d["max_gap"]),
            min_glyphs=int(d["min_glyphs"]),
            max_glyphs=int(d["max_glyphs"]),
        )


@dataclass(frozen=True)
class GlyphRow:
    """A row of glyph-like strokes: ``box`` [x0, y0, x1, y1] in frame pixels (exclusive ends), ``bright`` when its
    strokes are brighter than their background, ``vertical`` when it runs along the columns, ``height`` the
    tallest glyph across the row (frame pixels), ``dense`` when the frame held more glyph-like components than
    ``max_glyphs`` (``box`` is then the whole frame)."""

    box: Box
    bright: bool
    vertical: bool
    height: int
    dense: bool = False


def _rows(g: np.ndarray, p: PrecheckPolicy) -> list[tuple[Box, int]]:
    """The glyphs ``g`` ((n, 4) [x0, y0, x1, y1]) joined into rows along x; each row of ``min_glyphs`` or more:
    (its box, its tallest glyph's height)."""
    n = len(g)
    if n < p.min_glyphs:
        return []
    x0, y0, x1, y1 = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
    h = y1 - y0
    hmax = np.maximum(h[:, None], h[None, :])
    hmin = np.maximum(np.minimum(h[:, None], h[None, :]), 1.0)
    gap = np.maximum(x0[None, :] - x1[:, None], x0[:, None] - x1[None, :])
    tol = np.maximum(1.0, p.align * hmax)
    bottoms = np.abs(y1[:, None] - y1[None, :]) <= tol
    tops = np.abs(y0[:, None] - y0[None, :]) <= tol
    aligned = (bottoms & tops) if p.both_edges else (bottoms | tops)
    near = (gap <= p.max_gap * hmax) & (gap >= -p.align * hmax) & (hmax <= p.height_ratio * hmin) & aligned
    i, j = np.nonzero(np.triu(near, k=1))
    out = []
    for grp in _groups(n, i.tolist(), j.tolist()):
        if len(grp) >= p.min_glyphs:
            out.append(
                ((int(x0[grp].min()), int(y0[grp].min()), int(x1[grp].max()), int(y1[grp].max())), int(h[grp].max()))
            )
    return out


def _groups(n: int, a: list[int], b: list[int]) -> list[list[int]]:
    """The connected components (lists of node indices) of ``n`` nodes joined by the edges ``a[k]``-``b[k]``
    that have two nodes or more (union-find with path halving; a few edges per frame, so plain Python)."""
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in zip(a, b):
        rx, ry = root(x), root(y)
        if rx != ry:
            parent[ry] = rx
    groups: dict[int, list[int]] = {}
    for x in set(a) | set(b):
        groups.setdefault(root(x), []).append(x)
    return list(groups.values())


def glyph_rows(frame: np.ndarray, p: PrecheckPolicy) -> list[GlyphRow]:
    """The rows of glyph-like strokes in one displayed frame (none: no text to read there).

    Parameters
    ----------
    frame : numpy.ndarray
        (rows, cols) uint8, the displayed frame (:func:`etl.deid.burned_in_text.display_frames`).
    p : PrecheckPolicy

    Returns
    -------
    list of GlyphRow
        in frame pixels. Frames larger than ``max_side_px`` are looked at reduced by block means (glyph heights
        are judged in frame pixels). A frame with more glyph-like components than ``max_glyphs`` of one polarity
        (dense texture) gives one ``dense`` row over the whole frame.
    """
    import cv2

    rows, cols = frame.shape
    d = work_factor(rows, cols, p.max_side_px)
    if d == 1:
        work = np.ascontiguousarray(frame)
    else:  # block means of d x d pixels (INTER_AREA at an integer factor), rounded
        r, c = rows // d, cols // d
        work = cv2.resize(np.ascontiguousarray(frame[: r * d, : c * d]), (c, r), interpolation=cv2.INTER_AREA)
    lo_h, hi_h = p.min_glyph_px / d, p.max_glyph_px / d
    out: list[GlyphRow] = []
    for size in p.tophat_px:  # strokes brighter / darker than their local background
        k = cv2.getStructuringElement(cv2.MORPH_RECT, (max(3, round(size / d)),) * 2)
        for op, bright in ((cv2.MORPH_TOPHAT, True), (cv2.MORPH_BLACKHAT, False)):
            ink = cv2.morphologyEx(work, op, k)
            top = int(ink.max())
            for level in p.min_ink:  # higher levels part glyphs from the anatomy their faint edges touch
                if top < level:
                    break
                mask = cv2.threshold(ink, level - 1, 1, cv2.THRESH_BINARY)[1]
                n, _, st, _ = cv2.connectedComponentsWithStatsWithAlgorithm(mask, 8, cv2.CV_16U, cv2.CCL_DEFAULT)
                if n <= 1:
                    break
                x, y, w, h, area = (st[1:, i].astype(np.float64) for i in range(5))
                fill = area / (w * h)
                stroke = (fill >= p.min_fill) & (fill <= p.max_fill)
                boxes = np.column_stack([x, y, x + w, y + h])
                for vertical in (False, True):  # along the rows, then along the columns (text written upwards)
                    across, along = (w, h) if vertical else (h, w)
                    glyph = (across >= lo_h) & (across <= hi_h) & (along <= p.max_width * across) & stroke
                    if int(glyph.sum()) > p.max_glyphs:
                        return [GlyphRow((0, 0, cols, rows), bright, False, 0, dense=True)]
                    g = boxes[glyph]
                    for box, height in _rows(g[:, [1, 0, 3, 2]] if vertical else g, p):
                        x0, y0, x1, y1 = (box[1], box[0], box[3], box[2]) if vertical else box
                        frame_box = (x0 * d, y0 * d, min(cols, x1 * d), min(rows, y1 * d))
                        out.append(GlyphRow(frame_box, bright, vertical, height * d))
    return _merged(out)


def _merged(rows: list[GlyphRow]) -> list[GlyphRow]:
    """The rows with those found again (another level, the other structure) inside a larger one of the same
    polarity and direction left out: each place is recognised once."""
    out: list[GlyphRow] = []
    for r in sorted(rows, key=lambda r: -(r.box[2] - r.box[0]) * (r.box[3] - r.box[1])):
        if not any(
            o.bright == r.bright
            and o.vertical == r.vertical
            and o.box[0] <= r.box[0]
            and o.box[1] <= r.box[1]
            and o.box[2] >= r.box[2]
            and o.box[3] >= r.box[3]
            for o in out
        ):
            out.append(r)
    return out
