"""Bounds on a source DICOM file checked on its bytes, before a parser allocates anything for it.

Two checks run on every DICOM source file before pydicom reads it (discovery, de-identification):

- a dataset in the *Deflated Explicit VR Little Endian* transfer syntax (1.2.840.10008.1.2.1.99, PS3.5 A.5) is
  inflated here with a cap (:data:`etl.limits.MAX_INFLATED_BYTES`, ``zlib.decompressobj`` with ``max_length``)
  and handed on as the same dataset in *Explicit VR Little Endian* (1.2.840.10008.1.2.1): pydicom would inflate
  it whole in memory (a 1 MB file can inflate to gigabytes), and every later step (the verifier included) then
  sees the decoded bytes, never a compressed stream;
- the sequence items of the file (item tags ``(FFFE,E000)`` at any depth, encapsulated pixel fragments included)
  are counted on the raw bytes and refused past :data:`etl.limits.MAX_SEQUENCE_ITEMS`: parsing a million empty
  items takes pydicom about a minute.

Errors are :class:`SourceBoundsError` with reason codes ``inflated_too_large``, ``inflate_error`` and
``too_many_sequence_items``; messages name limits, never values of the file.
"""

from __future__ import annotations

import struct
import zlib

from etl.limits import MAX_INFLATED_BYTES, MAX_SEQUENCE_ITEMS
from schemas.errors import ReasonCodedError

DEFLATED = b"1.2.840.10008.1.2.1.99"
EXPLICIT_LE = b"1.2.840.10008.1.2.1"
#: VRs whose explicit-VR header has 2 reserved bytes and a 4-byte length (PS3.5 7.1.2)
_LONG_VRS = {b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"}
_ITEM_LE = b"\xfe\xff\x00\xe0"
_ITEM_BE = b"\xff\xfe\xe0\x00"


class SourceBoundsError(ReasonCodedError, ValueError):
    """A source file past a bound (reason ``inflated_too_large``, ``inflate_error``, ``too_many_sequence_items``)."""

    message_format = "{message}"


def _file_meta(data: bytes) -> tuple[list[tuple[int, bytes, bytes]], int] | None:
    """The File Meta Information elements (tag, VR, value) of a Part-10 file and the offset of the dataset after
    them; None when ``data`` has no ``DICM`` prefix or its group 0002 cannot be read (left to the parser)."""
    if data[128:132] != b"DICM":
        return None
    pos, elems = 132, []
    while pos + 8 <= len(data):
        group, element = struct.unpack_from("<HH", data, pos)
        if group != 0x0002:
            break
        vr = data[pos + 4 : pos + 6]
        if vr in _LONG_VRS:
            if pos + 12 > len(data):
                return None
            (length,) = struct.unpack_from("<I", data, pos + 8)
            start = pos + 12
        else:
            (length,) = struct.unpack_from("<H", data, pos + 6)
            start = pos + 8
        if length == 0xFFFFFFFF or start + length > len(data):
            return None
        elems.append(((group << 16) | element, vr, data[start : start + length]))
        pos = start + length
    return elems, pos


def _meta_bytes(elems: list[tuple[int, bytes, bytes]]) -> bytes:
    """Encode File Meta elements (explicit VR little endian) with a recomputed group length (0002,0000)."""
    body = b""
    for tag, vr, value in elems:
        if tag == 0x00020000:
            continue
        head = struct.pack("<HH", tag >> 16, tag & 0xFFFF) + vr
        body += (
            head
            + (b"\x00\x00" + struct.pack("<I", len(value)) if vr in _LONG_VRS else struct.pack("<H", len(value)))
            + value
        )
    return struct.pack("<HH", 2, 0) + b"UL" + struct.pack("<HI", 4, len(body)) + body


def inflate_bounded(data: bytes, limit: int = MAX_INFLATED_BYTES) -> bytes:
    """The file unchanged, or, for a Deflated Explicit VR Little Endian file, the same dataset inflated and
    re-labelled Explicit VR Little Endian (its File Meta transfer syntax changed, group length recomputed).

    Parameters
    ----------
    data : bytes
        a Part-10 file (with or without the ``DICM`` prefix; files without it are returned unchanged).
    limit : int
        most bytes the dataset may inflate to (default :data:`etl.limits.MAX_INFLATED_BYTES`).

    Raises
    ------
    SourceBoundsError
        ``inflated_too_large`` past ``limit`` (checked while inflating: at most ``limit + 1`` bytes are ever
        produced); ``inflate_error`` when the stream is not raw DEFLATE (RFC 1951).
    """
    meta = _file_meta(data)
    if meta is None:
        return data
    elems, body_at = meta
    ts = next((v for t, _, v in elems if t == 0x00020010), b"").rstrip(b"\x00 ")
    if ts != DEFLATED:
        return data
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        body = inflater.decompress(data[body_at:], limit + 1)
    except zlib.error:
        raise SourceBoundsError("inflate_error", "the Deflated dataset is not a valid DEFLATE stream") from None
    if len(body) > limit or inflater.unconsumed_tail:
        raise SourceBoundsError(
            "inflated_too_large", f"the Deflated dataset inflates to more than {limit} bytes (the limit)"
        )
    value = EXPLICIT_LE + b"\x00"  # UI values are padded to even length with NUL
    elems = [(t, vr, value if t == 0x00020010 else v) for t, vr, v in elems]
    return data[:132] + _meta_bytes(elems) + body


def count_items(data: bytes) -> int:
    """Item tags (FFFE,E000) in ``data``, little- and big-endian: an upper bound of the sequence items a parser
    would create (a chance match inside a value can only raise the count)."""
    return data.count(_ITEM_LE) + data.count(_ITEM_BE)


def bounded_source(data: bytes, max_items: int = MAX_SEQUENCE_ITEMS, inflate_limit: int = MAX_INFLATED_BYTES) -> bytes:
    """The bytes to parse for a source DICOM file: inflated with a cap (:func:`inflate_bounded`), its sequence
    items counted.

    Raises
    ------
    SourceBoundsError
        ``inflated_too_large``, ``inflate_error`` (see :func:`inflate_bounded`); ``too_many_sequence_items`` when
        the file holds more than ``max_items`` item tags (default :data:`etl.limits.MAX_SEQUENCE_ITEMS`).
    """
    data = inflate_bounded(data, inflate_limit)
    n = count_items(data)
    if n > max_items:
        raise SourceBoundsError(
            "too_many_sequence_items", f"the file holds {n} sequence items, more than the limit of {max_items}"
        )
    return data
