"""medreco-reader: read MedReCo-DB releases without the build stack (pyarrow, polars, deltalake, numpy, nibabel,
Pillow only).

>>> from medreco_reader import load_snapshot               # doctest: +SKIP
>>> snap = load_snapshot("/data/medreco", version="0.2.0")  # or "s3://bucket/prefix"
>>> pairs = snap.table("pairs").collect()                   # polars, at the pinned Delta version
>>> array, meta = snap.image(snap.view("pair_images")["current_image_key"][0].as_py())

Modules: :mod:`~medreco_reader.root` (opening a folder or ``s3://`` root), :mod:`~medreco_reader.snapshot`
(manifests, pinned files, :class:`Snapshot`), :mod:`~medreco_reader.images` (a row's pixels, the representative
image of a study), :mod:`~medreco_reader.payloads` (PNG / NIfTI / ``.npy`` decoding).
"""

from medreco_reader.images import (
    load_image,
    pair_images,
    payload_bytes,
    png_spacing_mm,
    representative,
    vqa_images,
)
from medreco_reader.payloads import VOLUME_FORMATS, decode_nifti, decode_payload
from medreco_reader.root import Root
from medreco_reader.snapshot import Snapshot, SnapshotError, list_versions, load_snapshot, read_manifest

__all__ = [
    "VOLUME_FORMATS",
    "Root",
    "Snapshot",
    "SnapshotError",
    "decode_nifti",
    "decode_payload",
    "list_versions",
    "load_image",
    "load_snapshot",
    "pair_images",
    "payload_bytes",
    "png_spacing_mm",
    "read_manifest",
    "representative",
    "vqa_images",
]
