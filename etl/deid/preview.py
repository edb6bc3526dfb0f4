"""What a curator sees of a file quarantined ``burned_in_text_remaining`` or ``defacing_failed``: the de-identified
pixels as they stood when the check failed (text blanked, or the face set to air), with the boxes that failed.

A :class:`Preview` is made where the check fails (:mod:`etl.deid.burned_in_text`: the cleaned frame and the boxes
of the lines still read; :mod:`etl.deid.deface_series`: a sagittal and an axial view of the defaced volume through
the face region, its box drawn) and travels on the error. The deidentify stage renders it (:func:`render_png`) into
the restricted ledger zone (:func:`etl.zones.quarantine_preview`, one PNG per quarantined source file by its
SHA-256); only the review app serves it, behind its login. The pixels may still show PHI (that is why the file was
quarantined): a preview is never written to ``reports/`` nor to the static dashboard.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np

#: quarantine reasons whose files get a preview
PREVIEW_REASONS = frozenset({"burned_in_text_remaining", "defacing_failed"})
#: colour of a box that failed (text still read, the face region): red
FAILED_RGB = (230, 30, 30)
#: colour of a box that was blanked and passed: cyan
BLANKED_RGB = (0, 190, 220)
#: longest side of one rendered view (pixels): larger views are reduced, smaller ones enlarged to at least half
MAX_SIDE_PX = 768


@dataclass
class PreviewView:
    """One displayed image of a preview.

    Attributes
    ----------
    label : str
        what it shows (``frame 0``, ``sagittal``, ``axial``).
    image : numpy.ndarray
        (rows, cols) uint8, the displayed grey values (VOI window applied).
    failed : list of (x0, y0, x1, y1)
        boxes (pixels of ``image``, exclusive ends) that failed the check: drawn red.
    blanked : list of (x0, y0, x1, y1)
        boxes that were blanked: drawn cyan.
    """

    label: str
    image: np.ndarray
    failed: list[tuple[int, int, int, int]] = field(default_factory=list)
    blanked: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class Preview:
    """The views of one quarantined file (:class:`PreviewView`), left to right."""

    views: list[PreviewView]


def window(values: np.ndarray) -> np.ndarray:
    """Grey values (any numeric dtype, 2D) to uint8 with the 0.5-99.5 percentile window (a flat image: mid grey)."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = np.percentile(v, [0.5, 99.5]) if v.size else (0.0, 1.0)
    if hi <= lo:
        return np.full(v.shape, 128, np.uint8)
    return np.clip((v - lo) * (255.0 / (hi - lo)), 0, 255).astype(np.uint8)


def render_png(preview: Preview, max_side: int = MAX_SIDE_PX) -> bytes:
    """The views side by side on a dark strip, each labelled; failed boxes red (2 px, drawn 4 px outside the box so
    what failed stays readable), blanked boxes cyan (1 px).

    Parameters
    ----------
    preview : Preview
    max_side : int
        longest side of a view in the PNG (pixels).

    Returns
    -------
    bytes
        an RGB PNG (Pillow).
    """
    from PIL import Image, ImageDraw

    tiles = []
    for view in preview.views:
        img = Image.fromarray(np.ascontiguousarray(view.image, dtype=np.uint8), "L").convert("RGB")
        h, w = view.image.shape[:2]
        scale = min(max_side / max(h, w), max(1.0, (max_side / 2) / max(h, w)))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        img = img.resize(size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.BILINEAR)
        draw = ImageDraw.Draw(img)
        for boxes, colour, width, pad in ((view.blanked, BLANKED_RGB, 1, 0), (view.failed, FAILED_RGB, 2, 4)):
            for x0, y0, x1, y1 in sorted(set(boxes)):  # failed boxes drawn around the text, never over it
                xy = (  # kept inside the view: a box at the image's edge stays visible
                    max(0, x0 * scale - pad - width),
                    max(0, y0 * scale - pad - width),
                    min(img.width - 1, max(x0 + 1, x1) * scale - 1 + pad + width),
                    min(img.height - 1, max(y0 + 1, y1) * scale - 1 + pad + width),
                )
                draw.rectangle(xy, outline=colour, width=width)
        draw.text((4, 2), view.label, fill=(255, 255, 0))
        tiles.append(img)
    gap = 8
    width = sum(t.width for t in tiles) + gap * (len(tiles) + 1)
    height = max((t.height for t in tiles), default=1) + 2 * gap
    canvas = Image.new("RGB", (width, height), (24, 38, 61))
    x = gap
    for t in tiles:
        canvas.paste(t, (x, gap))
        x += t.width + gap
    buf = io.BytesIO()
    canvas.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def volume_views(
    stored: np.ndarray,
    direction: np.ndarray,
    spacing: tuple[float, float, float],
    box: tuple[slice, slice, slice] | None = None,
) -> Preview:
    """A sagittal and an axial view of a volume through the centre of ``box`` (else of the volume), oriented for
    reading (sagittal: superior up, anterior left; axial: anterior up, the patient's right on the left), resampled
    to square pixels, with ``box`` drawn red on each.

    Parameters
    ----------
    stored : numpy.ndarray
        (slices, rows, cols) values (any numeric dtype; windowed per view by :func:`window`).
    direction : numpy.ndarray
        (3, 3) LPS direction cosines of the array's columns, rows and slices axes, as columns (SimpleITK's
        direction of the stack: ``[row, col, normal]``).
    spacing : (float, float, float)
        mm between columns, rows and slices.
    box : tuple of three slices, optional
        the face region (a box of the array).

    Returns
    -------
    Preview
        two views, ``sagittal`` then ``axial``; the plane nearest to each is chosen by the direction cosines
        (an oblique stack is shown along its nearest array axes).
    """
    from scipy import ndimage

    d = np.asarray(direction, float).reshape(3, 3)
    # array axis k (0 slices, 1 rows, 2 cols) -> its direction cosine vector and mm spacing
    vec = {0: d[:, 2], 1: d[:, 1], 2: d[:, 0]}
    mm = {0: float(spacing[2]), 1: float(spacing[1]), 2: float(spacing[0])}
    dominant = {k: int(np.argmax(np.abs(v))) for k, v in vec.items()}
    shape = stored.shape
    region = box or tuple(slice(0, n) for n in shape)
    views = []
    # sagittal: the plane across L/R (LPS x), vertical S up; axial: across S/I (z), vertical anterior up
    for label, across, vertical, flip_when_positive in (("sagittal", 0, 2, True), ("axial", 2, 1, False)):
        k = next((a for a in (0, 1, 2) if dominant[a] == across), None)
        if k is None:  # two array axes share the dominant direction (a strongly oblique stack)
            k = int(np.argmax([abs(vec[a][across]) for a in (0, 1, 2)]))
        rest = [a for a in (0, 1, 2) if a != k]
        centre = (region[k].start + region[k].stop - 1) // 2
        plane = np.take(stored, centre, axis=k)
        mask = np.zeros(plane.shape, bool)
        mask[region[rest[0]], region[rest[1]]] = box is not None
        v_axis = max(rest, key=lambda a: abs(vec[a][vertical]))
        if v_axis != rest[0]:
            plane, mask = plane.T, mask.T
        h_axis = rest[1] if v_axis == rest[0] else rest[0]
        # image rows run down to inferior (sagittal) or posterior (axial); columns run to posterior (sagittal) or
        # to the patient's left (axial): both +LPS, so a column axis running the other way is flipped
        if (vec[v_axis][vertical] > 0) == flip_when_positive:
            plane, mask = plane[::-1], mask[::-1]
        if vec[h_axis][int(np.argmax(np.abs(vec[h_axis])))] < 0:
            plane, mask = plane[:, ::-1], mask[:, ::-1]
        step = min(mm[v_axis], mm[h_axis]) or 1.0
        zoom = (mm[v_axis] / step, mm[h_axis] / step)
        if zoom != (1.0, 1.0):
            plane = ndimage.zoom(plane.astype(np.float32), zoom, order=1)
            mask = ndimage.zoom(mask.astype(np.uint8), zoom, order=0).astype(bool)
        failed = []
        if mask.any():
            rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
            failed = [(int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)]
        views.append(PreviewView(label, window(plane), failed))
    return Preview(views)
