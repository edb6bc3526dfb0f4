"""Volume payloads as one ``.npy`` (NumPy format 1.0: a header, then the array's C-order bytes).

A 3D series is stored as a single float32 array, so its payload is a ``.npy`` and nothing else: the
geometry (spacing, origin, direction) is in the ``images`` columns. Compared with the ``.npz`` of
images schema 1.1 there is no zip CRC-32 to compute before the data can be written, no zip member
records, and the array can be decoded straight into the payload's own memory (:class:`NpyPayload`),
so the payload is never copied. Compression is left to the Parquet column (zstd).

Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html (version 1.0).
"""

from __future__ import annotations

import ctypes
import functools
import io
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

#: buffers at least this large are advised for transparent huge pages (as numpy does for its own arrays):
#: page faults on a fresh 100 MB buffer otherwise cost about as much as filling it
_HUGE_PAGE_MIN = 4 << 20
_PAGE = 4096
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=256)
def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` format 1.0 header of a C-contiguous array, as ``numpy.lib.format.write_array`` writes it.

    Parameters
    ----------
    dtype : str
        NumPy dtype string with byte order, e.g. ``"<f4"``.
    shape : tuple of int

    Returns
    -------
    bytes
        Magic, version, header length and the padded header dict (its length a multiple of 64).
    """
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, np.lib.format.header_data_from_array_1_0(np.empty((0,), dtype=dtype)) | {"shape": shape}
    )
    return out.getvalue()


def encode_npy(array: np.ndarray) -> bytes:
    """``.npy`` bytes of ``array`` (equal to ``numpy.save`` of it), the array's bytes copied once.

    Raises
    ------
    ValueError
        For object arrays (``.npy`` of those needs pickle, which payloads never hold).
    """
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError("object arrays cannot be stored as an .npy payload")
    header = npy_header(array.dtype.str, array.shape)
    made = _new_bytes(len(header) + array.nbytes) if _new_bytes is not None else None
    if made is None:
        return header + array.tobytes()
    payload, view = made
    view[: len(header)] = header
    view[len(header):] = memoryview(array).cast("B")
    return payload


def read_npy(payload: bytes) -> np.ndarray:
    """The array of a ``.npy`` payload (a new, writable array; pickled objects refused).

    Raises
    ------
    ValueError
        When ``payload`` is not a ``.npy`` or holds objects.
    """
    try:
        return np.load(io.BytesIO(payload), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"payload is not an .npy array: {exc}") from None


class NpyPayload:
    """A ``.npy`` payload whose array is computed in place.

    ``array`` is a writable C-contiguous view of the payload's data bytes; write the volume into it
    (decode each slice into ``array[k]``, clip in place, ...), then :meth:`finish` gives the payload
    ``bytes`` without copying them. Where the computed volume is another array (a step changed its
    shape), :meth:`finish` encodes that one instead (one copy).

    The bytes object comes from ``PyBytes_FromStringAndSize(NULL, size)``, which the C API lets its
    creator fill before the object is shared (CPython's own ``bytes`` constructors do so); it is not
    shared before :meth:`finish`, and ``array`` keeps it alive. Elsewhere (another interpreter, no
    ctypes) ``array`` is a plain array and :meth:`finish` copies it.

    Parameters
    ----------
    shape : tuple of int
    dtype : str
        NumPy dtype string with byte order (default ``"<f4"``, float32 little-endian).
    """

    def __init__(self, shape: tuple[int, ...], dtype: str = "<f4") -> None:
        self._header = npy_header(dtype, tuple(int(v) for v in shape))
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        made = _new_bytes(len(self._header) + size) if _new_bytes is not None else None
        self._payload: bytes | None = None
        if made is None:
            self.array = np.empty(shape, dtype=dtype)
            return
        payload, view = made
        view[: len(self._header)] = self._header
        data = np.asarray(_Owner(payload, view, len(self._header), size))
        self.array = data.view(dtype).reshape(shape)
        self._payload = payload

    def finish(self, volume: np.ndarray) -> bytes:
        """The payload of ``volume``: the in-place bytes when ``volume`` is :attr:`array` itself, else an
        encoding of ``volume`` (:func:`encode_npy`). After this, :attr:`array` is read-only."""
        if self._payload is not None and volume is self.array:
            payload, self._payload = self._payload, None
            self.array.flags.writeable = False
            return payload
        self._payload = None
        return encode_npy(volume)


class _Owner:
    """Exposes ``size`` bytes of a payload from ``offset`` through ``__array_interface__``; the array made
    from it keeps this object, hence the payload, alive."""

    def __init__(self, payload: bytes, view: memoryview, offset: int, size: int) -> None:
        self.payload, self.view = payload, view
        address = ctypes.addressof(ctypes.c_char.from_buffer(view)) + offset
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3}


def _bytes_builder() -> Callable[[int], tuple[bytes, memoryview] | None] | None:
    """``new(size) -> (bytes, writable memoryview of its buffer) | None``, or None where unavailable.

    The bytes object comes from ``PyBytes_FromStringAndSize(NULL, size)``, whose contents the C API lets
    its creator fill before the object is shared (``PyBytes_AsString``), here through
    ``PyMemoryView_FromMemory``; on Linux pages of buffers of at least 4 MB are advised ``MADV_HUGEPAGE``
    before they are first touched.
    """
    if platform.python_implementation() != "CPython":
        return None
    api = ctypes.pythonapi
    create = api.PyBytes_FromStringAndSize
    create.restype, create.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t]
    address_of = api.PyBytes_AsString
    address_of.restype, address_of.argtypes = ctypes.c_void_p, [ctypes.py_object]
    from_memory = api.PyMemoryView_FromMemory
    from_memory.restype, from_memory.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
    madvise: Any = None
    if sys.platform.startswith("linux"):
        try:
            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.restype, madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            madvise = None
    pybuf_write = 0x200

    def new(size: int) -> tuple[bytes, memoryview] | None:
        try:
            payload = create(None, size)
            address = address_of(payload)
        except (MemoryError, OSError, ctypes.ArgumentError):
            return None
        if madvise is not None and size >= _HUGE_PAGE_MIN:
            start = (address + _PAGE - 1) // _PAGE * _PAGE
            length = (address + size - start) // _PAGE * _PAGE
            if length > 0:
                madvise(start, length, _MADV_HUGEPAGE)  # advice only: its result does not matter
        return payload, from_memory(address, size, pybuf_write)

    return new


try:
    _new_bytes = _bytes_builder()
except Exception:  # noqa: BLE001 - no ctypes / no C API: payloads are assembled by plain copies
    _new_bytes = None
