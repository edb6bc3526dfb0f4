"""Pixel helpers of the burned-in text search: the working copy, stroke-contrast pages and region merging.

:mod:`etl.deid.burned_in_text` finds candidate text lines with Tesseract's layout analysis only (no recognition)
on a working copy of each displayed frame, then recognises at full resolution only the candidate regions. This
module holds the numpy/scipy parts:

- :func:`work_factor` / :func:`downscale`: the working copy, block means of ``d`` x ``d`` pixels (small images
  are upscaled instead, see :func:`working_copy`), so a 2000 x 2000 radiograph is laid out at 1000 x 1000;
- :func:`ink_maps` / :func:`page`: white and black morphological top-hats, i.e. thin strokes brighter (darker)
  than their local background, as dark text on a light page (contrast under a floor left white), so low-contrast text on
  anatomy and text on a semi-transparent box read like black print (Gonzalez & Woods, *Digital Image Processing*, 9.6);
- :func:`merge_lines`: candidate line boxes merged where they overlap or continue one line, so each region is
  recognised once;
- :func:`trim_to_ink`: a blank box shrunk to the strokes of the lines it holds;
- :func:`stroke_value` / :func:`extend_over_value`: the one stored value a line's glyph cores are drawn in, and
  a blank box grown over the pixels of that value that continue the line.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

Box = tuple[int, int, int, int]


def work_factor(rows: int, cols: int, max_side: int) -> int:
    """The integer downscale factor that brings the long side to at most ``max_side`` (1 when it fits)."""
    return max(1, -(-max(rows, cols) // max_side))


def downscale(frame: np.ndarray, d: int) -> np.ndarray:
    """Block means of ``d`` x ``d`` pixels: (rows // d, cols // d) float32 of a (rows, cols) image."""
    if d == 1:
        return frame.astype(np.float32)
    r, c = frame.shape[0] // d * d, frame.shape[1] // d * d
    src = frame[:r, :c].astype(np.float32)
    out = np.zeros((r // d, c // d), np.float32)
    for i in range(d):  # d x d strided sums: exact for integer pixels, about 4 x faster than a 4-D mean
        for j in range(d):
            out += src[i::d, j::d]
    return out / np.float32(d * d)


def working_copy(frame: np.ndarray, max_side: int, upscale_below: int, upscale: int) -> tuple[np.ndarray, float]:
    """The copy layout analysis reads and its factor relative to ``frame`` (working = frame x factor).

    A frame whose long side is under ``upscale_below`` is enlarged ``upscale`` times (pixel repetition, so
    9 px text is laid out at 18 px); one over ``max_side`` is reduced by block means; (h, w) float32.
    """
    rows, cols = frame.shape
    if max(rows, cols) < upscale_below and upscale > 1:
        return np.repeat(np.repeat(frame.astype(np.float32), upscale, axis=0), upscale, axis=1), float(upscale)
    d = work_factor(rows, cols, max_side)
    return downscale(frame, d), 1.0 / d


def ink_maps(img: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """White and black top-hats of a float32 image with a ``k`` x ``k`` square: (bright ink, dark ink)."""
    k = max(3, int(k))
    bright = img - ndi.grey_opening(img, size=(k, k))
    dark = ndi.grey_closing(img, size=(k, k)) - img
    return bright, dark


def page(ink: np.ndarray, floor: float, gain: float) -> np.ndarray:
    """A top-hat as a page for OCR: dark strokes on white, (h, w) uint8, ``255 - gain x (ink - floor)`` clipped;
    stroke contrast under ``floor`` (texture of anatomy, noise) stays white."""
    return (255 - np.clip((ink - floor) * gain, 0, 255)).astype(np.uint8)


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of True in a 1-D bool profile: (starts, ends) int arrays, ends exclusive."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return edges[::2], edges[1::2]


def components(n: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """The connected components of the graph on nodes ``0..n-1`` with ``edges`` (index pairs), each a sorted list
    of node indices, ordered by their smallest node (:func:`scipy.sparse.csgraph.connected_components`)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if n == 0:
        return []
    rows = np.fromiter((a for a, _ in edges), dtype=np.intp, count=len(edges))
    cols = np.fromiter((b for _, b in edges), dtype=np.intp, count=len(edges))
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (rows, cols)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        groups.setdefault(label, []).append(i)
    return list(groups.values())


def merge_lines(boxes: list[Box], heights: list[int], join_gap: float) -> list[tuple[Box, list[int]]]:
    """Line boxes merged into regions where they overlap, or where they lie on one line (overlapping by half
    the smaller height across, similar height, gap under ``join_gap`` x the taller height along).

    Returns (merged box, indices of the input boxes in it) pairs.
    """
    edges = []
    for i in range(len(boxes)):
        ax0, ay0, ax1, ay1 = boxes[i]
        for j in range(i + 1, len(boxes)):
            bx0, by0, bx1, by1 = boxes[j]
            overlap_y = min(ay1, by1) - max(ay0, by0)
            overlap_x = min(ax1, bx1) - max(ax0, bx0)
            h = max(heights[i], heights[j])
            same_line = (
                overlap_y >= 0.5 * min(heights[i], heights[j])
                and -overlap_x <= join_gap * h
                and h <= 2 * min(heights[i], heights[j])
            )
            if (overlap_x > 0 and overlap_y > 0) or same_line:
                edges.append((i, j))
    groups = components(len(boxes), edges)
    return [
        (
            (
                min(boxes[i][0] for i in g),
                min(boxes[i][1] for i in g),
                max(boxes[i][2] for i in g),
                max(boxes[i][3] for i in g),
            ),
            g,
        )
        for g in groups
    ]


def glyph_row(
    ink: np.ndarray,
    floor: float,
    *,
    min_px: int = 6,
    max_px: int = 60,
    min_glyphs: int = 4,
    height_ratio: float = 1.5,
    baseline_tol: float = 0.1,
    max_gap: float = 0.8,
    max_stroke: float = 0.4,
    min_fill: float = 0.12,
    max_fill: float = 0.7,
) -> Box | None:
    """The longest row of character-like connected components in a stroke-contrast map, or None.

    ``ink`` (rows, cols float) is a top-hat (stroke contrast, display levels) of one text polarity; strokes are
    the pixels at or above ``max(floor, 0.5 x its 99th percentile)`` (8-connected components). A component is
    character-like when it is ``min_px``..``max_px`` high, 0.15..1.6 x its height wide, fills ``min_fill``..
    ``max_fill`` of its box (strokes, not blobs) and its stroke width (twice the largest Euclidean distance to
    the background, :func:`scipy.ndimage.distance_transform_edt`) is at most ``max_stroke`` x its height.
    A row is at least ``min_glyphs`` such components in reading order with heights within ``height_ratio`` of
    the row's median, bottoms (baseline) and tops (cap line: glyphs of one case) within ``baseline_tol`` x the
    median height of the row's first component's, and gaps of at most ``max_gap`` x the median height: the regular
    baseline, heights and spacing of printed text (the usual connected-component text test, e.g. Epshtein et al., CVPR
    2010, section 3.3).

    Returns the row's box [x0, y0, x1, y1] in ``ink`` pixels (exclusive ends).
    """
    if ink.size == 0:
        return None
    thr = max(floor, 0.5 * float(np.percentile(ink, 99)))
    mask = ink >= thr
    lab, n = ndi.label(mask, structure=np.ones((3, 3), bool))
    if n < min_glyphs:
        return None
    glyphs = []
    for i, sl in enumerate(ndi.find_objects(lab), start=1):
        if sl is None:
            continue
        h, w = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        if not (min_px <= h <= max_px and 0.15 * h <= w <= 1.6 * h):
            continue
        comp = lab[sl] == i
        fill = float(comp.mean())
        if not min_fill <= fill <= max_fill:
            continue
        stroke = 2.0 * float(ndi.distance_transform_edt(np.pad(comp, 1)).max())
        if stroke > max_stroke * h:
            continue
        glyphs.append((sl[1].start, sl[0].start, sl[1].stop, sl[0].stop))
    if len(glyphs) < min_glyphs:
        return None
    glyphs.sort()
    best: list[Box] = []
    for s in range(len(glyphs)):  # greedy chains from each start, in reading order
        row = [glyphs[s]]
        for g in glyphs[s + 1 :]:
            last = row[-1]
            hs = sorted(b[3] - b[1] for b in row)
            hm = hs[len(hs) // 2]
            gh = g[3] - g[1]
            gap = g[0] - last[2]
            if gap > max_gap * hm:
                if g[0] - last[2] > 3 * max_px:
                    break
                continue
            if (
                gap >= -0.1 * hm
                and max(gh, hm) <= height_ratio * min(gh, hm)
                and abs(g[3] - row[0][3]) <= max(1.0, baseline_tol * hm)
                and abs(g[1] - row[0][1]) <= max(1.0, baseline_tol * hm)
            ):
                row.append(g)
        if len(row) > len(best):
            best = row
    if len(best) < min_glyphs:
        return None
    return (min(b[0] for b in best), min(b[1] for b in best), max(b[2] for b in best), max(b[3] for b in best))


def trim_to_ink(
    frame: np.ndarray,
    box: Box,
    k: int,
    floor: float,
    share: float,
    margin: int,
    *,
    vertical: bool = False,
    along_share: float | None = None,
) -> list[Box]:
    """A blank box shrunk to the text lines inside it, each plus ``margin`` pixels, never grown.

    ``frame`` (rows, cols uint8) is the displayed frame, ``box`` [x0, y0, x1, y1] in its pixels, ``vertical``
    when its text runs top to bottom. A pixel's ink is its distance from its local background (the median of a
    ``k`` x ``k`` square, read on the box widened by ``k`` so its edges see their background; text covers well
    under half of a square), in display levels. Across the reading direction, the rows (columns, for vertical
    text) holding strokes, ink of at least ``max(floor, share x`` its 99.5th percentile in the box``)``, form
    bands (runs, gaps of up to ``margin`` closed); along it, each band keeps the span from its first to its last
    pixel of ink over ``max(floor, along_share x`` that percentile``)`` (default ``share``): a low share there
    keeps the faint end of a line whose contrast fades along it. The glyphs' outline, shadow and anti-aliased
    edges lie within ``margin``. What holds no stroke is background the line margins took in and keeps its
    pixels. A box with no stroke at all is returned whole (fail closed: nothing to measure it by). Returns one
    box per band, [x0, y0, x1, y1] each.
    """
    rows, cols = frame.shape
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return [box]
    wx0, wy0, wx1, wy1 = max(0, x0 - k), max(0, y0 - k), min(cols, x1 + k), min(rows, y1 + k)
    window = frame[wy0:wy1, wx0:wx1].astype(np.float32)
    ink = np.abs(window - ndi.median_filter(window, size=(k, k)))[y0 - wy0 : y1 - wy0, x0 - wx0 : x1 - wx0]
    if vertical:
        ink = ink.T  # (across, along)
    top = float(np.percentile(ink, 99.5))
    strokes = ink >= max(floor, share * top)
    faint = ink >= max(floor, (share if along_share is None else along_share) * top)
    held = strokes.any(axis=1)
    if not held.any():
        return [box]
    held = ndi.binary_closing(np.pad(held, margin), structure=np.ones(margin + 1))[margin:-margin] if margin else held
    across0, along0 = (x0, y0) if vertical else (y0, x0)
    across1, along1 = (x1, y1) if vertical else (y1, x1)
    out: list[Box] = []
    for r0, r1 in zip(*runs(held)):
        c = np.flatnonzero(faint[r0:r1].any(axis=0))
        if not c.size:
            continue
        a0, a1 = max(across0, across0 + int(r0) - margin), min(across1, across0 + int(r1) + margin)
        b0, b1 = max(along0, along0 + int(c[0]) - margin), min(along1, along0 + int(c[-1]) + 1 + margin)
        out.append((a0, b0, a1, b1) if vertical else (b0, a0, b1, a1))
    return out or [box]


def stroke_value(
    stored: np.ndarray, frame: np.ndarray, box: Box, k: int, *, min_mode_share: float, max_frame_share: float
) -> int | None:
    """The one stored value a text line is drawn in, or None when it has none.

    Burned-in annotations are rendered in one colour: the cores of their glyphs hold one stored value, the
    anti-aliased edges values between it and the background. ``stored`` (rows, cols integer stored values) and
    ``frame`` (its displayed uint8 copy) are one frame, ``box`` [x0, y0, x1, y1] a text line in their pixels.
    The strokes are the pixels of the box whose ink (distance from the median of their ``k`` x ``k`` square,
    display levels) reaches half its 99th percentile; their most common stored value is the line's value when
    it holds ``min_mode_share`` of them or more (anatomy's texture has no such mode) and at most
    ``max_frame_share`` of the whole frame (a value the background or the anatomy is made of does not mark
    text).
    """
    if not np.issubdtype(stored.dtype, np.integer):
        return None
    rows, cols = frame.shape
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return None
    wx0, wy0, wx1, wy1 = max(0, x0 - k), max(0, y0 - k), min(cols, x1 + k), min(rows, y1 + k)
    window = frame[wy0:wy1, wx0:wx1].astype(np.float32)
    ink = np.abs(window - ndi.median_filter(window, size=(k, k)))[y0 - wy0 : y1 - wy0, x0 - wx0 : x1 - wx0]
    top = float(np.percentile(ink, 99))
    if top <= 0:
        return None
    core = stored[y0:y1, x0:x1][ink >= 0.5 * top]
    values, counts = np.unique(core, return_counts=True)
    v = values[int(np.argmax(counts))]
    if counts.max() < min_mode_share * core.size:
        return None
    if float(np.count_nonzero(stored == v)) > max_frame_share * stored.size:
        return None
    return int(v)


def extend_over_value(
    stored: np.ndarray, box: Box, value: int, height: int, *, vertical: bool, gap: float, reach: float, margin: int
) -> Box:
    """A text line's box grown over the pixels of its stroke value (:func:`stroke_value`) that continue it.

    Along the reading direction, the box's band of rows (columns, for vertical text) grows while its columns
    hold a pixel of ``value``, over gaps of up to ``gap`` x ``height`` (pixels, the line height), at most
    ``reach`` x ``height`` per side; across it, each edge moves while the next row of the grown span holds two
    pixels of ``value`` or more. The edges that moved get ``margin`` pixels. Text whose contrast fades into its
    background (a name running onto bright anatomy) is still drawn in its value where the display no longer
    shows it. ``stored`` (rows, cols) integer stored values. Returns the box [x0, y0, x1, y1] (never smaller).
    """
    hit = stored == value
    if vertical:
        hit = hit.T
        box = (box[1], box[0], box[3], box[2])
    n_across, n_along = hit.shape
    b0, a0, b1, a1 = box  # along: b0..b1, across: a0..a1
    has = hit[a0:a1].any(axis=0)
    g, r = max(2, int(gap * height)), int(reach * height)

    def walk(start: int, step: int, limit: int) -> int:  # the new edge (exclusive going up) from ``start``
        edge, miss, i = (start if step > 0 else start + 1), 0, start
        while (i < limit) if step > 0 else (i >= limit):
            miss = 0 if has[i] else miss + 1
            if miss > g:
                break
            if has[i]:
                edge = i + 1 if step > 0 else i
            i += step
        return edge

    nb1 = walk(b1, 1, min(n_along, b1 + r))
    nb0 = walk(b0 - 1, -1, max(0, b0 - r))
    na0, na1 = a0, a1
    while na0 > 0 and int(hit[na0 - 1, nb0:nb1].sum()) >= 2:
        na0 -= 1
    while na1 < n_across and int(hit[na1, nb0:nb1].sum()) >= 2:
        na1 += 1
    nb0, nb1 = (max(0, nb0 - margin) if nb0 < b0 else nb0), (min(n_along, nb1 + margin) if nb1 > b1 else nb1)
    na0, na1 = (max(0, na0 - margin) if na0 < a0 else na0), (min(n_across, na1 + margin) if na1 > a1 else na1)
    return (na0, nb0, na1, nb1) if vertical else (nb0, na0, nb1, na1)
