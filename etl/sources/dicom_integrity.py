"""Integrity checks on a parsed DICOM file that pydicom itself lets pass."""

from __future__ import annotations

from pydicom.dataset import Dataset


def last_element_cut(ds: Dataset) -> str | None:
    """The tag, as ``"(gggg,eeee)"``, of the dataset's last top-level element when the file ends inside its value.

    pydicom reads what is there of a value whose declared length runs past the end of the file (a file cut
    in its header, or before its pixel data, then reads as a complete object without the later elements).
    Elements are stored in ascending tag order, so only the last one can be cut; it is looked at raw, before
    any conversion. Undefined lengths (sequences, encapsulated pixel data) are not judged here.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
        as read by ``pydicom.dcmread`` (deferred values are not checked).

    Returns
    -------
    str or None
        None when the last element is whole (or the dataset is empty).
    """
    if not len(ds):
        return None
    tag = max(ds.keys())
    raw = ds.get_item(tag, keep_deferred=True)  # never converts: malformed values are other checks' business
    value = getattr(raw, "value", None)
    length = getattr(raw, "length", None)
    if isinstance(value, (bytes, bytearray)) and length not in (None, 0, 0xFFFFFFFF) and len(value) < length:
        return f"({tag >> 16:04X},{tag & 0xFFFF:04X})"
    return None
