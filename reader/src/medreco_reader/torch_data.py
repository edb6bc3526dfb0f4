"""PyTorch datasets over a published snapshot: images, longitudinal pairs and VQA items, in fixed shapes.

Pixels are decoded lazily (:func:`medreco_reader.tensors.to_tensor`, the reader package's decoder), one payload at
a time: the datasets index the ``images`` table's metadata columns once and fetch a payload by reading only the
Parquet row group that holds it (or the volume object). They work on local disk and on S3, and pickle cleanly for
``DataLoader(num_workers=N)`` (open files are per process).

**Batches that just work.** By default (``fixed_shape=True``) every item has the same tensor shapes and only
strings, numbers and tensors, so PyTorch's *default* collate stacks any batch (:class:`TensorShape`, from the
config's ``batches:`` section, the project's ``BatchConfig``):

- 2D images: float32 ``(channels, rows, cols)`` in 0..1: resized with the aspect kept (bilinear, antialiased) and
  zero padded to ``image_size`` (by default the release's largest stored size, so its PNGs are kept as they are); grey
  repeated to 3 channels or RGB averaged to 1 (ITU-R BT.601 luma) as ``channels`` says;
- volumes: float32 ``(1, slices, rows, cols)`` (channel first, as MONAI's networks take it), centre cropped or
  padded to ``volume_shape`` (by default the release's largest stored volume) with the pad value of the modality
  (CT -1000 HU, air; MR 0); ``valid`` (int64 ``(3, 2)``) is the ``[start, stop)`` of the data per axis in the output;
- lists become fixed-size fields: ``change_labels``, ``options`` and ``entity_ids`` as JSON text, VQA images as a
  ``(2, ...)`` stack with ``image_mask`` (bool ``(2,)``: single-image items fill slot 0), a missing view or
  split as ``""``, an unknown spacing as NaN.

A dataset serves one ``kind`` (``"2d"`` by default, or ``"3d"``): a batch of 2D images and volumes cannot stack;
pairs and VQA items left out for images of the other kind are counted in a ``UserWarning``. An unknown ``split`` name
raises ``ValueError`` naming the valid ones (:data:`SPLITS`).
``fixed_shape=False`` returns the stored sizes and lists (use :func:`collate` then, which keeps what does not
stack as lists).

>>> from medreco_reader import load_snapshot                   # doctest: +SKIP
>>> from medreco_reader.torch_data import PairDataset
>>> loader = torch.utils.data.DataLoader(PairDataset(load_snapshot("/data/medreco"), split="train"),
...                                      batch_size=8, num_workers=2)   # default collate
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from medreco_reader.images import index_by_study, pair_images, representative, vqa_images
from medreco_reader.snapshot import Snapshot, release_files
from medreco_reader.tensors import to_tensor

#: metadata columns of ``images`` kept in memory (everything but the payload)
IMAGE_COLUMNS = (
    "image_key",
    "series_key",
    "study_key",
    "patient_key",
    "institution",
    "modality",
    "view",
    "kind",
    "rows",
    "cols",
    "n_slices",
    "spacing_mm",
    "payload_format",
    "shape",
    "dtype",
    "origin_mm",
    "direction",
    "recipe",
)
#: read as well where the release has them (images schema 2.0: volumes as objects under the storage root)
OBJECT_COLUMNS = ("payload_uri", "payload_sha256")
_PAYLOAD_COLUMNS = ["payload", "payload_format"]
#: value of voxels a volume is padded with, by modality (CT: air in HU); others 0
PAD_VALUE = {"CT": -1000.0}
#: ITU-R BT.601 luma weights (RGB -> one channel)
_LUMA = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)


@dataclass(frozen=True)
class TensorShape:
    """The fixed shapes of the datasets' tensors.

    Attributes
    ----------
    channels : int
        1 or 3 (2D images).
    image_size : (int, int)
        2D rows, cols in pixels.
    volume_shape : (int, int, int)
        slices, rows, cols in voxels.
    """

    channels: int = 1
    image_size: tuple[int, int] = (480, 480)
    volume_shape: tuple[int, int, int] = (240, 480, 480)

    @classmethod
    def from_release(cls, rows: Sequence[dict[str, Any]], channels: int = 1) -> TensorShape:
        """The shapes that hold every image of a release as stored, without resizing: ``image_size`` the largest
        rows and cols of its 2D images, ``volume_shape`` the largest slices, rows and cols of its volumes (the
        defaults where it has none). What a dataset uses when no ``shape`` is given.

        Parameters
        ----------
        rows : sequence of dict
            ``images`` metadata rows (``kind``, ``rows``, ``cols``, ``n_slices``), e.g. :attr:`ImageStore.rows`.
        channels : int
            1 or 3.
        """
        flat = [r for r in rows if r.get("kind") != "3d" and r.get("rows") and r.get("cols")]
        vols = [r for r in rows if r.get("kind") == "3d" and r.get("rows") and r.get("cols") and r.get("n_slices")]
        size = (max(int(r["rows"]) for r in flat), max(int(r["cols"]) for r in flat)) if flat else cls.image_size
        volume = (
            (
                max(int(r["n_slices"]) for r in vols),
                max(int(r["rows"]) for r in vols),
                max(int(r["cols"]) for r in vols),
            )
            if vols
            else cls.volume_shape
        )
        return cls(channels, size, volume)

    @classmethod
    def from_config(cls, config: Any = None) -> TensorShape:
        """From a pipeline config's ``batches:`` section (the project's ``PipelineConfig``: ``image_size`` null
        means ``normalisation.image_size``), a ``BatchConfig`` (an object with ``channels``, ``image_size``,
        ``volume_shape``), or None: the defaults. Read by attribute, so the reader needs none of the project."""
        if config is None:
            return cls()
        batches = getattr(config, "batches", config)
        normalisation = getattr(config, "normalisation", None)
        size = batches.image_size or (normalisation.image_size if normalisation is not None else cls.image_size)
        return cls(
            int(batches.channels),
            (int(size[0]), int(size[1])),
            (int(batches.volume_shape[0]), int(batches.volume_shape[1]), int(batches.volume_shape[2])),
        )


def fit_image(t: torch.Tensor, size: tuple[int, int], channels: int) -> torch.Tensor:
    """A 2D image ``(c, rows, cols)`` in 0..1 -> ``(channels, *size)``: resized with the aspect kept (bilinear,
    antialiased; never when it already fits exactly) and zero padded, centred; channels repeated or averaged."""
    if t.shape[0] != channels:
        t = t.repeat(channels, 1, 1) if t.shape[0] == 1 else (t[:3] * _LUMA).sum(0, keepdim=True)
    rows, cols = int(t.shape[1]), int(t.shape[2])
    if (rows, cols) == tuple(size):
        return t
    scale = min(size[0] / rows, size[1] / cols)
    new = (max(1, min(size[0], round(rows * scale))), max(1, min(size[1], round(cols * scale))))
    if new != (rows, cols):
        t = F.interpolate(t[None], size=new, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)
    out = t.new_zeros((t.shape[0], *size))
    r0, c0 = (size[0] - new[0]) // 2, (size[1] - new[1]) // 2
    out[:, r0 : r0 + new[0], c0 : c0 + new[1]] = t
    return out


def fit_volume(v: torch.Tensor, shape: tuple[int, int, int], pad_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A volume ``(slices, rows, cols)`` -> ``(1, *shape)``, centre cropped / padded with ``pad_value``; and the
    ``[start, stop)`` per axis (int64 ``(3, 2)``) of the output that holds data (no resampling: voxel spacing kept).
    """
    out = v.new_full(shape, pad_value)
    src, dst, valid = [], [], []
    for n, m in zip(v.shape, shape, strict=True):
        if n >= m:  # crop the centre
            a = (n - m) // 2
            src.append(slice(a, a + m))
            dst.append(slice(0, m))
            valid.append((0, m))
        else:  # pad around
            a = (m - n) // 2
            src.append(slice(0, n))
            dst.append(slice(a, a + n))
            valid.append((a, a + n))
    out[tuple(dst)] = v[tuple(src)]
    return out[None], torch.tensor(valid, dtype=torch.int64)


def _splits(snap: Snapshot) -> dict[str, str]:
    t = snap.read("splits", columns=["patient_key", "split"])
    return dict(zip(t["patient_key"].to_pylist(), t["split"].to_pylist(), strict=True))


#: the split names of a release (``splits`` table): patient-level train/val/test and the institution-held-out test
SPLITS = ("train", "val", "test", "external_test")


def _wanted(values: str | Sequence[str] | None) -> set[str] | None:
    if values is None:
        return None
    return {values} if isinstance(values, str) else set(values)


def _wanted_splits(split: str | Sequence[str] | None) -> set[str] | None:
    """The split names asked for, checked against :data:`SPLITS`.

    Raises
    ------
    ValueError
        naming the valid splits, for a name that is not one (``"validation"``, ``"Train"``): a typo must not
        become an empty dataset.
    """
    wanted = _wanted(split)
    unknown = sorted(wanted - set(SPLITS)) if wanted is not None else []
    if unknown:
        raise ValueError(f"unknown split {', '.join(map(repr, unknown))}: a release's splits are {', '.join(SPLITS)}")
    return wanted


def _vector(values: Any, n: int) -> torch.Tensor:
    vals = list(values or [])[:n]
    return torch.tensor(
        [float("nan") if v is None else float(v) for v in vals] + [float("nan")] * (n - len(vals)), dtype=torch.float64
    )


class ImageStore:
    """Random access to the ``images`` rows of a release: metadata in memory, payloads fetched on demand.

    Parameters
    ----------
    snapshot : Snapshot
        the release.
    cache_row_groups : int
        decoded-from-Parquet row groups kept per process (sequential access reads each group once).

    Attributes
    ----------
    rows : list of dict
        one dict per image (:data:`IMAGE_COLUMNS`), in the release's file order.
    by_study : dict
        study_key -> row indices in :func:`medreco_reader.images.study_order` (2D first, then by ``image_key``).
    index : dict
        image_key -> row index.
    """

    def __init__(self, snapshot: Snapshot, cache_row_groups: int = 2) -> None:
        self.fs = snapshot.storage.fs
        self.storage = snapshot.storage
        self.paths = [snapshot.storage.path(p) for p in release_files(snapshot.storage, snapshot.version, "images")]
        self.cache_row_groups = cache_row_groups
        self.rows: list[dict[str, Any]] = []
        self._where: list[tuple[int, int, int]] = []  # (file, row group, offset in group)
        for fi, path in enumerate(self.paths):
            with self.fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                cols = list(IMAGE_COLUMNS) + [c for c in OBJECT_COLUMNS if c in pf.schema_arrow.names]
                self.rows += pf.read(columns=cols).to_pylist()
                for rg in range(pf.metadata.num_row_groups):
                    self._where += [(fi, rg, i) for i in range(pf.metadata.row_group(rg).num_rows)]
        self.index = {r["image_key"]: i for i, r in enumerate(self.rows)}
        self.studies = index_by_study(self.rows)
        self.by_study = {s: [self.index[r["image_key"]] for r in rows] for s, rows in self.studies.items()}
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._files: dict[int, pq.ParquetFile] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"], state["_files"] = OrderedDict(), {}  # open files stay in their process
        return state

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int) -> dict[str, Any]:
        """The full row (metadata + ``payload`` bytes) of image ``index``; a volume stored as an object
        (``payload_uri``) comes with ``payload`` None (:meth:`tensor` reads the object)."""
        if self.rows[index].get("payload_uri"):
            return {**self.rows[index], "payload": None}
        fi, rg, off = self._where[index]
        group = self._cache.get((fi, rg))
        if group is None:
            pf = self._files.get(fi)
            if pf is None:
                pf = self._files[fi] = pq.ParquetFile(self.fs.open_input_file(self.paths[fi]))
            group = pf.read_row_group(rg, columns=_PAYLOAD_COLUMNS)
            self._cache[(fi, rg)] = group
            while len(self._cache) > self.cache_row_groups:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end((fi, rg))
        return {**self.rows[index], "payload": group["payload"][off].as_py()}

    def tensor(self, index: int) -> torch.Tensor:
        """Decoded pixels of image ``index`` at their stored size (:func:`medreco_reader.tensors.to_tensor`)."""
        return to_tensor(self.row(index), self.storage)

    def pick(self, study_key: str, modality: str | None = None, view: str | None = None) -> int | None:
        """The representative image of a study (:func:`medreco_reader.images.representative`: same modality and
        view when it has them, 2D first, then by key); None when the study has no image in the release."""
        r = representative(self.studies.get(study_key, []), modality, view)
        return None if r is None else self.index[r["image_key"]]


class _Base(Dataset):
    def __init__(
        self,
        snapshot: Snapshot,
        transform: Callable[[torch.Tensor], torch.Tensor] | None,
        store: ImageStore | None,
        kind: str | None,
        fixed_shape: bool,
        shape: TensorShape | Any,
    ) -> None:
        if kind not in ("2d", "3d", None):
            raise ValueError(f"kind must be '2d', '3d' or None, got {kind!r}")
        if fixed_shape and kind is None:
            raise ValueError("fixed_shape=True needs one kind ('2d' or '3d'): 2D images and volumes do not stack")
        self.snapshot = snapshot
        self.transform = transform
        self.store = store or ImageStore(snapshot)
        self.kind = kind
        self.fixed_shape = fixed_shape
        if isinstance(shape, TensorShape):
            self.shape = shape
        elif shape is None:
            self.shape = TensorShape.from_release(self.store.rows)
        else:
            self.shape = TensorShape.from_config(shape)
        #: ids of rows left out because an image they need is not in the release (or not of ``kind``)
        self.excluded: list[str] = []
        #: how many of ``excluded`` have all their images, of the other kind (see :meth:`_warn_other_kind`)
        self.other_kind = 0

    def _of_kind(self, indices: Sequence[int | None]) -> bool:
        if any(i is None for i in indices):
            return False
        if self.kind is None or all(self.store.rows[i]["kind"] == self.kind for i in indices):  # type: ignore[index]
            return True
        self.other_kind += 1
        return False

    def _warn_other_kind(self, what: str) -> None:
        """Warn (``UserWarning``) when items were left out only because their images are of the other kind: a
        ``kind="2d"`` dataset of a release with CT pairs must say that it serves part of them."""
        if self.other_kind:
            other = "3d" if self.kind == "2d" else "2d"
            warnings.warn(
                f"{self.other_kind} {what} with {other} images are left out of this kind={self.kind!r} "
                f"dataset (their ids are in .excluded); a dataset with kind={other!r} serves them",
                UserWarning,
                stacklevel=3,
            )

    def _image(self, index: int) -> dict[str, torch.Tensor]:
        """``image`` (and ``valid`` for volumes) of store row ``index``, fitted when ``fixed_shape``."""
        t = self.store.tensor(index)
        r = self.store.rows[index]
        out: dict[str, torch.Tensor] = {}
        if self.fixed_shape and r["kind"] == "3d":
            t, out["valid"] = fit_volume(t, self.shape.volume_shape, PAD_VALUE.get(r["modality"], 0.0))
        elif self.fixed_shape:
            t = fit_image(t, self.shape.image_size, self.shape.channels)
        out["image"] = self.transform(t) if self.transform else t
        return out

    def _blank(self) -> dict[str, torch.Tensor]:
        if self.kind == "3d":
            return {
                "image": torch.zeros((1, *self.shape.volume_shape)),
                "valid": torch.zeros((3, 2), dtype=torch.int64),
            }
        return {"image": torch.zeros((self.shape.channels, *self.shape.image_size))}

    def _meta(self, value: Any) -> Any:
        """A metadata value the default collate takes: None -> ``""``, lists -> JSON text (fixed shape only)."""
        if not self.fixed_shape:
            return value
        if value is None:
            return ""
        if isinstance(value, list | tuple | dict):
            return json.dumps(value, sort_keys=True)
        return value


class ImageDataset(_Base):
    """One item per row of the ``images`` table (of one ``kind``).

    Parameters
    ----------
    snapshot : Snapshot
    split : str or sequence of str, optional
        keep the images of patients in these splits (``train``, ``val``, ``test``, ``external_test``).
    modality : str or sequence of str, optional
        keep these modalities (DICOM Modality, e.g. ``CR``, ``CT``).
    transform : callable, optional
        applied to the image tensor (after fitting).
    store : ImageStore, optional
        share one index between datasets of the same release.
    kind : {"2d", "3d", None}
        which images (None: both, only with ``fixed_shape=False``).
    fixed_shape : bool
        fit every tensor to ``shape`` (module docstring); False: stored sizes, metadata as stored.
    shape : TensorShape or a config (see :meth:`TensorShape.from_config`), optional
        the shapes (default: :meth:`TensorShape.from_release`, the largest stored image and volume of the
        release, so nothing is resized or cropped).

    Items
    -----
    dict: ``image`` (tensor: 2D ``(channels, rows, cols)``, 3D ``(1, slices, rows, cols)``), ``valid`` (volumes),
    ``image_key``, ``study_key``, ``patient_key``, ``institution``, ``modality``, ``view``, ``kind``,
    ``spacing_mm`` (float64 (2,) or (3,), mm, NaN unknown; stored pixels' spacing before the fit), ``split``.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        split: str | Sequence[str] | None = None,
        modality: str | Sequence[str] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        store: ImageStore | None = None,
        kind: str | None = "2d",
        fixed_shape: bool = True,
        shape: TensorShape | Any = None,
    ) -> None:
        super().__init__(snapshot, transform, store, kind, fixed_shape, shape)
        self.split_of = _splits(snapshot)
        splits, modalities = _wanted_splits(split), _wanted(modality)
        self.indices = [
            i
            for i, r in enumerate(self.store.rows)
            if (splits is None or self.split_of.get(r["patient_key"]) in splits)
            and (modalities is None or r["modality"] in modalities)
            and self._of_kind([i])
        ]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        idx = self.indices[i]
        r = self.store.rows[idx]
        item: dict[str, Any] = {
            **self._image(idx),
            **{
                k: self._meta(r[k])
                for k in ("image_key", "study_key", "patient_key", "institution", "modality", "view", "kind")
            },
            "split": self._meta(self.split_of.get(r["patient_key"])),
        }
        item["spacing_mm"] = (
            _vector(r["spacing_mm"], 3 if r["kind"] == "3d" else 2) if self.fixed_shape else r["spacing_mm"]
        )
        return item


class PairDataset(_Base):
    """One item per longitudinal pair (``pairs`` table): the prior and current study's images.

    Each study is represented by one image of the pair's modality and view (the release's ``pair_images`` rule,
    :func:`medreco_reader.images.pair_images`); pairs with a study that has no image in the release, or an image
    of another ``kind``, are left out (their ids in ``excluded``).

    Parameters
    ----------
    snapshot, split, transform, store, kind, fixed_shape, shape
        as for :class:`ImageDataset` (``split`` by the pair's patient).

    Items
    -----
    dict: ``prior``, ``current`` (tensors, shapes as ``ImageDataset.image``), ``prior_valid`` / ``current_valid``
    (volumes), ``pair_id``, ``patient_key``, ``prior_study_key``, ``current_study_key``, ``prior_image_key``,
    ``current_image_key``, ``modality``, ``view``, ``gap_days`` (int, days), ``change_labels`` (JSON text of the
    list of {entity_id, change, source}; the list with ``fixed_shape=False``), ``split``.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        split: str | Sequence[str] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        store: ImageStore | None = None,
        kind: str | None = "2d",
        fixed_shape: bool = True,
        shape: TensorShape | Any = None,
    ) -> None:
        super().__init__(snapshot, transform, store, kind, fixed_shape, shape)
        split_of = _splits(snapshot)
        wanted = _wanted_splits(split)
        pairs = [
            p for p in snapshot.read("pairs").to_pylist() if wanted is None or split_of.get(p["patient_key"]) in wanted
        ]
        self.items: list[tuple[dict[str, Any], int, int]] = []
        for p, resolved in zip(pairs, pair_images(self.store.studies, pairs), strict=True):
            a, b = (
                self.store.index.get(resolved[k]) if resolved[k] else None
                for k in ("prior_image_key", "current_image_key")
            )
            if not self._of_kind([a, b]):
                self.excluded.append(p["pair_id"])
                continue
            self.items.append(({**p, "split": split_of.get(p["patient_key"])}, a, b))  # type: ignore[arg-type]
        self._warn_other_kind("pairs")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        p, a, b = self.items[i]
        out: dict[str, Any] = {}
        for name, idx in (("prior", a), ("current", b)):
            got = self._image(idx)
            out[name] = got["image"]
            if "valid" in got:
                out[f"{name}_valid"] = got["valid"]
            out[f"{name}_image_key"] = self.store.rows[idx]["image_key"]
        out.update(
            {
                k: self._meta(p[k])
                for k in (
                    "pair_id",
                    "patient_key",
                    "prior_study_key",
                    "current_study_key",
                    "modality",
                    "view",
                    "gap_days",
                    "change_labels",
                    "split",
                )
            }
        )
        return out


class VQADataset(_Base):
    """One item per VQA item (``vqa`` table): its images, question, options and answer.

    Its images are those of ``study_keys`` (``[study]`` or ``[prior, current]``), else of the pair or of
    ``study_key`` (the release's ``vqa_images`` rule, :func:`medreco_reader.images.vqa_images`). Items whose images
    are not in the release, or not of ``kind``, are left out (``excluded``).

    Parameters
    ----------
    snapshot, transform, store, kind, fixed_shape, shape
        as for :class:`ImageDataset`.
    split : str or sequence of str, optional
        the item's own ``split`` column.
    question_type : str or sequence of str, optional
        keep these question types.

    Items
    -----
    dict: ``images`` (``(2, ...)``: prior then current, or the one image in slot 0 and zeros), ``image_mask``
    (bool ``(2,)``), ``n_images``, ``image_keys`` (JSON text), ``item_id``, ``pair_id``, ``study_key``,
    ``question_type``, ``question``, ``options`` (JSON text of the list), ``n_options``, ``answer`` (option letter),
    ``answer_index`` (0-based, -1 when the letter is not an option), ``answer_text``, ``entity_ids`` (JSON text),
    ``split``. With ``fixed_shape=False``: ``images`` a list of 1 or 2 tensors and lists as stored.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        split: str | Sequence[str] | None = None,
        question_type: str | Sequence[str] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        store: ImageStore | None = None,
        kind: str | None = "2d",
        fixed_shape: bool = True,
        shape: TensorShape | Any = None,
    ) -> None:
        super().__init__(snapshot, transform, store, kind, fixed_shape, shape)
        pairs = {
            p["pair_id"]: p
            for p in snapshot.read(
                "pairs", columns=["pair_id", "prior_study_key", "current_study_key", "modality", "view"]
            ).to_pylist()
        }
        splits, types = _wanted_splits(split), _wanted(question_type)
        items = [
            q
            for q in snapshot.read("vqa").to_pylist()
            if (splits is None or q["split"] in splits) and (types is None or q["question_type"] in types)
        ]
        self.items: list[tuple[dict[str, Any], list[int]]] = []
        for q, resolved in zip(items, vqa_images(self.store.studies, pairs, items), strict=True):
            picks = [self.store.index.get(k) if k else None for k in resolved["image_keys"]]
            if not picks or len(picks) > 2 or not self._of_kind(picks):
                self.excluded.append(q["item_id"])
                continue
            self.items.append((q, picks))  # type: ignore[arg-type]
        self._warn_other_kind("VQA items")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        q, picks = self.items[i]
        got = [self._image(j) for j in picks]
        keys = [self.store.rows[j]["image_key"] for j in picks]
        meta = {
            k: q.get(k)
            for k in (
                "item_id",
                "pair_id",
                "study_key",
                "question_type",
                "question",
                "options",
                "answer",
                "answer_text",
                "entity_ids",
                "split",
            )
        }
        if not self.fixed_shape:
            return {"images": [g["image"] for g in got], "image_keys": keys, **meta}
        slots = got + [self._blank()] * (2 - len(got))
        options = list(q.get("options") or [])
        letter = str(q.get("answer") or "")
        index = ord(letter) - ord("A") if len(letter) == 1 and 0 <= ord(letter) - ord("A") < len(options) else -1
        out: dict[str, Any] = {
            "images": torch.stack([s["image"] for s in slots]),
            "image_mask": torch.tensor([True] * len(got) + [False] * (2 - len(got))),
            "n_images": len(got),
            "image_keys": json.dumps(keys),
            **{k: self._meta(v) for k, v in meta.items()},
            "n_options": len(options),
            "answer_index": index,
        }
        if self.kind == "3d":
            out["valid"] = torch.stack([s["valid"] for s in slots])
        return out


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate items of ``fixed_shape=False`` datasets: tensors of one shape are stacked, everything else stays a
    list (fixed-shape items need no special collate: PyTorch's default one stacks them).

    Raises
    ------
    ValueError
        for an empty batch.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    out: dict[str, Any] = {}
    for k in batch[0]:
        values = [b[k] for b in batch]
        if all(isinstance(v, torch.Tensor) for v in values) and len({tuple(v.shape) for v in values}) == 1:
            out[k] = torch.stack(values)
        else:
            out[k] = values
    return out
