"""Pixel helpers of the burned-in text search: the working copy, stroke-contrast pages and region merging.

:mod:`etl.deid.burned_in_text` finds candidate text lines with Tesseract's layout analysis only (no recognition)
on a working copy of each displayed frame, then recognises at full resolution only the candidate regions. This
module holds the numpy/scipy parts:

- :func:`work_factor` / :func:`downscale`: the working copy, block means of ``d`` x ``d`` pixels (small images
  are upscaled instead, see :func:`working_copy`), so a 2000 x 2000 radiograph is laid out at 1000 x 1000;
- :func:`ink_maps` / :func:`page`: white and black morphological top-hats, i.e. thin strokes brighter (darker)
  than their local background, as dark text on a light page (contrast under a floor left white), so low-contrast text on anatomy and text on a
  semi-transparent box read like black print (Gonzalez & Woods, *Digital Image Processing*, 9.6);
- :func:`merge_lines`: candidate line boxes merged where they overlap or continue one line, so each region is
  recognised once.
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
    return frame[:r, :c].reshape(r // d, d, c // d, d).mean(axis=(1, 3), dtype=np.float32)


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


def merge_lines(boxes: list[Box], heights: list[int], join_gap: float) -> list[tuple[Box, list[int]]]:
    """Line boxes merged into regions where they overlap, or where they lie on one line (overlapping by half
    the smaller height across, similar height, gap under ``join_gap`` x the taller height along).

    Returns (merged box, indices of the input boxes in it) pairs.
    """
    n = len(boxes)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        ax0, ay0, ax1, ay1 = boxes[i]
        for j in range(i + 1, n):
            bx0, by0, bx1, by1 = boxes[j]
            overlap_y = min(ay1, by1) - max(ay0, by0)
            overlap_x = min(ax1, bx1) - max(ax0, bx0)
            h = max(heights[i], heights[j])
            same_line = (overlap_y >= 0.5 * min(heights[i], heights[j])
                         and -overlap_x <= join_gap * h and h <= 2 * min(heights[i], heights[j]))
            if (overlap_x > 0 and overlap_y > 0) or same_line:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return [((min(boxes[i][0] for i in g), min(boxes[i][1] for i in g), max(boxes[i][2] for i in g),
              max(boxes[i][3] for i in g)), g) for g in groups.values()]
