"""Contained decoding of compressed pixel data: sizes checked before allocation, decoders run in a worker process.

Compressed pixel data (RLE, JPEG, JPEG-LS, JPEG 2000, ...) is decoded by C and Rust plugins that a corrupt or
hostile codestream can crash (a segfault, an abort, a Rust panic, which derives from ``BaseException``) or make
allocate gigabytes. This module:

1. checks the sizes before anything is decoded (:func:`preflight`): the bytes the call would produce against
   :data:`etl.limits.MAX_DECODED_BYTES`, and the size each frame's codestream declares against Rows and Columns:
   JPEG and JPEG-LS frame headers (SOFn, ITU-T T.81 B.2.2; SOF55, T.87 C.2.2), the JPEG 2000 image and tile size
   marker (SIZ, ITU-T T.800 A.5.1), the RLE header (PS3.5 G.3.1: 1 to 15 segments, increasing offsets inside the
   frame, one segment per sample and byte);
2. decodes in one reused worker process (:mod:`etl.pixels.decode_worker`) started on first use, with an address
   space limit (``RLIMIT_AS``, :data:`etl.limits.DECODER_MEMORY_BYTES` beyond its start-up size) and a time limit
   per call (:data:`etl.limits.DECODE_TIME_LIMIT_S`); a worker that dies or runs over is replaced for the next
   call.

Native (uncompressed) pixel data is decoded in the calling process by pydicom (a reshape of bytes whose length is
checked first): no plugin runs. Errors are :class:`etl.pixels.decode.NormalisationError` with reason
``image_too_large``, ``declared_size_mismatch``, ``decode_error`` (the decoder raised, the exception's type named)
or ``decoder_crashed`` (the worker died or ran over its time limit, the signal named).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.dataset import Dataset
from pydicom.encaps import generate_fragmented_frames
from pydicom.uid import UID

from etl.limits import DECODE_TIME_LIMIT_S, DECODER_MEMORY_BYTES, MAX_DECODED_BYTES, RecordLimitError
from etl.pixels.errors import NormalisationError

_WORKER = Path(__file__).with_name("decode_worker.py")
_PIXEL_TAGS = (0x7FE00010, 0x7FE00008, 0x7FE00009)
#: JPEG start-of-frame markers (T.81 Table B.1: SOF0-3, 5-7, 9-11, 13-15) and JPEG-LS SOF55 (T.87)
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xF7})
_JPEG = ("1.2.840.10008.1.2.4.5", "1.2.840.10008.1.2.4.6", "1.2.840.10008.1.2.4.7", "1.2.840.10008.1.2.4.8")
_J2K = ("1.2.840.10008.1.2.4.9", "1.2.840.10008.1.2.4.20")
_RLE = "1.2.840.10008.1.2.5"


def _int(ds: Dataset, tag: int, default: int = 0) -> int:
    try:
        value = ds[tag].value if tag in ds else None
        return int(value) if value not in (None, "", b"") else default
    except (TypeError, ValueError):
        return default


def _jpeg_size(frame: bytes) -> tuple[int, int] | None:
    """(rows, columns) a JPEG or JPEG-LS codestream declares in its frame header; None when it has none before
    its first scan (or is cut)."""
    pos = 2
    n = len(frame)
    while pos + 4 <= n:
        if frame[pos] != 0xFF:
            return None
        marker = frame[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        if marker == 0xDA or marker == 0xD9:  # a scan or the end before any frame header
            return None
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        if marker in _SOF:
            if pos + 9 > n:
                return None
            rows, cols = struct.unpack_from(">HH", frame, pos + 5)
            return rows, cols
        pos += 2 + length
    return None


def _j2k_size(frame: bytes) -> tuple[int, int] | None:
    """(rows, columns) of a JPEG 2000 codestream's SIZ marker (Ysiz - YOsiz, Xsiz - XOsiz); the codestream may be
    wrapped in a JP2 file; None without SIZ in its first 4 KiB."""
    at = frame.find(b"\xff\x4f\xff\x51", 0, 4096)
    if at < 0 or at + 24 > len(frame):
        return None
    xsiz, ysiz, xo, yo = struct.unpack_from(">IIII", frame, at + 8)
    return ysiz - yo, xsiz - xo


def _check_rle(frame: bytes, segments: int) -> None:
    if len(frame) < 64:
        raise NormalisationError("decode_error", "an RLE frame is shorter than its 64-byte header")
    header = struct.unpack_from("<16I", frame, 0)
    n = header[0]
    offsets = header[1 : 1 + n] if 1 <= n <= 15 else ()
    if not offsets or n != segments:
        raise NormalisationError(
            "declared_size_mismatch", f"an RLE frame declares {n} segments, the Image Pixel module implies {segments}"
        )
    if offsets[0] != 64 or any(b <= a for a, b in zip(offsets, offsets[1:])) or offsets[-1] >= len(frame):
        raise NormalisationError("decode_error", "an RLE frame's segment offsets are not increasing within it")


def preflight(ds: Dataset, ts: UID, index: int | None = None, limit: int = MAX_DECODED_BYTES) -> None:
    """Check, before decoding, the size a decoder call would produce and the size each codestream declares.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
    ts : pydicom.uid.UID
        its transfer syntax.
    index : int or None
        the frame to decode (0-based), None for all.
    limit : int
        most bytes the call may produce (default :data:`etl.limits.MAX_DECODED_BYTES`).

    Raises
    ------
    NormalisationError
        ``image_too_large`` (Rows x Columns x SamplesPerPixel x bytes per sample x frames over ``limit``),
        ``declared_size_mismatch`` (a JPEG/JPEG-LS/JPEG 2000 codestream declares other Rows or Columns than the
        header, an RLE header another number of segments), ``decode_error`` (the fragments cannot be split into
        frames, an RLE header's offsets are out of order).
    """
    rows, cols = _int(ds, 0x00280010), _int(ds, 0x00280011)
    samples, bits = max(_int(ds, 0x00280002, 1), 1), max(_int(ds, 0x00280100, 8), 1)
    frames = max(_int(ds, 0x00280008, 1), 1)
    size = rows * cols * samples * -(-bits // 8) * (1 if index is not None else frames)
    if size > limit:
        raise NormalisationError(
            "image_too_large", f"decoding would produce {size} bytes, more than the limit of {limit}"
        )
    if not ts.is_compressed:
        return
    tag = next((t for t in _PIXEL_TAGS if t in ds), None)
    value = ds[tag].value if tag is not None else None
    if not isinstance(value, (bytes, bytearray)):
        return
    uid = str(ts)
    kind = "jpeg" if uid.startswith(_JPEG) else "j2k" if uid.startswith(_J2K) else "rle" if uid == _RLE else None
    if kind is None:
        return
    try:
        for i, fragments in enumerate(generate_fragmented_frames(value, number_of_frames=frames)):
            if index is not None and i != index:
                continue
            first = fragments[0] if fragments else b""
            if kind == "rle":
                _check_rle(b"".join(fragments) if len(fragments) > 1 else first, samples * -(-bits // 8))
                continue
            declared = _jpeg_size(first) if kind == "jpeg" else _j2k_size(first)
            if declared is None:
                raise NormalisationError("decode_error", f"frame {i}'s codestream declares no image size")
            if declared != (rows, cols):
                raise NormalisationError(
                    "declared_size_mismatch",
                    f"frame {i}'s codestream declares {declared[0]} x {declared[1]}, the header {rows} x {cols}",
                )
    except NormalisationError:
        raise
    except Exception as err:  # noqa: BLE001  pydicom raises several types for broken encapsulation
        raise NormalisationError(
            "decode_error", f"the encapsulated pixel data cannot be split into frames: {type(err).__name__}"
        ) from None


class DecoderWorker:
    """One decoder process, started on first use and replaced after a crash or a time-out (see module docs)."""

    def __init__(self, memory: int = DECODER_MEMORY_BYTES, seconds: float = DECODE_TIME_LIMIT_S) -> None:
        self.memory, self.seconds = memory, seconds
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None or self.pid != os.getpid():
            self.pid = os.getpid()
            self.proc = subprocess.Popen(  # noqa: S603  our own script, no shell
                [sys.executable, str(_WORKER), str(self.memory)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        return self.proc

    def stop(self) -> None:
        """End the worker process (it is started again on the next call)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _read(self, proc: subprocess.Popen, n: int, deadline: float) -> bytes:
        assert proc.stdout is not None  # started with stdout=PIPE
        fd = proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def decode(self, ds: Dataset, ts: UID, index: int | None, view_only: bool = False) -> tuple[np.ndarray, dict]:
        """``pydicom``'s ``get_decoder(ts).as_array(ds, index=index)`` run in the worker: (array, metadata).

        Raises
        ------
        NormalisationError
            ``decode_error`` (the decoder raised; its exception's type named, a Rust panic included),
            ``decoder_crashed`` (the worker died, by which signal, or ran past its time limit: it is replaced).
        """
        elements = [ds[t] for t in ds.keys() if t.group == 0x0028 or t in _PIXEL_TAGS]
        request = pickle.dumps((str(ts), elements, index, view_only), protocol=5)
        with self.lock:
            proc = self._start()
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.write(struct.pack("<Q", len(request)) + request)
                proc.stdin.flush()
                deadline = time.monotonic() + self.seconds
                (n,) = struct.unpack("<Q", self._read(proc, 8, deadline))
                answer = pickle.loads(self._read(proc, n, deadline))  # noqa: S301  our own worker's answer
            except TimeoutError:
                self.stop()
                raise NormalisationError(
                    "decoder_crashed", f"the {ts.name} decoder ran longer than {self.seconds:g} s: stopped"
                ) from None
            except (EOFError, OSError, struct.error, pickle.UnpicklingError):
                try:
                    code = proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.stop()
                    code = proc.returncode
                self.proc = None
                how = (
                    f"signal {signal.Signals(-code).name}"
                    if code is not None and code < 0 and -code in signal.Signals._value2member_map_
                    else f"exit status {code}"
                )
                raise NormalisationError("decoder_crashed", f"the {ts.name} decoder's process died ({how})") from None
            except BaseException:
                self.stop()  # interrupted mid-answer (a time limit of the caller): the next call starts afresh
                raise
        if answer[0] != "ok":
            raise NormalisationError("decode_error", f"the {ts.name} decoder failed: {answer[1]}")
        return answer[1], answer[2]


_worker = DecoderWorker()
atexit.register(_worker.stop)


def decode_frames(ds: Dataset, ts: UID, index: int | None = None, view_only: bool = False) -> tuple[np.ndarray, Any]:
    """Decode pixel data, bounded and contained: ``(array, metadata)`` as pydicom's ``Decoder.as_array``.

    Compressed syntaxes: :func:`preflight`, then the shared :class:`DecoderWorker`. Native syntaxes: the size
    check of :func:`preflight`, then pydicom in this process (non-interrupt ``BaseException`` caught).

    Raises
    ------
    NormalisationError
        ``image_too_large``, ``declared_size_mismatch``, ``decode_error``, ``decoder_crashed``.
    """
    from pydicom.pixels.decoders.base import get_decoder

    preflight(ds, ts, index)
    if ts.is_compressed:
        return _worker.decode(ds, ts, index, view_only)
    try:
        return get_decoder(ts).as_array(ds, index=index, view_only=view_only)  # type: ignore[arg-type]
    except (KeyboardInterrupt, SystemExit):
        raise
    except (NormalisationError, RecordLimitError):
        raise
    except BaseException as err:  # noqa: BLE001  every decoder failure, a Rust panic included
        raise NormalisationError("decode_error", f"cannot decode {ts.name}: {type(err).__name__}") from None


def pixel_array(ds: Dataset, view_only: bool = False) -> np.ndarray:
    """``ds.pixel_array`` (every frame, YBR converted to RGB) decoded through :func:`decode_frames`; with
    ``view_only`` a native syntax's array may be a read-only view of the pixel data (no copy).

    Raises
    ------
    NormalisationError
        see :func:`decode_frames`; ``unsupported_transfer_syntax`` without a Transfer Syntax UID.
    """
    meta = getattr(ds, "file_meta", None)
    ts = meta.get("TransferSyntaxUID") if meta is not None else None
    if not ts:
        raise NormalisationError("unsupported_transfer_syntax", "the dataset has no Transfer Syntax UID")
    return decode_frames(ds, UID(str(ts)), view_only=view_only)[0]
