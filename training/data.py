"""Datasets over a published snapshot: images, retrieval positives and VQA items.

Everything is read through :mod:`etl.snapshots` (the release's manifest decides which files exist), and a
snapshot that fails :func:`etl.snapshots.verify` is refused before any row is read.

Images are decoded lazily (``medreco_reader.tensors.to_tensor``) from the payload bytes of the ``images`` table, one
representative image per study (the first by ``image_key``; a 2D image before a volume), and brought to a
common layout ``(slices, channels, size, size)`` float32 in 0..1:

* 2D (PNG): one slice; 8/16-bit scaled to 0..1 by the loader; RGB -> grey by ITU-R BT.601 luma weights
  when the backbone takes one channel, grey repeated when it takes three.
* 3D (npy volume, HU for CT): ``max_slices`` slices sampled evenly (``linspace`` over the slice axis),
  then min-max scaled per volume to 0..1 (CT HU and MR intensities alike).
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
from schemas.errors import ReasonCodedError

#: ITU-R BT.601 luma weights (R, G, B)
LUMA_BT601 = (0.299, 0.587, 0.114)
#: candidate column names of the ``retrieval_targets`` table (query study, relevant study)
_QUERY_COLUMNS = ("query_study_key", "study_key")
_TARGET_COLUMNS = ("target_study_key", "candidate_study_key", "neighbour_study_key", "neighbor_study_key",
                   "reference_study_key", "relevant_study_key")


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


def open_snapshot(storage: Storage, version: str | None = None) -> SnapshotRef:
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
    problems = verify(storage, version)
    if problems:
        raise SnapshotRefusedError(f"snapshot {version} failed verification, refusing to train on it: "
                                   + "; ".join(problems))
    manifest = read_manifest(storage, version)
    return SnapshotRef(storage, version, manifest["content_hash"], manifest)


# ---- studies and images ------------------------------------------------------------------------------


@dataclass
class StudyIndex:
    """Per study: patient, family (modality family, else modality), split, and its representative image."""

    patient: dict[str, str]
    family: dict[str, str]
    split: dict[str, str]
    image_row: dict[str, int]
    images: pa.Table = field(repr=False)
    #: the release's storage root: volumes of images schema 2.0 are objects under it (``payload_uri``)
    storage: Storage | None = field(default=None, repr=False)

    def has_image(self, study_key: str) -> bool:
        """Whether the study has an image in the release."""
        return study_key in self.image_row

    def image_record(self, study_key: str) -> dict:
        """The ``images`` row of the study's representative image (payload included)."""
        return self.images.slice(self.image_row[study_key], 1).to_pylist()[0]

    def studies(self, split: str | None = None) -> list[str]:
        """Studies with an image, sorted, optionally of one split."""
        return sorted(s for s in self.image_row if split is None or self.split.get(s) == split)


_IMAGE_COLUMNS = ["image_key", "study_key", "modality", "kind", "payload_format", "payload", "view",
                  "spacing_mm", "origin_mm", "direction", "recipe"]


def load_study_index(ref: SnapshotRef) -> StudyIndex:
    """Index the release's studies, splits and images (payloads stay in the Arrow table, undecoded; volumes of
    images schema 2.0 stay objects under the storage root, named by ``payload_uri``)."""
    studies = ref.table("studies", ["study_key", "patient_key", "modality", "family"]).to_pylist()
    splits = {r["patient_key"]: r["split"] for r in ref.table("splits", ["patient_key", "split"]).to_pylist()}
    major = int(str(ref.manifest["tables"]["images"].get("schema_version", "1")).split(".")[0] or 1)
    images = ref.table("images", _IMAGE_COLUMNS + (["payload_uri"] if major >= 2 else []))
    images = images.sort_by([("study_key", "ascending"), ("kind", "ascending"), ("image_key", "ascending")])
    first: dict[str, int] = {}
    for i, s in enumerate(images["study_key"].to_pylist()):
        first.setdefault(s, i)  # "2d" sorts before "3d": a 2D image is preferred
    patient = {r["study_key"]: r["patient_key"] for r in studies}
    family = {r["study_key"]: r["family"] or r["modality"] for r in studies}
    split = {s: splits[p] for s, p in patient.items() if p in splits}
    return StudyIndex(patient, family, split, {s: i for s, i in first.items() if s in patient}, images, ref.storage)


def image_tensor(row: dict, size: int, channels: int, max_slices: int, storage: Storage | None = None):
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
        n = x.shape[0]
        idx = np.unique(np.linspace(0, n - 1, min(n, max_slices)).round().astype(int))
        x = x[torch.from_numpy(idx)].float()
        lo, hi = x.amin(), x.amax()
        x = (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)
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
    """Which studies are relevant to a (query study, entity): sparse groups, never an N x N matrix.

    ``query_group[(study, entity)]`` names a group in ``groups``; the relevant studies are the group's
    members minus the query study and the query patient's other studies (retrieval is across patients).
    """

    source: str  # retrieval_targets | study_labels
    note: str
    groups: dict[str, frozenset[str]]
    query_group: dict[tuple[str, str], str]

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
    """Retrieval positives of the release.

    From the ``retrieval_targets`` table when the release has one with rows (its query study, relevant study
    and ``entity_id`` columns); otherwise (an older release without the table, or an empty one) derived from ``study_labels``: two studies of the same split and
    modality family are relevant for an entity when they have the same state of it, one of
    ``positive_states`` (MedReCo's relevance reduced to equal entity state). Only studies with an image
    count. ``Positives.note`` says which source was used.

    Raises
    ------
    SnapshotError
        when ``retrieval_targets`` exists but has no recognisable query/target columns.
    """
    groups: dict[str, set[str]] = defaultdict(set)
    query_group: dict[tuple[str, str], str] = {}
    t = ref.table("retrieval_targets") if ref.has_table("retrieval_targets") else None
    if t is not None and t.num_rows:
        q = next((c for c in _QUERY_COLUMNS if c in t.column_names), None)
        tg = next((c for c in _TARGET_COLUMNS if c in t.column_names), None)
        if q is None or tg is None or "entity_id" not in t.column_names:
            raise SnapshotError(f"retrieval_targets of {ref.version}: no query/target/entity_id columns in "
                                f"{t.column_names}")
        for qs, ts, e in zip(t[q].to_pylist(), t[tg].to_pylist(), t["entity_id"].to_pylist()):
            if index.has_image(qs) and index.has_image(ts) and index.split.get(qs) == index.split.get(ts):
                key = f"{qs}|{e}"
                groups[key].add(ts)
                query_group[(qs, e)] = key
        source, note = "retrieval_targets", "positives from the snapshot's retrieval_targets table"
    else:
        labels = ref.table("study_labels", ["study_key", "entity_id", "state"])
        labels = labels.filter(pc.is_in(labels["state"], pa.array(positive_states)))
        for s, e, st in zip(labels["study_key"].to_pylist(), labels["entity_id"].to_pylist(),
                            labels["state"].to_pylist()):
            if not index.has_image(s) or s not in index.split:
                continue
            key = f"{index.split[s]}|{index.family[s]}|{e}|{st}"
            groups[key].add(s)
            query_group[(s, e)] = key
        source = "study_labels"
        note = (f"snapshot {ref.version} has no retrieval_targets rows: positives derived from study_labels "
                f"(same split, family and entity state in {positive_states})")
    return Positives(source, note, {k: frozenset(v) for k, v in groups.items()}, query_group)


class RetrievalTrainSet:
    """Map-style dataset of training queries ``(study, entity)`` with at least one relevant study.

    Item ``i`` gives the query image, one relevant study's image (drawn with ``random.Random`` seeded by
    (seed, epoch, i), so a resumed epoch draws the same), the entity index and both studies' family index.
    """

    def __init__(self, index: StudyIndex, positives: Positives, split: str, entity_ids: list[str],
                 families: list[str], size: int, channels: int, max_slices: int, seed: int = 0):
        self.index, self.positives = index, positives
        self.entity_ids = {e: i for i, e in enumerate(entity_ids)}
        self.families = {f: i for i, f in enumerate(families)}
        self.size, self.channels, self.max_slices, self.seed = size, channels, max_slices, seed
        self.epoch = 0
        self.queries = [(s, e) for (s, e) in sorted(positives.query_group)
                        if index.split.get(s) == split and e in self.entity_ids
                        and positives.relevant(s, e, index)]

    def set_epoch(self, epoch: int) -> None:
        """Change the positive draw (call once per epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.queries)

    def image(self, study: str):
        """The study's image tensor ``(S, C, size, size)``."""
        return image_tensor(self.index.image_record(study), self.size, self.channels, self.max_slices,
                            self.index.storage)

    def __getitem__(self, i: int) -> dict:
        study, entity = self.queries[i]
        rel = self.positives.relevant(study, entity, self.index)
        pos = random.Random(f"{self.seed}|{self.epoch}|{i}").choice(rel)
        fam = self.families
        return {"anchor": self.image(study), "positive": self.image(pos), "entity": self.entity_ids[entity],
                "anchor_family": fam.get(self.index.family[study], len(fam)),
                "positive_family": fam.get(self.index.family[pos], len(fam)),
                "anchor_study": study, "positive_study": pos, "entity_id": entity}


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


def load_vqa_items(ref: SnapshotRef, index: StudyIndex) -> tuple[list[VQAItem], int]:
    """The release's VQA items whose images exist, sorted by ``item_id``, and the number skipped.

    Pair items (``pair_id`` set) take the pair's prior and current studies; two-case items
    (``reference_study_key`` set) take the reference case first and the query (``study_key``) second;
    single-study items take ``study_key`` as the current image and no prior.
    """
    pairs = {r["pair_id"]: (r["prior_study_key"], r["current_study_key"])
             for r in ref.table("pairs", ["pair_id", "prior_study_key", "current_study_key"]).to_pylist()}
    items, skipped = [], 0
    for r in ref.table("vqa").sort_by("item_id").to_pylist():
        if r["pair_id"]:
            prior, current = pairs.get(r["pair_id"], (None, None))
        else:  # a two-case item shows its reference case in the first image slot
            prior, current = r.get("reference_study_key"), r["study_key"]
        if current is None or not index.has_image(current) or (prior is not None and not index.has_image(prior)):
            skipped += 1
            continue
        items.append(VQAItem(r["item_id"], r["question_type"], r["question"], list(r["options"]), r["answer"],
                             r["answer_text"], list(r["entity_ids"]), r["split"], prior, current))
    return items, skipped
