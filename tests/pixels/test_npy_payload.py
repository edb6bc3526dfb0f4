"""``.npy`` volume payloads (etl/pixels/npy_payload.py): bytes equal to ``numpy.save``, arrays computed in place,
fallbacks, and the format's use by normalise_volume and the loader."""

from __future__ import annotations

import gc
import hashlib
import io
import weakref

import numpy as np
import pytest

from etl.pixels import npy_payload
from etl.pixels.npy_payload import NpyPayload, encode_npy, npy_header, read_npy


def _save(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


SHAPES = [(5, 17, 13), (1, 1, 4), (3, 8, 8), (5, 512, 512)]  # the last is 5 MB: huge-page advice


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_npy_equals_numpy_save(shape):
    volume = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    payload = encode_npy(volume)
    assert type(payload) is bytes and payload == _save(volume)
    assert hash(payload) == hash(_save(volume))  # an ordinary immutable bytes object
    assert np.array_equal(read_npy(payload), volume)
    strided = volume[:, ::2, :]  # non-contiguous: written in C order
    assert encode_npy(strided) == _save(np.ascontiguousarray(strided))


def test_header_is_numpys():
    for dtype, shape in (("<f4", (2, 3, 4)), ("<i2", (7,)), ("|u1", (1, 1))):
        arr = np.zeros(shape, dtype=dtype)
        assert npy_header(dtype, shape) == _save(arr)[: len(_save(arr)) - arr.nbytes]


@pytest.mark.parametrize("shape", SHAPES)
def test_payload_computed_in_place_equals_numpy_save(shape):
    rng = np.random.default_rng(5)
    expected = rng.standard_normal(shape).astype(np.float32)
    buffer = NpyPayload(shape)
    assert buffer.array.shape == shape and buffer.array.dtype == np.float32 and buffer.array.flags.writeable
    for k in range(shape[0]):  # as the volume is decoded: slice by slice
        buffer.array[k] = expected[k]
    np.clip(buffer.array, -1.0, 1.0, out=buffer.array)
    np.clip(expected, -1.0, 1.0, out=expected)
    payload = buffer.finish(buffer.array)
    assert type(payload) is bytes and payload == _save(expected)
    assert not buffer.array.flags.writeable  # the shared bytes can no longer be written through it


def test_finished_payload_cannot_be_written_through_its_arrays():
    buffer = NpyPayload((2, 3, 4))
    buffer.array[...] = 1.0
    payload = buffer.finish(buffer.array)
    digest = hashlib.sha256(payload).hexdigest()
    base = buffer.array
    while isinstance(base, np.ndarray):
        assert not base.flags.writeable
        with pytest.raises(ValueError):
            base.flags.writeable = True  # numpy refuses: the owner below exposes read-only memory
        base = base.base
    with pytest.raises(ValueError):
        buffer.array[0, 0, 0] = 99.0
    assert hashlib.sha256(payload).hexdigest() == digest and payload == _save(np.ones((2, 3, 4), np.float32))


def test_payloads_do_not_depend_on_pythonapi_prototypes(monkeypatch):
    """Another library in the process may set ``ctypes.pythonapi``'s prototypes to other types (as fsspec
    does for some of them): the payload builder binds its own."""
    import ctypes

    monkeypatch.setattr(ctypes.pythonapi.PyBytes_AsString, "restype", ctypes.c_char_p)
    monkeypatch.setattr(ctypes.pythonapi.PyBytes_FromStringAndSize, "restype", ctypes.c_void_p)
    buffer = NpyPayload((2, 4, 4))
    buffer.array[...] = 1.5
    assert buffer.finish(buffer.array) == _save(np.full((2, 4, 4), 1.5, np.float32))


@pytest.mark.parametrize(
    "array",
    [
        np.zeros((0, 3), np.float32),
        np.array(3.0),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.arange(12, dtype=np.int16).reshape(3, 4).T,  # Fortran order: written in C order
        np.arange(4, dtype=">f4"),
        np.array(["2026-12-01"], dtype="datetime64[D]"),
    ],
    ids=["zero-size", "0-d", "structured", "fortran", "big-endian", "datetime"],
)
def test_encode_npy_of_other_arrays_equals_numpy_save(array):
    c_order = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    assert encode_npy(array) == _save(c_order)
    back = read_npy(encode_npy(array))
    assert back.dtype == array.dtype and back.shape == array.shape and back.tobytes() == c_order.tobytes()


def test_finish_of_another_array_encodes_that_one():
    buffer = NpyPayload((2, 4, 4))
    buffer.array[...] = 1.0
    other = np.full((3, 4, 4), 2.0, dtype=np.float32)  # e.g. a duplicate slice was dropped, or resampled
    assert buffer.finish(other) == _save(other)


def test_array_keeps_its_payload_alive():
    """The array is a view of the payload's memory: dropping every other reference must not free it."""
    buffer = NpyPayload((4, 64, 64))
    array = buffer.array
    del buffer
    gc.collect()
    array[...] = 7.0  # would write into freed memory if nothing held the payload
    assert float(array.sum()) == 7.0 * array.size
    owner = array.base
    while not isinstance(owner, npy_payload._Owner):
        owner = owner.base
    ref = weakref.ref(owner)
    del array, owner
    gc.collect()
    assert ref() is None  # and is freed with the array


def test_without_the_c_api_the_payload_is_copied(monkeypatch):
    monkeypatch.setattr(npy_payload, "_new_bytes", None)
    volume = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    buffer = NpyPayload(volume.shape)
    buffer.array[...] = volume
    assert buffer.finish(buffer.array) == _save(volume) == encode_npy(volume)


def test_read_npy_refuses_other_bytes_and_pickles():
    with pytest.raises(ValueError, match="not an .npy"):
        read_npy(b"not an npy at all")
    with pytest.raises(ValueError):
        read_npy(_save(np.zeros(3))[:-5])  # cut short
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        read_npy(buf.getvalue())
    npz = io.BytesIO()
    np.savez(npz, volume=np.zeros(3))
    with pytest.raises(ValueError, match="magic"):
        read_npy(npz.getvalue())  # np.load would hand back an NpzFile
    from etl.pixels.normalise import load_payload

    with pytest.raises(ValueError):
        load_payload(_save(np.zeros((1, 2, 2), np.float32)), "npz")  # an npy labelled npz
    with pytest.raises(ValueError, match="object arrays"):
        encode_npy(np.array([None], dtype=object))


def test_loader_reads_schema_1_1_npz_rows_and_npy_rows_alike():
    """Snapshots published before images schema 1.2 hold ``.npz`` volumes (``volume`` + geometry members):
    the loader gives the same array and metadata for such a row as for the ``npy`` row of today."""
    from medreco_reader.tensors import load_image, to_tensor

    volume = np.random.default_rng(9).uniform(-1000, 1000, (3, 6, 5)).astype(np.float32)
    spacing, origin, direction = [0.7, 0.7, 1.5], [-10.0, 2.5, 30.0], list(np.eye(3).ravel())
    buf = io.BytesIO()
    np.savez(
        buf, volume=volume, spacing_mm=np.array(spacing), origin_mm=np.array(origin), direction=np.array(direction)
    )
    old = {"payload": buf.getvalue(), "payload_format": "npz", "recipe": "{}"}
    new = {
        "payload": encode_npy(volume),
        "payload_format": "npy",
        "recipe": "{}",
        "spacing_mm": spacing,
        "origin_mm": origin,
        "direction": direction,
    }
    (a, meta_a), (b, meta_b) = load_image(old), load_image(new)
    assert a.tobytes() == b.tobytes() == volume.tobytes() and a.dtype == b.dtype == np.float32
    for key, value in (("spacing_mm", spacing), ("origin_mm", origin), ("direction", direction)):
        assert meta_a[key] == meta_b[key] == pytest.approx(value)
    assert to_tensor(old).equal(to_tensor(new)) and tuple(to_tensor(new).shape) == (3, 6, 5)
