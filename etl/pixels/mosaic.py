"""Siemens MOSAIC images (EPI, DWI, fMRI): one stored frame that is a tile sheet of many slices.

Siemens writes a whole 2D multi-slice acquisition as one image whose ImageType (0008,0008) contains
``MOSAIC``; the slice count is in the private CSA image header (0029,1010), element
``NumberOfImagesInMosaic``, which de-identification removes with every private attribute. Unpacking the
tiles into slices (as dcm2niix does) is not implemented: such images are quarantined
(``unsupported_mosaic``) instead of being stored as one large slice of tiles.
"""

from __future__ import annotations

from pydicom.dataset import Dataset

from etl.pixels.decode import NormalisationError, element_value


def is_mosaic(ds: Dataset) -> bool:
    """True when ImageType (0008,0008) has the value ``MOSAIC`` (any position, any case)."""
    value = element_value(ds, "ImageType") or []
    values = [value] if isinstance(value, str) else list(value)
    return any(str(v).strip().upper() == "MOSAIC" for v in values)


def check_not_mosaic(ds: Dataset) -> None:
    """Refuse a Siemens MOSAIC tile sheet before it is normalised.

    Raises
    ------
    etl.pixels.decode.NormalisationError
        ``unsupported_mosaic`` when :func:`is_mosaic`; the message quotes no value of the file.
    """
    if is_mosaic(ds):
        raise NormalisationError(
            "unsupported_mosaic", "Siemens MOSAIC image (tiles of several slices): unpacking is not supported"
        )
