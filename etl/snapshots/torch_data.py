"""PyTorch datasets over a published snapshot: images, longitudinal pairs and VQA items.

Pixels are decoded lazily with :func:`etl.snapshots.loader.to_tensor` (the normaliser's own decoder), one image
payload at a time: the datasets index the ``images`` table's metadata columns once, and fetch a payload
by reading only the Parquet row group that holds it (snapshot data files use row groups of about
:data:`etl.snapshots.delta.ROW_GROUP_BYTES`). They work on local disk and on S3 (through the release's
storage), and pickle cleanly for ``DataLoader(num_workers=N)`` (open files are per process).

>>> from etl.snapshots import load_snapshot                     # doctest: +SKIP
>>> from etl.snapshots.torch_data import PairDataset, collate
>>> snap = load_snapshot("/data/medreco")
>>> loader = torch.utils.data.DataLoader(PairDataset(snap, split="train"), batch_size=8, collate_fn=collate)

Tensors (from :func:`etl.snapshots.loader.to_tensor`): 2D images float32 ``(channels, rows, cols)`` in 0..1
(channels 1 or 3); volumes float32 ``(slices, rows, cols)``, HU for CT (clipped), 0..1 for MR.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from etl.snapshots.api import Snapshot
from etl.snapshots.loader import to_tensor
from etl.snapshots.manifest import release_files

#: metadata columns of ``images`` kept in memory (everything but the payload)
IMAGE_COLUMNS = ("image_key", "series_key", "study_key", "patient_key", "institution", "modality", "view", "kind",
                 "rows", "cols", "n_slices", "spacing_mm", "payload_format", "shape", "dtype", "origin_mm",
                 "direction", "recipe")
#: read as well where the release has them (images schema 2.0: volumes as objects under the storage root)
OBJECT_COLUMNS = ("payload_uri", "payload_sha256")
_PAYLOAD_COLUMNS = ["payload", "payload_format"]


def _splits(snap: Snapshot) -> dict[str, str]:
    t = snap.read("splits", columns=["patient_key", "split"])
    return dict(zip(t["patient_key"].to_pylist(), t["split"].to_pylist(), strict=True))


def _wanted(split: str | Sequence[str] | None) -> set[str] | None:
    if split is None:
        return None
    return {split} if isinstance(split, str) else set(split)


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
        one dict per image (:data:`IMAGE_COLUMNS`), in the release's file order (partition order, key order within a file).
    by_study : dict
        study_key -> row indices, 2D images first, then by ``image_key``.
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
        self.by_study: dict[str, list[int]] = {}
        for i, r in enumerate(self.rows):
            self.by_study.setdefault(r["study_key"], []).append(i)
        for idx in self.by_study.values():
            idx.sort(key=lambda i: (self.rows[i]["kind"] != "2d", self.rows[i]["image_key"]))
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
        """Decoded pixels of image ``index`` (:func:`etl.snapshots.loader.to_tensor`)."""
        return to_tensor(self.row(index), self.storage)

    def pick(self, study_key: str, modality: str | None = None, view: str | None = None) -> int | None:
        """The representative image of a study: same modality and view when given, 2D first, then by key.

        Returns None when the study has no image in the release (e.g. all its images were quarantined).
        """
        candidates = self.by_study.get(study_key, [])
        if modality is not None:
            candidates = [i for i in candidates if self.rows[i]["modality"] == modality] or candidates
        if view is not None:
            candidates = [i for i in candidates if self.rows[i]["view"] == view] or candidates
        return candidates[0] if candidates else None


class _Base(Dataset):
    def __init__(self, snapshot: Snapshot, transform: Callable[[torch.Tensor], torch.Tensor] | None,
                 store: ImageStore | None) -> None:
        self.snapshot = snapshot
        self.transform = transform
        self.store = store or ImageStore(snapshot)
        #: ids of rows left out because an image they need is not in the release
        self.excluded: list[str] = []

    def _image(self, index: int) -> torch.Tensor:
        t = self.store.tensor(index)
        return self.transform(t) if self.transform else t


class ImageDataset(_Base):
    """One item per row of the ``images`` table.

    Parameters
    ----------
    snapshot : Snapshot
    split : str or sequence of str, optional
        keep the images of patients in these splits (``train``, ``val``, ``test``, ``external_test``).
    modality : str or sequence of str, optional
        keep these modalities (DICOM Modality, e.g. ``CR``, ``CT``).
    transform : callable, optional
        applied to the image tensor.
    store : ImageStore, optional
        share one index between datasets of the same release.

    Items
    -----
    dict: ``image`` (tensor, see the module docstring), ``image_key``, ``study_key``, ``patient_key``,
    ``institution``, ``modality``, ``view``, ``kind`` (2d | 3d), ``spacing_mm``, ``split``.
    """

    def __init__(self, snapshot: Snapshot, split: str | Sequence[str] | None = None,
                 modality: str | Sequence[str] | None = None,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 store: ImageStore | None = None) -> None:
        super().__init__(snapshot, transform, store)
        self.split_of = _splits(snapshot)
        splits, modalities = _wanted(split), _wanted(modality)
        self.indices = [i for i, r in enumerate(self.store.rows)
                        if (splits is None or self.split_of.get(r["patient_key"]) in splits)
                        and (modalities is None or r["modality"] in modalities)]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        idx = self.indices[i]
        r = self.store.rows[idx]
        return {"image": self._image(idx), **{k: r[k] for k in ("image_key", "study_key", "patient_key",
                                                                "institution", "modality", "view", "kind",
                                                                "spacing_mm")},
                "split": self.split_of.get(r["patient_key"])}


class PairDataset(_Base):
    """One item per longitudinal pair (``pairs`` table): the prior and current study's images.

    Each study is represented by one image of the pair's modality and view (:meth:`ImageStore.pick`);
    pairs with a study that has no image in the release are left out (their ids in ``excluded``).

    Parameters
    ----------
    snapshot, split, transform, store
        as for :class:`ImageDataset` (``split`` by the pair's patient).

    Items
    -----
    dict: ``prior``, ``current`` (tensors), ``pair_id``, ``patient_key``, ``prior_study_key``,
    ``current_study_key``, ``prior_image_key``, ``current_image_key``, ``modality``, ``view``, ``gap_days``
    (int, days between the studies), ``change_labels`` (list of {entity_id, change, source}), ``split``.
    """

    def __init__(self, snapshot: Snapshot, split: str | Sequence[str] | None = None,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 store: ImageStore | None = None) -> None:
        super().__init__(snapshot, transform, store)
        split_of = _splits(snapshot)
        wanted = _wanted(split)
        self.items: list[tuple[dict[str, Any], int, int]] = []
        for p in snapshot.read("pairs").to_pylist():
            s = split_of.get(p["patient_key"])
            if wanted is not None and s not in wanted:
                continue
            a = self.store.pick(p["prior_study_key"], p["modality"], p["view"])
            b = self.store.pick(p["current_study_key"], p["modality"], p["view"])
            if a is None or b is None:
                self.excluded.append(p["pair_id"])
                continue
            self.items.append(({**p, "split": s}, a, b))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        p, a, b = self.items[i]
        return {"prior": self._image(a), "current": self._image(b),
                "prior_image_key": self.store.rows[a]["image_key"], "current_image_key": self.store.rows[b]["image_key"],
                **{k: p[k] for k in ("pair_id", "patient_key", "prior_study_key", "current_study_key", "modality",
                                     "view", "gap_days", "change_labels", "split")}}


class VQADataset(_Base):
    """One item per VQA item (``vqa`` table): its images, question, options and answer.

    Its images are those of ``study_keys`` (schema 1.1: ``[study]`` or ``[prior, current]``), else of the
    pair (``pair_id``: prior and current, with the pair's modality and view) or of ``study_key``. Items whose images are not in the release are left out (``excluded``).

    Parameters
    ----------
    snapshot, transform, store
        as for :class:`ImageDataset`.
    split : str or sequence of str, optional
        the item's own ``split`` column.
    question_type : str or sequence of str, optional
        keep these question types.

    Items
    -----
    dict: ``images`` (list of 1 or 2 tensors, prior first), ``image_keys``, ``item_id``, ``pair_id``,
    ``study_key``, ``question_type``, ``question``, ``options`` (list of str), ``answer`` (option letter),
    ``answer_text``, ``entity_ids``, ``split``.
    """

    def __init__(self, snapshot: Snapshot, split: str | Sequence[str] | None = None,
                 question_type: str | Sequence[str] | None = None,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 store: ImageStore | None = None) -> None:
        super().__init__(snapshot, transform, store)
        pairs = {p["pair_id"]: p for p in snapshot.read(
            "pairs", columns=["pair_id", "prior_study_key", "current_study_key", "modality", "view"]).to_pylist()}
        splits, types = _wanted(split), _wanted(question_type)
        self.items: list[tuple[dict[str, Any], list[int]]] = []
        for q in snapshot.read("vqa").to_pylist():
            if (splits is not None and q["split"] not in splits) or (types is not None and q["question_type"] not in types):
                continue
            p = pairs.get(q["pair_id"]) if q.get("pair_id") else None
            studies = q.get("study_keys") or (
                [p["prior_study_key"], p["current_study_key"]] if p else [q["study_key"]] if q.get("study_key") else [])
            modality, view = (p["modality"], p["view"]) if p else (None, None)
            picks = [self.store.pick(sk, modality, view) for sk in studies]
            found = [i for i in picks if i is not None]
            if not picks or len(found) < len(picks):
                self.excluded.append(q["item_id"])
                continue
            self.items.append((q, found))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        q, picks = self.items[i]
        return {"images": [self._image(j) for j in picks],
                "image_keys": [self.store.rows[j]["image_key"] for j in picks],
                **{k: q.get(k) for k in ("item_id", "pair_id", "study_key", "question_type", "question", "options",
                                         "answer", "answer_text", "entity_ids", "split")}}


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate items into a batch: tensors of one shape are stacked, everything else stays a list.

    Volumes of different sizes, lists of change labels and lists of images stay per item (lists), so one
    function serves all three datasets; resize first (``transform``) to stack images of mixed sizes.

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
