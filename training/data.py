"""Datasets over a published snapshot: images, retrieval positives and VQA items.

Everything is read through :mod:`etl.snapshots` (the release's manifest decides which files exist), and a
snapshot that fails :func:`etl.snapshots.verify` is refused before any row is read (verified once per job:
rank 0 hashes, the other ranks take its verdict, :func:`open_snapshot_once`).

Images stream: the ``images`` table's metadata columns are indexed once, and a payload is fetched on demand by
reading only the Parquet row group that holds it (the reader's torch datasets' :class:`ImageStore`, one implementation),
so a process holds one or two row groups of payloads, never the table. One representative image per study
(a 2D image before a volume, then the smallest ``image_key``) is brought to ``(slices, channels, size, size)``
float32 in 0..1:

* 2D (PNG): one slice; 8/16-bit scaled to 0..1 by the loader; RGB -> grey by ITU-R BT.601 luma weights
  when the backbone takes one channel, grey repeated when it takes three.
* 3D (volume, HU for CT): resampled along the slice axis to ``slice_spacing_mm`` when set (linear), then
  ``max_slices`` slices sampled evenly (``linspace``), then windowed per modality (``window``: CT
  ``(centre, width)`` in HU, values outside clipped) or, for modalities without a window, min-max scaled.
  Volumes keep their own slice count; the batch pads with a mask and padded slices never reach the backbone.
* resized with bilinear, anti-aliased interpolation (``torch.nn.functional.interpolate``).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.snapshots import SnapshotError, list_versions, read_manifest, read_snapshot_table, verify
from etl.storage import Storage
from medreco_reader.torch_data import ImageStore
from schemas.errors import ReasonCodedError

#: ITU-R BT.601 luma weights (R, G, B)
LUMA_BT601 = (0.299, 0.587, 0.114)
#: candidate column names of the ``retrieval_targets`` table (query study, relevant study)
_QUERY_COLUMNS = ("query_study_key", "study_key")
_TARGET_COLUMNS = (
    "target_study_key",
    "candidate_study_key",
    "neighbour_study_key",
    "neighbor_study_key",
    "reference_study_key",
    "relevant_study_key",
)


class SnapshotRefusedError(ReasonCodedError, SnapshotError):
    """The snapshot does not exist or fails verification; training refuses it."""

    default_reason = "snapshot_refused"
    message_format = "{message}"


@dataclass(frozen=True)
class SnapshotRef:
    """A verified release: storage, version, content hash and manifest."""

    storage: Storage
    version: str
    content_hash: str
    manifest: dict

    def has_table(self, table: str) -> bool:
        """Whether the release lists ``table``."""
        return table in self.manifest["tables"]

    def table(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """One table of the release (optionally a subset of its columns)."""
        return read_snapshot_table(self.storage, self.version, table, columns=columns)


def open_snapshot(storage: Storage, version: str | None = None, verify_files: bool = True) -> SnapshotRef:
    """Verify a release and return a handle on it (``version`` None: the latest).

    Raises
    ------
    SnapshotRefusedError
        no published snapshot, an unknown version, or any problem reported by ``verify`` (tampered,
        missing or unlisted files); the message lists the problems.
    """
    versions = list_versions(storage)
    if not versions:
        raise SnapshotRefusedError(f"no published snapshot under {storage.full_uri('snapshots')}")
    version = version or versions[-1]
    if version not in versions:
        raise SnapshotRefusedError(f"no snapshot {version}; published: {', '.join(versions)}")
    problems = verify(storage, version) if verify_files else []
    if problems:
        raise SnapshotRefusedError(
            f"snapshot {version} failed verification, refusing to train on it: " + "; ".join(problems)
        )
    manifest = read_manifest(storage, version)
    return SnapshotRef(storage, version, manifest["content_hash"], manifest)


def open_snapshot_once(storage: Storage, version: str | None = None) -> SnapshotRef:
    """:func:`open_snapshot`, verified once per job: under ``torch.distributed`` rank 0 re-hashes the release and
    broadcasts its verdict (the problems, or the version it resolved), the other ranks open it without hashing.

    Raises
    ------
    SnapshotRefusedError
        on every rank, when rank 0 refused the release.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return open_snapshot(storage, version)
    verdict: list = [None]
    if dist.get_rank() == 0:
        try:
            verdict = [("ok", open_snapshot(storage, version).version)]
        except SnapshotRefusedError as err:
            verdict = [("refused", str(err))]
    dist.broadcast_object_list(verdict, src=0)
    status, value = verdict[0]
    if status != "ok":
        raise SnapshotRefusedError(value)
    return open_snapshot(storage, value, verify_files=False)


# ---- studies and images ------------------------------------------------------------------------------


@dataclass
class StudyIndex:
    """Per study: patient, family (modality family, else modality), split, and its representative image.

    ``image_row[study]`` is a row index of ``store`` (:class:`ImageStore`: metadata in memory, payloads read one
    Parquet row group at a time); ``modality[study]`` is the representative image's DICOM modality.
    """

    patient: dict[str, str]
    family: dict[str, str]
    split: dict[str, str]
    image_row: dict[str, int]
    store: ImageStore = field(repr=False)
    modality: dict[str, str] = field(default_factory=dict)

    @property
    def storage(self) -> Storage:
        """The release's storage root (volumes of images schema 2.0 are objects under it)."""
        return self.store.storage

    def has_image(self, study_key: str) -> bool:
        """Whether the study has an image in the release."""
        return study_key in self.image_row

    def image_record(self, study_key: str) -> dict:
        """The ``images`` row of the study's representative image, payload included (one row group read)."""
        return self.store.row(self.image_row[study_key])

    def studies(self, split: str | None = None) -> list[str]:
        """Studies with an image, sorted, optionally of one split."""
        return sorted(s for s in self.image_row if split is None or self.split.get(s) == split)


def load_study_index(ref: SnapshotRef) -> StudyIndex:
    """Index the release's studies, splits and images: the ``images`` metadata once (no payload), payloads later
    on demand (:class:`ImageStore`)."""
    from medreco_reader.snapshot import Snapshot

    studies = ref.table("studies", ["study_key", "patient_key", "modality", "family"]).to_pylist()
    splits = {r["patient_key"]: r["split"] for r in ref.table("splits", ["patient_key", "split"]).to_pylist()}
    store = ImageStore(Snapshot(ref.storage, ref.version, ref.manifest))
    patient = {r["study_key"]: r["patient_key"] for r in studies}
    family = {r["study_key"]: r["family"] or r["modality"] for r in studies}
    split = {s: splits[p] for s, p in patient.items() if p in splits}
    rows = {s: store.pick(s) for s in patient}
    rows = {s: i for s, i in rows.items() if i is not None}
    modality = {s: store.rows[i]["modality"] for s, i in rows.items()}
    return StudyIndex(patient, family, split, rows, store, modality)


def window_volume(x, modality: str | None, window: dict[str, tuple[float, float]] | None):
    """Volume intensities -> 0..1: the modality's ``(centre, width)`` window (``(x - (c - w/2)) / w`` clipped; CT in
    HU, e.g. soft tissue 40/400, lung -600/1500) or, without one, min-max over the volume (zeros when flat)."""
    import torch

    win = (window or {}).get(modality or "")
    if win is not None:
        c, w = win
        return ((x - (c - w / 2)) / w).clamp(0, 1)
    lo, hi = x.amin(), x.amax()
    return (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)


def resample_slices(x, spacing_mm: float | None, target_mm: float | None):
    """A volume ``(n, H, W)`` resampled along the slice axis from ``spacing_mm`` to ``target_mm`` (linear; as is
    when either is unknown or they agree within 1%)."""
    import torch.nn.functional as F

    if not spacing_mm or not target_mm or abs(spacing_mm - target_mm) <= 0.01 * target_mm or x.shape[0] < 2:
        return x
    n = max(1, round((x.shape[0] - 1) * spacing_mm / target_mm) + 1)
    return F.interpolate(x[None, None].float(), size=(n, *x.shape[1:]), mode="trilinear", align_corners=True)[0, 0]


def image_tensor(
    row: dict,
    size: int,
    channels: int,
    max_slices: int,
    storage: Storage | None = None,
    window: dict[str, tuple[float, float]] | None = None,
    slice_spacing_mm: float | None = None,
):
    """Decode one ``images`` row to ``(slices, channels, size, size)`` float32 in 0..1 (see module doc).

    Parameters
    ----------
    row : dict
        an ``images`` row with ``payload_format`` and ``payload`` (or ``payload_uri``, read through ``storage``).
    size : int
        output side in pixels.
    channels : int
        1 or 3.
    max_slices : int
        cap on slices sampled from a volume (evenly spaced, first and last included).
    storage : Storage, optional
        the release's storage root (rows whose volume is an object, images schema 2.0).
    window : dict, optional
        per modality ``(centre, width)`` (:func:`window_volume`).
    slice_spacing_mm : float, optional
        resample volumes to this slice spacing first (:func:`resample_slices`; the row's ``spacing_mm[2]``).

    Returns
    -------
    torch.Tensor
        float32, shape (S, channels, size, size); S = 1 for 2D images, min(n_slices, max_slices) for volumes.
    """
    import torch
    import torch.nn.functional as F

    from etl.pixels.normalise import VOLUME_FORMATS
    from medreco_reader.tensors import to_tensor

    x = to_tensor(row, storage)
    if row["payload_format"] in VOLUME_FORMATS:
        sp = row.get("spacing_mm") or []
        x = resample_slices(x, sp[2] if len(sp) > 2 else None, slice_spacing_mm)
        n = x.shape[0]
        idx = np.unique(np.linspace(0, n - 1, min(n, max_slices)).round().astype(int))
        x = window_volume(x[torch.from_numpy(idx)].float(), row.get("modality"), window)
        x = x[:, None]  # (S, 1, H, W)
    else:
        x = x[None]  # (1, C, H, W)
    if x.shape[1] == 3 and channels == 1:
        w = torch.tensor(LUMA_BT601, dtype=x.dtype).view(1, 3, 1, 1)
        x = (x * w).sum(1, keepdim=True)
    elif x.shape[1] == 1 and channels == 3:
        x = x.expand(-1, 3, -1, -1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.clamp_(0, 1).contiguous()


def pad_slices(stacks: list):
    """Stack per-image ``(S_i, C, H, W)`` tensors into ``(B, S_max, C, H, W)`` plus a bool mask ``(B, S_max)``
    (True = real slice)."""
    import torch

    s_max = max(t.shape[0] for t in stacks)
    out = stacks[0].new_zeros((len(stacks), s_max, *stacks[0].shape[1:]))
    mask = torch.zeros((len(stacks), s_max), dtype=torch.bool)
    for i, t in enumerate(stacks):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    return out, mask


# ---- retrieval positives -------------------------------------------------------------------------------


@dataclass
class Positives:
    """Which studies are relevant to a (query study, entity), and how much: sparse groups, never an N x N matrix.

    ``query_group[(study, entity)]`` names a group in ``groups``, a mapping ``relevant study -> relevance`` (the
    ``retrieval_targets`` relevance in (0, 1]; 1.0 for positives derived from ``study_labels``); the relevant
    studies of a query are the group's members minus the query study and the query patient's other studies
    (retrieval is across patients).
    """

    source: str  # retrieval_targets | study_labels
    note: str
    groups: dict[str, dict[str, float]]
    query_group: dict[tuple[str, str], str]

    def relevance(self, study: str, entity: str, candidate: str) -> float:
        """Relevance of ``candidate`` to the query (0.0 when not relevant; patients are not checked here)."""
        g = self.query_group.get((study, entity))
        return 0.0 if g is None or candidate == study else self.groups[g].get(candidate, 0.0)

    def relevant(self, study: str, entity: str, index: StudyIndex) -> list[str]:
        """Relevant studies of a query (sorted), other patients only."""
        g = self.query_group.get((study, entity))
        if g is None:
            return []
        me = index.patient.get(study)
        return sorted(s for s in self.groups[g] if s != study and index.patient.get(s) != me)

    def entities(self) -> list[str]:
        """Entity ids that have at least one query, sorted."""
        return sorted({e for _, e in self.query_group})


def load_positives(ref: SnapshotRef, index: StudyIndex, positive_states: list[str]) -> Positives:
    """Retrieval positives of the release, with their graded relevance.

    From the ``retrieval_targets`` table when the release has one with rows (query study, relevant study,
    ``entity_id`` and, when present, ``relevance``); otherwise (an older release without the table, or an empty
    one) derived from ``study_labels``: two studies of the same split and modality family are relevant (1.0) for
    an entity when they have the same state of it, one of ``positive_states`` (MedReCo's relevance reduced to
    equal entity state). Only studies with an image count. ``Positives.note`` says which source was used.

    Raises
    ------
    SnapshotError
        when ``retrieval_targets`` exists but has no recognisable query/target columns.
    """
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    query_group: dict[tuple[str, str], str] = {}
    t = ref.table("retrieval_targets") if ref.has_table("retrieval_targets") else None
    if t is not None and t.num_rows:
        q = next((c for c in _QUERY_COLUMNS if c in t.column_names), None)
        tg = next((c for c in _TARGET_COLUMNS if c in t.column_names), None)
        if q is None or tg is None or "entity_id" not in t.column_names:
            raise SnapshotError(
                f"retrieval_targets of {ref.version}: no query/target/entity_id columns in {t.column_names}"
            )
        rel = t["relevance"].to_pylist() if "relevance" in t.column_names else [1.0] * t.num_rows
        for qs, ts, e, r in zip(t[q].to_pylist(), t[tg].to_pylist(), t["entity_id"].to_pylist(), rel):
            if (
                index.has_image(qs)
                and index.has_image(ts)
                and index.split.get(qs) == index.split.get(ts)
                and r is not None
                and r > 0
            ):
                key = f"{qs}|{e}"
                groups[key][ts] = max(float(r), groups[key].get(ts, 0.0))
                query_group[(qs, e)] = key
        source, note = "retrieval_targets", "positives from the snapshot's retrieval_targets table (graded relevance)"
    else:
        labels = ref.table("study_labels", ["study_key", "entity_id", "state"])
        labels = labels.filter(pc.is_in(labels["state"], pa.array(positive_states)))
        for s, e, st in zip(
            labels["study_key"].to_pylist(), labels["entity_id"].to_pylist(), labels["state"].to_pylist()
        ):
            if not index.has_image(s) or s not in index.split:
                continue
            key = f"{index.split[s]}|{index.family[s]}|{e}|{st}"
            groups[key][s] = 1.0
            query_group[(s, e)] = key
        source = "study_labels"
        note = (
            f"snapshot {ref.version} has no retrieval_targets rows: positives derived from study_labels "
            f"(same split, family and entity state in {positive_states}, relevance 1)"
        )
    return Positives(source, note, dict(groups), query_group)


class RetrievalTrainSet:
    """Map-style dataset of training queries ``(study, entity)`` with at least one relevant study.

    Item ``i`` gives the query image, one relevant study's image (drawn with probability proportional to its
    relevance, with ``random.Random`` seeded by (seed, epoch, i), so a resumed epoch draws the same), the entity
    index, both studies' family index, and integer codes of both studies and patients (``study_code`` /
    ``patient_code``: positions in the sorted study / patient lists) so that relevance across processes can be
    looked up after an all-gather.
    """

    def __init__(
        self,
        index: StudyIndex,
        positives: Positives,
        split: str,
        entity_ids: list[str],
        families: list[str],
        size: int,
        channels: int,
        max_slices: int,
        seed: int = 0,
        window: dict | None = None,
        slice_spacing_mm: float | None = None,
    ):
        self.index, self.positives = index, positives
        self.entity_ids = {e: i for i, e in enumerate(entity_ids)}
        self.families = {f: i for i, f in enumerate(families)}
        self.size, self.channels, self.max_slices, self.seed = size, channels, max_slices, seed
        self.window, self.slice_spacing_mm = window, slice_spacing_mm
        self.epoch = 0
        self.queries = [
            (s, e)
            for (s, e) in sorted(positives.query_group)
            if index.split.get(s) == split and e in self.entity_ids and positives.relevant(s, e, index)
        ]
        self.study_code = {s: i for i, s in enumerate(sorted(index.patient))}
        self.patient_code = {p: i for i, p in enumerate(sorted(set(index.patient.values())))}

    def set_epoch(self, epoch: int) -> None:
        """Change the positive draw (call once per epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.queries)

    def image(self, study: str):
        """The study's image tensor ``(S, C, size, size)``."""
        return image_tensor(
            self.index.image_record(study),
            self.size,
            self.channels,
            self.max_slices,
            self.index.storage,
            self.window,
            self.slice_spacing_mm,
        )

    def __getitem__(self, i: int) -> dict:
        study, entity = self.queries[i]
        rel = self.positives.relevant(study, entity, self.index)
        weights = [self.positives.relevance(study, entity, s) for s in rel]
        pos = random.Random(f"{self.seed}|{self.epoch}|{i}").choices(rel, weights=weights)[0]
        fam, pat = self.families, self.patient_code
        return {
            "anchor": self.image(study),
            "positive": self.image(pos),
            "entity": self.entity_ids[entity],
            "anchor_family": fam.get(self.index.family[study], len(fam)),
            "positive_family": fam.get(self.index.family[pos], len(fam)),
            "anchor_study": study,
            "positive_study": pos,
            "entity_id": entity,
            "anchor_code": self.study_code[study],
            "positive_code": self.study_code[pos],
            "anchor_patient": pat[self.index.patient[study]],
            "positive_patient": pat[self.index.patient[pos]],
        }


# ---- VQA items ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VQAItem:
    """One VQA item with its images resolved: ``prior`` None for single-study items."""

    item_id: str
    question_type: str
    question: str
    options: list[str]
    answer: str  # option letter
    answer_text: str
    entity_ids: list[str]
    split: str
    prior: str | None
    current: str
    reason: str | None = None


def load_vqa_items(ref: SnapshotRef, index: StudyIndex) -> tuple[list[VQAItem], int]:
    """The release's VQA items whose images exist, sorted by ``item_id``, and the number skipped.

    Pair items (``pair_id`` set) take the pair's prior and current studies; two-case items
    (``reference_study_key`` set) take the reference case first and the query (``study_key``) second;
    single-study items take ``study_key`` as the current image and no prior.
    """
    pairs = {
        r["pair_id"]: (r["prior_study_key"], r["current_study_key"])
        for r in ref.table("pairs", ["pair_id", "prior_study_key", "current_study_key"]).to_pylist()
    }
    items, skipped = [], 0
    for r in ref.table("vqa").sort_by("item_id").to_pylist():
        if r["pair_id"]:
            prior, current = pairs.get(r["pair_id"], (None, None))
        else:  # a two-case item shows its reference case in the first image slot
            prior, current = r.get("reference_study_key"), r["study_key"]
        if current is None or not index.has_image(current) or (prior is not None and not index.has_image(prior)):
            skipped += 1
            continue
        items.append(
            VQAItem(
                r["item_id"],
                r["question_type"],
                r["question"],
                list(r["options"]),
                r["answer"],
                r["answer_text"],
                list(r["entity_ids"]),
                r["split"],
                prior,
                current,
                r.get("reason"),
            )
        )
    return items, skipped
