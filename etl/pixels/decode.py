"""Pixel decoding: stored DICOM pixel values -> physical values (float32).

This module does the steps that every consumer of a DICOM image needs, whatever it does next:

1. check that the object holds pixel data and that its transfer syntax can be decoded with the
   installed plugins (pydicom 3 with pylibjpeg-openjpeg / -libjpeg / -rle and Pillow);
2. for native (uncompressed) syntaxes, check the *Pixel Data* length against
   Rows x Columns x SamplesPerPixel x NumberOfFrames x BitsAllocated / 8 (PS3.5 section 8.1.1)
   before decoding, telling a file cut short inside its pixel data apart from a header that
   disagrees with its data;
3. decode (pydicom's decoder for the transfer syntax, the backend of ``Dataset.pixel_array``);
4. apply the Modality LUT (PS3.3 C.11.1: *Rescale Slope/Intercept* or *Modality LUT Sequence*;
   HU for CT), per frame for enhanced multi-frame objects (PS3.3 C.7.6.16.2.9);
5. colour: *PALETTE COLOR* through its palette (PS3.3 C.7.6.3.1.5), YCbCr to RGB (PS3.3 C.7.6.3.1.2).

Everything that goes wrong raises :class:`NormalisationError` with a machine-readable ``reason``
and a message that names no patient data (no values from the file, no file paths).
"""

from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.pixels import apply_color_lut, apply_modality_lut, convert_color_space
from pydicom.pixels.decoders.base import get_decoder
from pydicom.pixels.utils import get_expected_length
from pydicom.tag import BaseTag
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

from etl.pixels.errors import NormalisationError

#: the three elements that may hold an image's pixels (PS3.3 C.7.6.3, C.7.6.24)
PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")

_YBR_TO_RGB = {"YBR_FULL", "YBR_FULL_422"}
#: integers up to this magnitude are exact in float32 (24-bit significand)
_FLOAT32_EXACT = 2**24
_PATH_RE = re.compile(r"(?:[A-Za-z]:\\|/)[^\s'\"]*")


@dataclass
class DecodedImage:
    """Result of :func:`decode_image`.

    Attributes
    ----------
    array : numpy.ndarray
        float32, shape (rows, cols) or (rows, cols, 3) for one frame; (frames, rows, cols[, 3])
        when all frames of a multi-frame object were decoded. Grayscale values are physical
        values (after the Modality LUT: HU for CT); colour values are RGB in the units of
        ``value_range``.
    photometric : str
        Photometric interpretation of ``array``: ``MONOCHROME1``, ``MONOCHROME2`` or ``RGB``.
    value_range : tuple of float
        Nominal (min, max) of ``array``: from BitsStored/PixelRepresentation pushed through the
        Modality LUT for grayscale, 0..2**bits-1 for colour.
    steps : list of dict
        Recipe steps applied (JSON-serialisable), for provenance.
    """

    array: np.ndarray
    photometric: str
    value_range: tuple[float, float]
    steps: list[dict[str, Any]] = field(default_factory=list)


def _safe(exc: BaseException) -> str:
    """Exception text with file paths removed (paths may name patients)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = _PATH_RE.sub("<path>", text)
    return f"{type(exc).__name__}: {text[:300]}"


def transfer_syntax(ds: Dataset) -> UID:
    """Return the dataset's *Transfer Syntax UID* (0002,0010).

    Falls back to the encoding the dataset was read with when it has no File Meta Information.

    Raises
    ------
    NormalisationError
        ``unsupported_transfer_syntax`` when neither is known.
    """
    meta = getattr(ds, "file_meta", None)
    ts = meta.get("TransferSyntaxUID") if meta is not None else None
    if ts:
        return UID(str(ts))
    implicit, little = getattr(ds, "original_encoding", (None, None))
    if implicit is True and little is True:
        return ImplicitVRLittleEndian
    if implicit is False:
        return ExplicitVRLittleEndian if little else ExplicitVRBigEndian
    raise NormalisationError("unsupported_transfer_syntax", "the dataset has no Transfer Syntax UID")


@functools.cache
def _tag(keyword: str) -> BaseTag:
    tag = tag_for_keyword(keyword)
    if tag is None:
        raise KeyError(f"{keyword!r} is not a DICOM keyword")
    return BaseTag(tag)


def element_value(ds: Dataset, keyword: str) -> Any:
    """``ds.get(keyword)`` for a DICOM keyword: the top-level element's value, or None when absent.

    Looks the element up by its tag, which costs a fraction of pydicom's keyword lookup (it matters
    when every slice of a long series is read a dozen times).
    """
    tag = _tag(keyword)
    return ds[tag].value if tag in ds else None


def pixel_keyword(ds: Dataset) -> str | None:
    """Return which pixel element the dataset holds (``PixelData`` ...), or None."""
    for kw in PIXEL_KEYWORDS:
        if _tag(kw) in ds:
            return kw
    return None


def n_frames(ds: Dataset) -> int:
    """*Number of Frames* (0028,0008), 1 when absent or empty."""
    try:
        return max(int(element_value(ds, "NumberOfFrames") or 1), 1)
    except (TypeError, ValueError):
        return 1


def frame_attribute(ds: Dataset, sequence: str, keyword: str, frame: int | None = 0) -> Any:
    """Look up an attribute that enhanced multi-frame objects keep in functional groups.

    Search order: the frame's item of *Per-frame Functional Groups Sequence*, then *Shared
    Functional Groups Sequence*, then the top level (classic single-frame objects), following
    PS3.3 C.7.6.16.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
    sequence : str
        Functional group macro sequence keyword, e.g. ``PixelValueTransformationSequence``.
    keyword : str
        Attribute keyword inside it, e.g. ``RescaleSlope``.
    frame : int or None
        0-based frame index; None searches only shared groups and the top level.

    Returns
    -------
    object or None
        The element's value, or None when absent everywhere.
    """
    groups = []
    per_frame = element_value(ds, "PerFrameFunctionalGroupsSequence")
    if frame is not None and per_frame and frame < len(per_frame):
        groups.append(per_frame[frame])
    shared = element_value(ds, "SharedFunctionalGroupsSequence")
    if shared:
        groups.append(shared[0])
    tag = _tag(keyword)
    for group in groups:
        seq = element_value(group, sequence)
        if seq and tag in seq[0] and seq[0][tag].value not in (None, ""):
            return seq[0][tag].value
    value = element_value(ds, keyword)
    return None if value in (None, "") else value


def rescale(ds: Dataset, frame: int | None = 0) -> tuple[float, float] | None:
    """*Rescale Slope* and *Rescale Intercept* in force for one frame (PS3.3 C.11.1, C.7.6.16.2.9).

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
    frame : int or None
        0-based frame index (functional groups first, see :func:`frame_attribute`).

    Returns
    -------
    (float, float) or None
        ``(slope, intercept)``; None when either is absent. A *Modality LUT Sequence*, when present,
        takes precedence over these (see :func:`lut_view`).
    """
    slope = frame_attribute(ds, "PixelValueTransformationSequence", "RescaleSlope", frame)
    intercept = frame_attribute(ds, "PixelValueTransformationSequence", "RescaleIntercept", frame)
    if slope is None or intercept is None:
        return None
    return float(slope), float(intercept)


def lut_view(ds: Dataset, frame: int | None) -> Dataset:
    """A small dataset holding the Modality and VOI LUT attributes in force for one frame.

    pydicom's ``apply_modality_lut`` / ``apply_voi_lut`` read the top level only and
    ``apply_windowing`` rewrites some of the dataset's elements; this view gives them the
    frame's functional-group values (PS3.3 C.7.6.16.2.9, C.7.6.16.2.10) and protects the caller's
    dataset from modification.
    """
    view = Dataset()
    for kw in ("PhotometricInterpretation", "BitsStored", "BitsAllocated", "PixelRepresentation"):
        tag = _tag(kw)
        if tag in ds:
            view[tag] = ds[tag]
    if hasattr(ds, "file_meta"):
        view.file_meta = ds.file_meta
    view.set_original_encoding(*getattr(ds, "original_encoding", (False, True)))
    modality_lut = element_value(ds, "ModalityLUTSequence")
    if modality_lut:
        view.ModalityLUTSequence = modality_lut
    else:
        pair = rescale(ds, frame)
        if pair is not None:
            view[_tag("RescaleSlope")] = _element("RescaleSlope", pair[0])
            view[_tag("RescaleIntercept")] = _element("RescaleIntercept", pair[1])
    voi_lut = element_value(ds, "VOILUTSequence")
    if voi_lut:
        view.VOILUTSequence = voi_lut
    for kw in ("WindowCenter", "WindowWidth", "VOILUTFunction"):
        value = frame_attribute(ds, "FrameVOILUTSequence", kw, frame)
        if value is not None:
            view[_tag(kw)] = _element(kw, value)
    return view


def _element(keyword: str, value: Any) -> DataElement:
    """A new element holding ``value`` with the keyword's dictionary VR (as ``setattr(ds, keyword, value)``)."""
    tag = _tag(keyword)
    return DataElement(tag, dictionary_VR(tag), value)


def _stored_range(ds: Dataset) -> tuple[float, float]:
    bits = int(element_value(ds, "BitsStored") or element_value(ds, "BitsAllocated") or 16)
    if int(element_value(ds, "PixelRepresentation") or 0) == 1:
        return float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)
    return 0.0, float(2**bits - 1)


def _read_region(ds: Dataset, offset: int, length: int) -> bytes | None:
    """Read bytes of the source the dataset was read from (path or buffer), or None."""
    if offset < 0:
        return None
    name = getattr(ds, "filename", None)
    if isinstance(name, (str, os.PathLike)) and os.path.isfile(name):
        with open(name, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)
    buf = getattr(ds, "buffer", None)
    if buf is not None and hasattr(buf, "seek") and hasattr(buf, "read"):
        pos = buf.tell()
        try:
            buf.seek(offset)
            return buf.read(length)
        finally:
            buf.seek(pos)
    return None


def _source_size(ds: Dataset) -> int | None:
    name = getattr(ds, "filename", None)
    if isinstance(name, (str, os.PathLike)) and os.path.isfile(name):
        return os.path.getsize(name)
    buf = getattr(ds, "buffer", None)
    if buf is not None and hasattr(buf, "getbuffer"):
        return buf.getbuffer().nbytes
    return None


def _ends_inside_pixel_element(ds: Dataset, keyword: str, value: bytes, ts: UID) -> bool:
    """True when the source file ends inside the pixel element (its declared length is longer).

    pydicom keeps whatever bytes were left when a native file is cut inside *Pixel Data* and drops
    the element's declared length; it is re-read here from the element header, which sits just
    before the value when the value runs to the end of the file (PS3.5 section 7.1.2).
    """
    if ts == DeflatedExplicitVRLittleEndian:
        return False
    size = _source_size(ds)
    if size is None:
        return False
    tail = value[-64:]
    if tail and _read_region(ds, size - len(tail), len(tail)) != tail:
        return False  # the element does not run to the end of the file
    tag = {"PixelData": 0x7FE00010, "FloatPixelData": 0x7FE00008, "DoubleFloatPixelData": 0x7FE00009}[keyword]
    little = ts.is_little_endian
    end = "<" if little else ">"
    tag_bytes = struct.pack(f"{end}HH", tag >> 16, tag & 0xFFFF)
    header_len = 8 if ts.is_implicit_VR else 12
    header = _read_region(ds, size - len(value) - header_len, header_len)
    if not header or len(header) != header_len or header[:4] != tag_bytes:
        return False
    (declared,) = struct.unpack(f"{end}I", header[-4:])
    return declared != 0xFFFFFFFF and declared > len(value)


def check_decodable(ds: Dataset) -> tuple[str, UID]:
    """Check, before decoding, that the dataset's pixels can be decoded.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset

    Returns
    -------
    (str, pydicom.uid.UID)
        The pixel element keyword and the transfer syntax.

    Raises
    ------
    NormalisationError
        ``truncated_file`` (empty dataset body, or the file ends inside the pixel element),
        ``no_pixel_data``, ``unsupported_transfer_syntax`` (no decoder, or its plugins are not
        installed; the message names the syntax), ``pixel_data_length_mismatch`` (native syntax
        whose pixel data length differs from Rows x Columns x SamplesPerPixel x NumberOfFrames x
        BitsAllocated / 8, beyond one byte of padding to even length, PS3.5 section 8.1.1),
        ``decode_error`` (Image Pixel module attributes missing or invalid).
    """
    if len(ds) == 0:
        # pydicom returns an empty body when the file ends inside the header or inside
        # encapsulated pixel data (it reads to EOF before the sequence delimiter).
        raise NormalisationError("truncated_file", "the dataset body is empty: the file ends prematurely")
    keyword = pixel_keyword(ds)
    if keyword is None:
        raise NormalisationError("no_pixel_data", "the object holds no Pixel Data element")
    ts = transfer_syntax(ds)
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        raise NormalisationError(
            "unsupported_transfer_syntax", f"no pixel decoder for transfer syntax {ts.name} ({ts})"
        ) from None
    if not decoder.is_available:
        missing = "; ".join(decoder.missing_dependencies)
        raise NormalisationError(
            "unsupported_transfer_syntax",
            f"transfer syntax {ts.name} ({ts}) needs plugins that are not installed: {missing}",
        )
    for kw in ("Rows", "Columns", "BitsAllocated"):
        if not element_value(ds, kw):
            raise NormalisationError("decode_error", f"Image Pixel module attribute {kw} is missing or zero")
    if decoder.is_native:
        value = ds[_tag(keyword)].value or b""
        try:
            expected = get_expected_length(ds, "bytes")
        except Exception as exc:  # noqa: BLE001 - pydicom raises several types for bad headers
            raise NormalisationError("decode_error", f"cannot size the pixel data: {_safe(exc)}") from None
        actual = len(value)
        if actual < expected and _ends_inside_pixel_element(ds, keyword, value, ts):
            raise NormalisationError(
                "truncated_file", f"the file ends inside {keyword}: {actual} of its bytes are present"
            )
        if actual != expected and not (expected % 2 == 1 and actual == expected + 1):
            raise NormalisationError(
                "pixel_data_length_mismatch",
                f"{keyword} holds {actual} bytes, the Image Pixel module implies {expected}",
            )
    return keyword, ts


def decode_image(
    ds: Dataset, frame: int | None = None, *, out: np.ndarray | None = None, checked: UID | None = None
) -> DecodedImage:
    """Decode one frame (or all frames) to physical values; see :func:`decode`.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
        A dataset read with ``pydicom.dcmread`` (a path or a buffer: the source is consulted to
        tell truncation apart from a length mismatch).
    frame : int or None
        0-based frame to decode; None decodes every frame.
    out : numpy.ndarray or None
        float32 array to write grayscale values into, e.g. one slice ``volume[k]`` of a stack
        (shape (rows, cols) for one frame); ``array`` of the result is then ``out`` itself. Not
        written (``array`` is a new array) for colour images or when the decoded shape differs.
    checked : pydicom.uid.UID or None
        The transfer syntax :func:`check_decodable` returned for ``ds``, when the caller has already
        run it (it is then not run again); None runs the check.

    Returns
    -------
    DecodedImage

    Raises
    ------
    NormalisationError
        See :func:`check_decodable`; ``decode_error`` when the codec fails, the frame index is out
        of range or the photometric interpretation is not supported; ``image_too_large``,
        ``declared_size_mismatch``, ``decoder_crashed`` (:func:`etl.pixels.contained.decode_frames`: sizes
        checked before decoding, compressed syntaxes decoded in a worker process).
    """
    ts = checked if checked is not None else check_decodable(ds)[1]
    frames = n_frames(ds)
    if frame is not None and not 0 <= frame < frames:
        raise NormalisationError("decode_error", f"frame index {frame} outside 0..{frames - 1}")
    # grayscale pixels are only read from here on, so a native little-endian frame that needs no
    # unused-bits correction (Bits Stored = Bits Allocated, whole bytes) may stay a read-only view on
    # the dataset's Pixel Data: pydicom then skips its copy (and, thus limited, logs nothing)
    bits = element_value(ds, "BitsAllocated")
    view_only = (
        ts.is_little_endian
        and not ts.is_compressed
        and bits in (8, 16, 32, 64)
        and element_value(ds, "BitsStored") == bits
        and str(element_value(ds, "PhotometricInterpretation") or "").startswith("MONOCHROME")
    )
    from etl.pixels.contained import decode_frames

    try:  # sizes checked first; compressed syntaxes decoded in the contained worker process
        arr, meta = decode_frames(ds, ts, frame, view_only)
    except NormalisationError:
        raise
    except Exception as exc:  # noqa: BLE001 - codec plugins raise many exception types
        raise NormalisationError("decode_error", f"cannot decode {ts.name}: {_safe(exc)}") from None

    photometric = str(
        meta.get("photometric_interpretation") or element_value(ds, "PhotometricInterpretation") or ""
    ).strip()
    steps: list[dict[str, Any]] = [
        {
            "step": "decode",
            "transfer_syntax": str(ts),
            "photometric_in": str(element_value(ds, "PhotometricInterpretation") or ""),
            "frame": frame,
            "n_frames": frames,
        }
    ]
    per_frame_axis = arr.ndim == (3 if photometric.startswith("MONOCHROME") or photometric == "PALETTE COLOR" else 4)

    if photometric == "PALETTE COLOR":
        try:
            arr = apply_color_lut(arr, ds)
        except Exception as exc:  # noqa: BLE001
            raise NormalisationError("decode_error", f"cannot apply the palette: {_safe(exc)}") from None
        bits = int(ds.RedPaletteColorLookupTableDescriptor[2]) if "RedPaletteColorLookupTableDescriptor" in ds else 8
        bits = 8 if arr.dtype == np.uint8 else bits
        steps.append({"step": "palette_color_lut", "bits": bits})
        return DecodedImage(arr.astype(np.float32), "RGB", (0.0, float(2**bits - 1)), steps)

    if photometric in _YBR_TO_RGB:
        arr = convert_color_space(arr, photometric, "RGB", per_frame=per_frame_axis)
        steps.append({"step": "color_space", "from": photometric, "to": "RGB", "by": "convert_color_space"})
        photometric = "RGB"
    elif photometric != str(element_value(ds, "PhotometricInterpretation") or photometric):
        steps.append(
            {
                "step": "color_space",
                "from": str(ds.PhotometricInterpretation),
                "to": photometric,
                "by": "decoder",
            }
        )

    if photometric == "RGB":
        bits = int(meta.get("bits_stored") or element_value(ds, "BitsStored") or 8)
        return DecodedImage(arr.astype(np.float32), "RGB", (0.0, float(2**bits - 1)), steps)
    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        raise NormalisationError("decode_error", f"photometric interpretation {photometric} is not supported")

    lo, hi = _stored_range(ds)
    target = out if out is not None and out.shape == arr.shape else np.empty(arr.shape, dtype=np.float32)
    pair = None
    if frame is None and frames > 1 and element_value(ds, "PerFrameFunctionalGroupsSequence"):
        pairs = []
        for i in range(frames):
            view = lut_view(ds, i)
            target[i] = apply_modality_lut(arr[i], view)
            pairs.append(_modality_params(view))
        steps.append({"step": "modality_lut", "per_frame": pairs})
        view = lut_view(ds, 0)
    elif element_value(ds, "ModalityLUTSequence"):
        view = lut_view(ds, frame if frame is not None else 0)
        target[...] = apply_modality_lut(arr, view)
        steps.append({"step": "modality_lut", **_modality_params(view)})
    else:
        pair = rescale(ds, frame if frame is not None else 0)
        _rescale_into(arr, pair, target)
        params = {"identity": True} if pair is None else {"slope": pair[0], "intercept": pair[1]}
        steps.append({"step": "modality_lut", **params})
    if pair is not None:
        ends = np.array([lo, hi], dtype=np.float64) * pair[0] + pair[1]
    elif steps[-1].get("identity"):
        ends = np.array([lo, hi], dtype=np.float64)
    else:
        ends = np.asarray(apply_modality_lut(np.array([lo, hi], dtype=np.int64), view), dtype=np.float64)
    return DecodedImage(target, photometric, (float(ends.min()), float(ends.max())), steps)


def _rescale_into(arr: np.ndarray, pair: tuple[float, float] | None, out: np.ndarray) -> None:
    """``out = arr * slope + intercept`` (PS3.3 C.11.1.1.2), float32 ``out`` of ``arr``'s shape.

    The values are those of pydicom's ``apply_modality_lut`` (float64) cast to float32. When that is
    exact, i.e. stored integers of at most 16 bits and an integral slope and intercept that keep every
    value within +-2**24, it is computed in float32 straight into ``out`` (one pass); otherwise in
    float64 and cast. ``pair`` None is the identity (a cast to float32).
    """
    if pair is None:
        np.copyto(out, arr, casting="unsafe")
        return
    slope, intercept = pair
    if (
        arr.dtype.kind in "iu"
        and arr.dtype.itemsize <= 2
        and slope.is_integer()
        and intercept.is_integer()
        and 2**16 * abs(slope) + abs(intercept) <= _FLOAT32_EXACT
    ):
        if slope == 1.0:
            np.add(arr, np.float32(intercept), out=out, dtype=np.float32)
        else:
            np.multiply(arr, np.float32(slope), out=out, dtype=np.float32)
            out += np.float32(intercept)
        return
    values = arr.astype(np.float64)
    values *= slope
    values += intercept
    np.copyto(out, values, casting="same_kind")


def _modality_params(view: Dataset) -> dict[str, Any]:
    if view.get("ModalityLUTSequence"):
        desc = view.ModalityLUTSequence[0].LUTDescriptor
        return {
            "lut": "ModalityLUTSequence",
            "entries": int(desc[0]),
            "first": int(desc[1]),
            "bits": int(desc[2]),
        }
    if "RescaleSlope" in view:
        return {"slope": float(view.RescaleSlope), "intercept": float(view.RescaleIntercept)}
    return {"identity": True}


def decode(ds: Dataset, frame: int | None = None) -> np.ndarray:
    """Decode a DICOM object's pixels to physical values.

    Stored values -> Modality LUT (PS3.3 C.11.1; HU for CT, per frame for enhanced multi-frame
    objects) for grayscale; PALETTE COLOR -> RGB through its palette (PS3.3 C.7.6.3.1.5);
    YBR_FULL / YBR_FULL_422 -> RGB (PS3.3 C.7.6.3.1.2; pydicom 3's decoders already return RGB
    for most of these, which the decoder's metadata reports, so no conversion runs twice).

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
        De-identified dataset read with ``pydicom.dcmread``.
    frame : int or None
        0-based frame to decode; None (default) decodes every frame.

    Returns
    -------
    numpy.ndarray
        float32. Shape (rows, cols) for one grayscale frame, (rows, cols, 3) for one colour frame,
        with a leading frames axis when ``frame`` is None and the object has more than one frame.

    Raises
    ------
    NormalisationError
        ``truncated_file``, ``no_pixel_data``, ``unsupported_transfer_syntax``,
        ``pixel_data_length_mismatch`` or ``decode_error`` (see :func:`check_decodable`).
    """
    return decode_image(ds, frame).array
