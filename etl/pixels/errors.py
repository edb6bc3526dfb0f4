"""The error of pixel decoding and normalisation: :class:`NormalisationError` and its reason codes.

Its own module so that the decoders (:mod:`etl.pixels.decode`) and the contained decoding worker
(:mod:`etl.pixels.contained`) raise the same error without importing each other.
"""

from __future__ import annotations

from schemas.errors import ReasonCodedError

#: every reason code :class:`NormalisationError` may carry
REASONS = frozenset(
    {
        "unsupported_transfer_syntax",
        "pixel_data_length_mismatch",
        "truncated_file",
        "no_pixel_data",
        "decode_error",
        "inconsistent_series",
        "volume_too_large",
        "unsupported_modality",
        "duplicate_slice_position",
        "irregular_slice_geometry",
        "unsupported_mosaic",
        "image_too_large",
        "declared_size_mismatch",
        "decoder_crashed",
    }
)


class NormalisationError(ReasonCodedError):
    """A DICOM object whose pixels cannot be normalised.

    Parameters
    ----------
    reason : str
        Machine-readable reason code, one of :data:`REASONS` (``unsupported_transfer_syntax``,
        ``pixel_data_length_mismatch``, ``truncated_file``, ``no_pixel_data``, ``decode_error``,
        ``inconsistent_series``, ``volume_too_large``, ``unsupported_modality``,
        ``duplicate_slice_position``, ``irregular_slice_geometry``, ``unsupported_mosaic``).
    message : str
        Human-readable detail. It never contains values read from the file's attributes or
        file paths, so it may go to the ledger and to logs.
    """

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown normalisation reason code {reason!r}")
        super().__init__(reason, message)
