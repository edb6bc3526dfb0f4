"""``deid_audit``: per de-identified file, how many elements each action touched (PHI-free counts), and the pixel
regions blanked for burned-in text (``text_regions``: JSON list of {"frame", "box": [x0, y0, x1, y1], "reason"},
reason ``phi``/``word``/``line`` from OCR or ``rule`` from a device rule; no text is ever stored)."""

import pyarrow as pa

from schemas.base import versioned

COUNTS = (
    "removed",
    "emptied",
    "replaced",
    "shifted",
    "remapped",
    "cleaned",
    "kept",
    "walked",
    "removed_undecodable",
    "pixel_regions_cleaned",
    "text_checked",
    "text_images_blanked",
    "text_regions_blanked",
    "text_pixels_blanked",
)

SCHEMA = versioned(
    "deid_audit",
    "1.1.0",
    [
        pa.field("sop_key", pa.string(), nullable=False),
        pa.field("study_key", pa.string(), nullable=False),
        pa.field("institution", pa.string(), nullable=False),
        *[pa.field(c, pa.int32(), nullable=False) for c in COUNTS],
        pa.field("text_regions", pa.string(), nullable=True),
        pa.field("shard", pa.int32(), nullable=False),
    ],
    key=["sop_key"],
)
