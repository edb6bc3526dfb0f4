"""One row of the ``images`` table as a torch tensor (torch imported lazily: the ``[torch]`` extra).

Decoding is :mod:`medreco_reader.images` (:func:`load_image`, :func:`payload_bytes`, :func:`png_spacing_mm`,
re-exported here); ``storage`` may be a reader :class:`~medreco_reader.root.Root`, the project's ``Storage`` (built
on it), or a root path / ``s3://`` URI. Arrays come back exactly as stored (PNG, ``.npy`` and NIfTI are
lossless; CT volumes of schema 2.0 are int16 HU, rounded once when written).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from medreco_reader.images import load_image, payload_bytes, png_spacing_mm
from medreco_reader.payloads import VOLUME_FORMATS

__all__ = ["load_image", "payload_bytes", "png_spacing_mm", "to_tensor"]


def to_tensor(row: dict[str, Any], storage: Any = None) -> Any:
    """The row's array as a ``torch.Tensor`` (torch imported lazily), at its stored size.

    Parameters
    ----------
    row : dict
        As for :func:`load_image`.
    storage : Storage, Root or str, optional
        As for :func:`load_image` (``nifti`` rows).

    Returns
    -------
    torch.Tensor
        volumes float32 (slices, rows, cols) (HU for CT, int16 objects converted exactly); PNG images as float32
        scaled to 0..1 by their bit depth (8-bit / 255, 16-bit / 65535), grayscale (1, rows, cols), RGB
        (3, rows, cols) (channels first, as torchvision expects). Fixed-shape batches:
        :mod:`medreco_reader.torch_data`.
    """
    import torch

    array, _ = load_image(row, storage)
    if row["payload_format"] in VOLUME_FORMATS:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    scale = 255.0 if array.dtype == np.uint8 else 65535.0
    unit = array.astype(np.float32) / np.float32(scale)
    unit = unit[None] if unit.ndim == 2 else np.moveaxis(unit, -1, 0)
    return torch.from_numpy(np.ascontiguousarray(unit))
