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

from medreco_reader.payloads import (
    read_npy as read_npy,  # re-exported: the reader's decoder (one implementation)
)

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
    """``.npy`` bytes of ``array`` in C order: equal to ``numpy.save`` of the array (of a C-ordered copy when it
    is not C-contiguous).

    Numeric arrays of at least one dimension and element (every volume) are copied once, straight into
    the payload; anything else goes through ``numpy.save``.

    Raises
    ------
    ValueError
        For object arrays (their ``.npy`` needs pickle, which payloads never hold).
    """
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError("object arrays cannot be stored as an .npy payload")
    if array.dtype.kind not in "biufc" or array.ndim == 0 or array.size == 0:
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        return out.getvalue()
    if _new_bytes is None:
        return npy_header(array.dtype.str, array.shape) + array.tobytes()
    buffer = NpyPayload(array.shape, array.dtype.str)
    buffer.array[...] = array
    return buffer.finish(buffer.array)


class NpyPayload:
    """A ``.npy`` payload whose array is computed in place.

    ``array`` is a writable C-contiguous view of the payload's data bytes; write the volume into it
    (decode each slice into ``array[k]``, clip in place, ...), then :meth:`finish` gives the payload
    ``bytes`` without copying them. Where the computed volume is another array (a step changed its
    shape), :meth:`finish` encodes that one instead (one copy).

    The bytes object comes from ``PyBytes_FromStringAndSize(NULL, size)``, which the C API lets its
    creator fill before the object is shared (CPython's own ``bytes`` constructors do so). Its memory
    is not initialised: the caller writes every element of ``array`` before :meth:`finish`. ``array``
    keeps the bytes alive; :meth:`finish` makes it and the arrays below it read-only (views taken
    from ``array`` before that stay writable: do not keep any). Elsewhere (another interpreter, no
    ctypes) ``array`` is a plain array and :meth:`finish` copies it.

    Parameters
    ----------
    shape : tuple of int
    dtype : str
        NumPy dtype string with byte order (default ``"<f4"``, float32 little-endian).
    """

    def __init__(self, shape: tuple[int, ...], dtype: str = "<f4") -> None:
        shape = tuple(int(v) for v in shape)
        header = npy_header(dtype, shape)
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        made = _new_bytes(len(header) + size) if _new_bytes is not None else None
        self._payload: bytes | None = None
        if made is None:
            self.array = np.empty(shape, dtype=dtype)
            return
        payload, address = made
        whole = np.asarray(_Owner(payload, address, len(header) + size))
        whole[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        self.array = whole[len(header) :].view(dtype).reshape(shape)
        self._payload = payload

    def finish(self, volume: np.ndarray) -> bytes:
        """The payload of ``volume``: the in-place bytes when ``volume`` is :attr:`array` itself, else an
        encoding of ``volume`` (:func:`encode_npy`). After this, :attr:`array` is read-only."""
        if self._payload is not None and volume is self.array:
            payload, self._payload = self._payload, None
            base: Any = self.array
            while isinstance(base, np.ndarray):  # down to the owner: none of them can be made writable again
                base.flags.writeable = False
                base = base.base
            return payload
        self._payload = None
        return encode_npy(volume)


class _Owner:
    """Exposes the ``size`` bytes of a new payload through ``__array_interface__``; the array made from it
    keeps this object, hence the payload, alive."""

    def __init__(self, payload: bytes, address: int, size: int) -> None:
        self.payload = payload
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3}


def _bytes_builder() -> Callable[[int], tuple[bytes, int] | None] | None:
    """``new(size) -> (bytes, address of its buffer) | None``, or None where unavailable.

    The bytes object comes from ``PyBytes_FromStringAndSize(NULL, size)``, whose contents the C API lets
    its creator fill before the object is shared (``PyBytes_AsString`` gives the address). The C functions
    are bound through private prototypes, so that nothing else in the process that sets
    ``ctypes.pythonapi``'s argument or result types can change them. On Linux the pages of buffers of at
    least 4 MB are advised ``MADV_HUGEPAGE`` before they are first touched.
    """
    if platform.python_implementation() != "CPython":
        return None
    api = ctypes.pythonapi
    create = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(("PyBytes_FromStringAndSize", api))
    address_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyBytes_AsString", api))
    madvise: Any = None
    if sys.platform.startswith("linux"):
        try:
            madvise = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(
                ("madvise", ctypes.CDLL(None, use_errno=True))
            )
        except (OSError, AttributeError):
            madvise = None

    def new(size: int) -> tuple[bytes, int] | None:
        try:
            payload = create(None, size)
            address = address_of(payload)
        except (MemoryError, OSError, ctypes.ArgumentError):
            return None
        if not address:
            return None
        if madvise is not None and size >= _HUGE_PAGE_MIN:
            start = (address + _PAGE - 1) // _PAGE * _PAGE
            length = (address + size - start) // _PAGE * _PAGE
            if length > 0:
                madvise(start, length, _MADV_HUGEPAGE)  # advice only: its result does not matter
        return payload, address

    return new


try:
    _new_bytes = _bytes_builder()
except Exception:  # noqa: BLE001 - no ctypes / no C API: payloads are assembled by plain copies
    _new_bytes = None
