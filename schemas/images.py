"""``images``: normalised pixel payloads.

2D objects (CR, DX, MG, US, single frames): one row per image, ``payload`` = PNG bytes of
``rows x cols`` (after resize/pad). 3D series (CT, MR): one row per series whose volume is a content-addressed
NIfTI-1 object (``payload_format`` ``nifti``): ``payload`` is null, ``payload_uri`` the object
(``curated/volumes/<sha256>.nii.gz``, relative to the storage root), ``payload_sha256`` and ``payload_bytes``
its sha256 and size; CT stored as int16 HU, MR as float32 (``dtype``); ``shape`` (slices, rows, cols) and the
geometry in ``spacing_mm`` / ``origin_mm`` / ``direction`` (LPS; the object's RAS affine says the same).

2.0.0: volumes left the table (``payload_uri``, ``payload_bytes`` added, ``payload`` nullable). Earlier
snapshots hold volumes inline: 1.2.0 one ``.npy`` (NumPy format 1.0) of the float32 volume, 1.1.0 an
``.npz``; loaders read all three.
"""

import pyarrow as pa

from schemas.base import versioned

SCHEMA = versioned(
    "images",
    "2.0.0",
    [
        pa.field("image_key", pa.string(), nullable=False),
        pa.field("series_key", pa.string(), nullable=False),
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("patient_key", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        pa.field("modality", pa.string(), nullable=False),
        pa.field("view", pa.string()),  # PA | AP | LATERAL | AXIAL ... | null
        pa.field("kind", pa.string(), nullable=False),  # 2d | 3d
        pa.field("rows", pa.int32(), nullable=False),
        pa.field("cols", pa.int32(), nullable=False),
        pa.field("n_slices", pa.int32(), nullable=False),
        pa.field("spacing_mm", pa.list_(pa.float64())),  # original spacing [row, col(, slice)] mm
        pa.field("payload_format", pa.string(), nullable=False),  # png | nifti (npy in 1.2.0, npz in 1.1.0)
        pa.field("payload", pa.binary()),  # PNG bytes; null when the payload is an object (payload_uri)
        pa.field("payload_sha256", pa.string(), nullable=False),  # of the PNG bytes or of the object
        pa.field("payload_uri", pa.string()),  # volumes: curated/volumes/<sha256>.nii.gz, relative to the root
        pa.field("payload_bytes", pa.int64()),  # size of the payload (bytes or object)
        pa.field("shape", pa.list_(pa.int32())),  # payload array shape: (rows, cols[, 3]) or (slices, rows, cols)
        pa.field("dtype", pa.string()),  # payload array dtype, e.g. uint8, uint16, float32
        pa.field("origin_mm", pa.list_(pa.float64())),  # 3D: LPS position of the first voxel, mm
        pa.field("direction", pa.list_(pa.float64())),  # 3D: 9 direction cosines, row-major (SimpleITK order)
        pa.field("recipe", pa.string(), nullable=False),  # JSON: the exact normalisation steps applied
        pa.field("transfer_syntax", pa.string(), nullable=False),  # source TransferSyntaxUID
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["image_key"],
)

#: columns holding pixel bytes: never read by a global task (quality, dashboard, ledger, retrieval, reports)
PAYLOAD_COLUMNS = ("payload",)
