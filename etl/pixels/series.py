"""A shard's de-identified instances to image rows: the series rules between the instances and the images table.

Which instances become one volume and which stay 2D images is decided here, not in the stage:

- 2D objects (CR, DX, MG, US, XA, RF, single frames: :func:`etl.pixels.normalise.image_kind` ``2d``) give one
  image each (:func:`etl.pixels.normalise.normalise_2d`);
- CT/MR slices (``3d_slice``) are grouped by series; a series of several slices becomes one volume
  (:func:`etl.pixels.normalise.normalise_volume`, CT resampled to ``ct_spacing_mm``), and so does an enhanced
  multi-frame CT/MR object (one file, the whole volume: every frame, placed by its Plane Position / Orientation
  functional groups); a one-slice, one-frame series is a 2D image;
- a series whose slices (or frames) do not stack (``inconsistent_series``: repeated positions, re-encoded copies) falls
  back to one 2D image per slice; slices the volume left out (localizers, another matrix or orientation) become 2D
  images too, so no decodable instance vanishes;
- an image object without pixels (``none`` kind of an Image Storage class) and any normalisation error are
  failures with the reason code of :class:`etl.pixels.decode.NormalisationError`, for the quarantine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydicom.dataset import Dataset

from etl.pixels.decode import n_frames
from etl.pixels.normalise import (
    NormalisationError,
    check_image_has_pixels,
    image_kind,
    normalise_2d,
    normalise_volume,
)
from schemas.config import NormalisationConfig

#: what :func:`normalise_instances` hands each volume row to (row in, row out)
VolumeSink = Callable[[dict[str, Any]], dict[str, Any]]
#: reads one instance row's de-identified file (the dataset, or the exception its parse raised)
Reader = Callable[[dict[str, Any]], "Dataset | Exception"]


@dataclass(frozen=True)
class NormalisedImage:
    """One row of the ``images`` table and the anatomical plane of its series.

    Attributes
    ----------
    row : dict
        the images-table row (columns of :mod:`schemas.images`; ``payload`` holds the PNG or ``.npy`` bytes).
    orientation : str or None
        ``axial`` / ``coronal`` / ``sagittal`` of a volume's slices (for the ``series`` table), else None.
    """

    row: dict[str, Any]
    orientation: str | None = None


@dataclass(frozen=True)
class PixelFailure:
    """Instances that cannot be normalised: their ``sop_key``s, the reason code and a PHI-free detail."""

    sop_keys: tuple[str, ...]
    reason: str
    detail: str


@dataclass
class ShardPixels:
    """What :func:`normalise_instances` made of one shard: image rows, failures and per-series instance counts."""

    images: list[NormalisedImage] = field(default_factory=list)
    failures: list[PixelFailure] = field(default_factory=list)
    #: series_key -> the first instance row of the series, with ``n`` its number of instances
    series: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fail(self, sop_keys: Iterable[str], err: Exception, reason: str) -> None:
        """Record a failure (the detail is the error's message, cut to 300 characters)."""
        self.failures.append(PixelFailure(tuple(sop_keys), reason, str(err)[:300]))

    def series_rows(self, shard: int) -> list[dict[str, Any]]:
        """Rows of the ``series`` table (:mod:`schemas.series`), sorted by ``series_key``; spacing and orientation
        from the series' first image row."""
        first: dict[str, NormalisedImage] = {}
        for image in self.images:
            first.setdefault(image.row["series_key"], image)
        rows = []
        for key, m in sorted(self.series.items()):
            img = first.get(key)
            rows.append(
                {
                    "series_key": key,
                    "study_key": m["study_key"],
                    "patient_key": m["patient_key"],
                    "institution": m["institution"],
                    "modality": m["modality"],
                    "view_position": m["view_position"],
                    "orientation": img.orientation if img else None,
                    "spacing_mm": img.row["spacing_mm"] if img else None,
                    "n_instances": m["n"],
                    "manufacturer": m["manufacturer"],
                    "model": m["model"],
                    "shard": shard,
                }
            )
        return rows


def volume_image_key(series_key: str) -> str:
    """``image_key`` of a series' volume: the first 16 hex digits of sha256(``"volume|" + series_key``)."""
    return hashlib.sha256(("volume|" + series_key).encode()).hexdigest()[:16]


def image_row(instance: dict[str, Any], res: dict[str, Any], image_key: str, kind: str) -> NormalisedImage:
    """The images-table row of one normalisation result.

    Parameters
    ----------
    instance : dict
        the ``instances`` row the image comes from (the first slice's for a volume).
    res : dict
        the result of :func:`etl.pixels.normalise.normalise_2d` or :func:`~etl.pixels.normalise.normalise_volume`.
    image_key : str
        the SOP key of a 2D image, :func:`volume_image_key` of a volume.
    kind : {"2d", "3d"}
    """
    row = {
        "image_key": image_key,
        "series_key": instance["series_key"],
        "study_key": instance["study_key"],
        "patient_key": instance["patient_key"],
        "institution": instance["institution"],
        "modality": instance["modality"],
        "view": res.get("view") or (res.get("orientation") if kind == "3d" else None),
        "kind": kind,
        "rows": res["rows"],
        "cols": res["cols"],
        "n_slices": res.get("n_slices", 1),
        "spacing_mm": res.get("spacing_mm"),
        "payload_format": res["payload_format"],
        "payload": res["payload"],
        "payload_sha256": res.get("payload_sha256") or hashlib.sha256(res["payload"]).hexdigest(),
        "payload_bytes": len(res["payload"]),
        "shape": res.get("shape"),
        "dtype": res.get("dtype"),
        "origin_mm": res.get("origin_mm"),
        "direction": res.get("direction"),
        "recipe": res["recipe"],
        "transfer_syntax": instance["transfer_syntax"],
        "shard": instance["shard"],
    }
    return NormalisedImage(row, res.get("orientation"))


def _as_2d(out: ShardPixels, instance: dict[str, Any], ds: Dataset, cfg: NormalisationConfig) -> None:
    try:
        out.images.append(image_row(instance, normalise_2d(ds, cfg), instance["sop_key"], "2d"))
    except NormalisationError as err:
        out.fail([instance["sop_key"]], err, err.reason)


def _series(
    out: ShardPixels,
    series_key: str,
    members: list[tuple[dict[str, Any], Dataset]],
    cfg: NormalisationConfig,
    volume_sink: VolumeSink | None = None,
) -> None:
    sops = [r["sop_key"] for r, _ in members]
    if len(members) == 1 and n_frames(members[0][1]) < 2:  # one classic slice
        _as_2d(out, members[0][0], members[0][1], cfg)
        return
    target = cfg.ct_spacing_mm if members[0][0]["modality"] == "CT" else None
    try:
        res = normalise_volume([d for _, d in members], cfg, target_spacing_mm=target)
    except NormalisationError as err:
        if err.reason != "inconsistent_series":
            out.fail(sops, err, err.reason)
            return
        for r, d in members:  # slices that do not stack: keep each as a 2D image
            _as_2d(out, r, d, cfg)
        return
    img = image_row(members[0][0], res, volume_image_key(series_key), "3d")
    excluded = res.get("excluded") or []
    del res  # the volume's only reference is now the row (the sink may drop it)
    if volume_sink is not None:  # the volume leaves memory now (e.g. written as a NIfTI object)
        img = NormalisedImage(volume_sink(img.row), img.orientation)
    out.images.append(img)
    # slices left out of the volume (localizers, another matrix or orientation) become 2D images
    for ex in {e["index"]: e for e in excluded if e.get("frame") in (None, 0)}.values():
        r, d = members[ex["index"]]
        _as_2d(out, r, d, cfg)


def normalise_instances(
    items: Iterable[tuple[dict[str, Any], Dataset | Exception]],
    cfg: NormalisationConfig,
    volume_sink: VolumeSink | None = None,
    reread: Reader | None = None,
) -> ShardPixels:
    """Normalise a shard's de-identified instances into image rows (the rules of the module docstring).

    Parameters
    ----------
    items : iterable of (instance row, dataset or exception)
        each ``instances`` row (sorted by ``sop_key`` for a deterministic result) with its parsed de-identified
        dataset, or the exception raised while reading it (recorded as ``truncated_file``).
    cfg : NormalisationConfig
    volume_sink : callable, optional
        called with each volume's images row (``.npy`` payload) as soon as it is made; its result replaces the
        row (the normalise task passes :func:`etl.pixels.volume_objects.externalise_volume`, so a shard holds
        one volume's pixels at a time). Default: rows keep their ``.npy`` payloads.
    reread : callable, optional
        the reader that gave ``items`` (instance row -> dataset or exception). When given, a CT/MR slice's dataset
        is let go once its kind is known and read again when its series is normalised, so a shard holds the
        slices of one series at a time (the normalise task passes it); otherwise every slice of the shard is held
        until the series are normalised.

    Returns
    -------
    ShardPixels
        image rows in order (2D images as met, then volumes and their fallbacks by ``series_key``), failures,
        and the instance count of every series with at least one readable instance.
    """
    out = ShardPixels()
    slice_rows: dict[str, list[dict[str, Any]]] = {}  # series_key -> its CT/MR slices' rows
    held: dict[str, Dataset] = {}  # sop_key -> dataset, without ``reread`` only
    for row, ds in items:
        if isinstance(ds, Exception):  # our own output that does not parse
            out.fail([row["sop_key"]], ds, "truncated_file")
            continue
        kind = image_kind(ds)
        if kind == "none":
            try:  # an image object without pixels must not vanish from its series
                check_image_has_pixels(ds)
            except NormalisationError as err:
                out.fail([row["sop_key"]], err, err.reason)
                continue
        meta = out.series.setdefault(row["series_key"], {**row, "n": 0})
        meta["n"] += 1
        if kind == "3d_slice":
            slice_rows.setdefault(row["series_key"], []).append(row)
            if reread is None:
                held[row["sop_key"]] = ds
        elif kind == "2d":
            _as_2d(out, row, ds, cfg)
        del ds  # a slice read again later is not held meanwhile
    for series_key in sorted(slice_rows):
        rows = slice_rows.pop(series_key)
        if reread is None:
            members = [(r, held.pop(r["sop_key"])) for r in rows]
        else:
            members = _read_again(out, rows, reread)
        if members:
            _series(out, series_key, members, cfg, volume_sink)
        del members
    return out


def _read_again(out: ShardPixels, rows: list[dict[str, Any]], reread: Reader) -> list[tuple[dict[str, Any], Dataset]]:
    """The slices of one series (their instance rows) read again (:func:`normalise_instances` ``reread``); a slice
    that no longer parses is a ``truncated_file`` failure, as on its first read."""
    members = []
    for row in rows:
        ds = reread(row)
        if isinstance(ds, Exception):
            out.fail([row["sop_key"]], ds, "truncated_file")
        else:
            members.append((row, ds))
    return members


def normalise_shard_guarded(rows: list[dict], read, cfg, volume_sink=None):
    """:func:`normalise_instances` over a shard's instances, where no instance can fail the task.

    When the shard's pass raises (an error the series rules did not foresee), each series is normalised on its
    own and a series that raises again becomes one failure of all its instances, reason ``normalisation_error``
    (the exception's type only: its text may quote a value). ``volume_sink`` is handed to
    :func:`normalise_instances` (volume objects are content-addressed, so a series normalised
    again writes the same object). Returns the :class:`ShardPixels` of the shard.
    """
    try:
        return normalise_instances(((row, read(row)) for row in rows), cfg, volume_sink=volume_sink, reread=read)
    except Exception:  # noqa: BLE001  retried series by series below, so the culprit is found
        pass
    out = ShardPixels()
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["series_key"], []).append(row)
    for _, members in sorted(groups.items()):
        try:
            part = normalise_instances(((row, read(row)) for row in members), cfg, volume_sink=volume_sink, reread=read)
        except Exception as err:  # noqa: BLE001  this series is quarantined, the others go on
            out.failures.append(
                PixelFailure(
                    tuple(r["sop_key"] for r in members),
                    "normalisation_error",
                    f"{type(err).__name__} while normalising the series",
                )
            )
            continue
        out.images.extend(part.images)
        out.failures.extend(part.failures)
        out.series.update(part.series)
    return out
