"""The decoder worker: a process that decodes compressed DICOM pixel data for :mod:`etl.pixels.contained`.

Run as a script (``python decode_worker.py LIMIT_BYTES``), never imported by the pipeline: it imports only pydicom,
numpy and the decoder plugins, then caps its own address space (``RLIMIT_AS``) at what it holds after start-up
plus ``LIMIT_BYTES``, so an allocation bomb fails inside it with ``MemoryError`` and a crash (a segfault, an abort,
a Rust panic) ends this process, not the pipeline's.

Protocol on stdin/stdout: each message is an 8-byte little-endian length and a pickle. A request is
``(transfer_syntax_uid, elements, index, view_only)`` (``elements``: pydicom DataElements of the Image Pixel module
and the pixel element); the answer is ``("ok", array, meta)`` or ``("err", exception_type_name, message)``. File
descriptor 1 is moved to stderr before the plugins load, so nothing they print can corrupt the protocol.
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
from typing import Any


def _vm_bytes() -> int:
    """Virtual memory size of this process (bytes), from /proc/self/status; 0 where unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_exact(fh, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = fh.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def main() -> None:
    """Serve decode requests until stdin closes."""
    limit = int(sys.argv[1])
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    import numpy  # noqa: F401
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.pixels.decoders.base import get_decoder
    from pydicom.uid import UID

    for uid in ("1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90"):
        try:  # load the plugins now, so their code counts in the start-up size, not in the limit
            get_decoder(UID(uid)).is_available  # noqa: B018
        except Exception:  # noqa: BLE001, S110  a missing plugin is reported per request
            pass
    vm = _vm_bytes()
    if vm and limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (vm + limit, vm + limit))
    while True:
        try:
            (n,) = struct.unpack("<Q", _read_exact(inp, 8))
            ts, elements, index, view_only = pickle.loads(_read_exact(inp, n))  # noqa: S301  our own parent
        except EOFError:
            return
        try:
            ds = Dataset()
            for elem in elements:
                ds.add(elem)
            ds.file_meta = FileMetaDataset()
            ds.file_meta.TransferSyntaxUID = UID(ts)
            uid = UID(ts)
            ds.set_original_encoding(uid.is_implicit_VR, uid.is_little_endian)
            arr, meta = get_decoder(uid).as_array(ds, index=index, view_only=view_only)
            answer: tuple[str, Any, Any] = ("ok", arr, meta)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001  a Rust panic (pyo3 PanicException) derives from BaseException
            text = str(err).splitlines()[0][:200] if str(err) else ""
            answer = ("err", type(err).__name__, text)
        del ds
        try:
            data = pickle.dumps(answer, protocol=5)
        except MemoryError:
            data = pickle.dumps(("err", "MemoryError", "the decoded image does not fit the worker's memory limit"))
        proto_out.write(struct.pack("<Q", len(data)) + data)
        proto_out.flush()
        del answer, data


if __name__ == "__main__":
    main()
