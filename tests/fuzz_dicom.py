"""A seeded DICOM fuzzer (issue 19): mutated copies of real files, to find the next verifier blind spot in CI.

Seeds are real files: pydicom's bundled test files and ``../shared/data/dicom`` (when present), at most
:data:`MAX_SEED_BYTES` each. Every mutated file plants the same identity (:data:`PLANTED_NAME`,
:data:`PLANTED_ID`) into the file's PatientName/PatientID first, so a test can assert that no output byte
holds it, wherever a mutation moved or copied it. The same ``seed`` gives the same files, byte for byte.

Mutation kinds (:data:`MUTATIONS`):

- ``byte_flip``: 1-4 random bytes of the header changed;
- ``truncate``: the file cut at a random offset;
- ``length_field``: a random 4-byte run of the header replaced by a huge or zero length;
- ``zero_sequence_length``: a planted sequence (name, text, UID in its item) whose length field reads 0
  (issue 19 item 2a);
- ``bad_instance_number``: InstanceNumber ``0!`` (item 3);
- ``traversal_modality``: Modality ``/../../../../sources/<x>/PWNED`` (item 1);
- ``long_text``: a 40,000-character SeriesDescription of letters (item 4);
- ``device_identity``: the planted name and ID in ManufacturerModelName (item 2b);
- ``binary_vr_identity``: the planted name and ID in an unlisted public element written as OB (item 2c);
- ``garbage_tail``: random bytes appended;
- ``duplicate_chunk``: a random header chunk repeated in place;
- ``deflated_identity`` (issue 41): the planted ID lower-cased and dashed in a kept code value, the file written
  Deflated Explicit VR Little Endian;
- ``deflated_flip``: a Deflated file with 1-4 bytes of its compressed stream changed;
- ``codestream_flip``: a compressed seed (RLE, JPEG, JPEG-LS, JPEG 2000) with 1-8 bytes of its pixel data changed;
- ``codestream_size``: a compressed seed whose codestream declares another image size (JPEG SOF, JPEG 2000 SIZ,
  RLE segment count).

The last two take their seeds from :func:`compressed_seed_files` (the shared data's compressed files).
"""

from __future__ import annotations

import io
import random
import struct
import warnings
from pathlib import Path

import pydicom
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.tag import Tag
from pydicom.uid import DeflatedExplicitVRLittleEndian, ImplicitVRLittleEndian

PLANTED_NAME = "Fuzzplant^Zorblax"
PLANTED_ID = "FZ90817263"
PLANTED_UID = "1.2.826.0.1.3680043.9.19.90817263"
#: byte strings no output of a fuzzed file may contain
PLANTED_BYTES = (b"Fuzzplant", b"Zorblax", b"90817263")
MUTATIONS = (
    "byte_flip",
    "truncate",
    "length_field",
    "zero_sequence_length",
    "bad_instance_number",
    "traversal_modality",
    "long_text",
    "device_identity",
    "binary_vr_identity",
    "garbage_tail",
    "duplicate_chunk",
    "deflated_identity",
    "deflated_flip",
    "codestream_flip",
    "codestream_size",
)
#: kinds that mutate a compressed seed's pixel data
COMPRESSED_KINDS = ("codestream_flip", "codestream_size")
MAX_SEED_BYTES = 600_000


def seed_files(shared_data: Path | None, n: int = 40, seed: int = 19) -> list[Path]:
    """``n`` real DICOM files (readable, with pixel data or not), chosen deterministically from pydicom's test
    files and ``shared_data/dicom``."""
    from pydicom.data import get_testdata_files

    pool = [Path(p) for p in get_testdata_files("*.dcm")]
    if shared_data is not None and (shared_data / "dicom").is_dir():
        pool += [p for p in (shared_data / "dicom").rglob("*") if p.is_file() and p.suffix.lower() in ("", ".dcm")]
    readable = []
    for p in sorted(set(pool), key=lambda q: (q.name, str(q))):
        if p.stat().st_size > MAX_SEED_BYTES:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = pydicom.dcmread(p, stop_before_pixels=True)
        except Exception:  # noqa: BLE001  not a seed
            continue
        if "SOPInstanceUID" in ds and "StudyInstanceUID" in ds and "SeriesInstanceUID" in ds:
            readable.append(p)
    rng = random.Random(seed)
    return sorted(rng.sample(readable, min(n, len(readable))), key=str)


def compressed_seed_files(shared_data: Path | None) -> list[Path]:
    """The shared data's files with encapsulated (compressed) pixel data of at most :data:`MAX_SEED_BYTES`, sorted;
    pydicom's bundled compressed files when the shared data is absent."""
    from pydicom.data import get_testdata_files

    pool = [Path(p) for p in get_testdata_files("*.dcm")]
    if shared_data is not None and (shared_data / "dicom").is_dir():
        pool = [p for p in (shared_data / "dicom").rglob("*.dcm") if p.is_file()]
    out = []
    for p in sorted(set(pool), key=str):
        if p.stat().st_size > MAX_SEED_BYTES:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = pydicom.dcmread(p, stop_before_pixels=True)
        except Exception:  # noqa: BLE001  not a seed
            continue
        ts = ds.file_meta.get("TransferSyntaxUID") if getattr(ds, "file_meta", None) is not None else None
        if ts is not None and ts.is_transfer_syntax and ts.is_compressed and "SOPInstanceUID" in ds:
            out.append(p)
    return out


def _planted(data: bytes) -> Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(io.BytesIO(data), force=True)
    ds.PatientName = PLANTED_NAME
    ds.PatientID = PLANTED_ID
    return ds


def _save(ds: Dataset, implicit: bool = False) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if implicit:
            ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
            if "PixelData" in ds and ds.file_meta.get("TransferSyntaxUID") != ImplicitVRLittleEndian:
                del ds.PixelData
            ds.save_as(buf, implicit_vr=True, little_endian=True)
        else:
            ds.save_as(buf)
    return buf.getvalue()


def _header_end(data: bytes) -> int:
    i = data.find(b"\xe0\x7f\x10\x00")
    return i if i > 132 else min(len(data), 4096)


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    """One mutation of a seed's bytes (the planted identity set first, where the file can be re-written).

    Raises
    ------
    Exception
        whatever pydicom raises for a seed it cannot re-write (callers fall back to ``byte_flip``).
    """
    if kind in ("deflated_identity", "deflated_flip"):
        ds = _planted(data)
        item = Dataset()
        item.CodeValue, item.CodingSchemeDesignator = PLANTED_ID.lower()[:2] + "-" + PLANTED_ID[2:], "99FZ"
        item.CodeMeaning = "Chest"
        ds.AnatomicRegionSequence = Sequence([item])
        if ds.file_meta.get("TransferSyntaxUID", ImplicitVRLittleEndian).is_compressed:
            del ds.PixelData  # only native pixel data can be written deflated here
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
        out = bytearray(_save(ds))
        if kind == "deflated_flip":
            body = out.find(b"\x02\x00\x10\x00", 132) + 60  # past the File Meta transfer syntax
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(min(body, len(out) - 1), len(out))] = rng.randrange(256)
        return bytes(out)
    if kind in COMPRESSED_KINDS:
        return _mutate_codestream(data, kind, rng)
    base = _save(_planted(data)) if kind not in ("zero_sequence_length",) else b""
    end = _header_end(base) if base else 0
    if kind == "byte_flip":
        out = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(132, max(133, end))] = rng.randrange(256)
        return bytes(out)
    if kind == "truncate":
        return base[: rng.randrange(132, len(base))]
    if kind == "length_field":
        out = bytearray(base)
        at = rng.randrange(132, max(133, end - 4))
        out[at : at + 4] = struct.pack("<I", rng.choice([0, 0xFFFFFFF0, 0x7FFFFFFF, len(base) * 2]))
        return bytes(out)
    if kind == "zero_sequence_length":
        ds = _planted(data)
        item = Dataset()
        item.PatientName = PLANTED_NAME
        item.TextValue = f"patient {PLANTED_ID}"
        item.ReferencedSOPInstanceUID = PLANTED_UID
        ds.ReferencedStudySequence = Sequence([item])
        out = bytearray(_save(ds, implicit=True))
        i = out.find(struct.pack("<HH", 0x0008, 0x1110), 132)
        out[i + 4 : i + 8] = struct.pack("<I", 0)
        return bytes(out)
    ds = _planted(data)
    if kind == "bad_instance_number":
        ds[0x00200013] = RawDataElement(Tag(0x00200013), "IS", 2, b"0!", 0, False, True)
    elif kind == "traversal_modality":
        ds.add(
            DataElement(
                0x00080060,
                "CS",
                f"/../../../../sources/x{rng.randrange(99)}/PWNED",
                validation_mode=pydicom.config.IGNORE,
            )
        )
    elif kind == "long_text":
        ds.add(
            DataElement(
                0x0008103E,
                "LO",
                "".join(rng.choice("abcdefghij") for _ in range(40_000)),
                validation_mode=pydicom.config.IGNORE,
            )
        )
    elif kind == "device_identity":
        ds.ManufacturerModelName = f"{PLANTED_NAME.replace('^', ' ')} {PLANTED_ID}"
    elif kind == "binary_vr_identity":
        ds.add(DataElement(0x00185100, "OB", f"{PLANTED_NAME} {PLANTED_ID} ".encode()))
    elif kind == "garbage_tail":
        return _save(ds) + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == "duplicate_chunk":
        out = _save(ds)
        at = rng.randrange(132, max(133, _header_end(out) - 16))
        return out[:at] + out[at : at + rng.randint(4, 16)] + out[at:]
    else:
        raise ValueError(f"unknown mutation {kind}")
    return _save(ds)


def _mutate_codestream(data: bytes, kind: str, rng: random.Random) -> bytes:
    """Change a compressed seed's pixel data: flip bytes inside it, or make a codestream declare another size."""
    ds = _planted(data)
    value = ds.PixelData
    out = bytearray(_save(ds))
    start = out.find(value[:64])
    if start < 0:
        raise ValueError("pixel data not found in the written file")
    if kind == "codestream_flip":
        for _ in range(rng.randint(1, 8)):
            out[start + rng.randrange(16, len(value))] ^= 1 << rng.randrange(8)
        return bytes(out)
    ts = str(ds.file_meta.TransferSyntaxUID)
    big = rng.choice([1, 65500, int(ds.Rows) * 64])
    for marker, fmt, at in (
        (b"\xff\xc0", ">HH", 5),
        (b"\xff\xc1", ">HH", 5),
        (b"\xff\xc3", ">HH", 5),
        (b"\xff\xf7", ">HH", 5),
        (b"\xff\x4f\xff\x51", ">II", 8),
    ):
        i = out.find(marker, start)
        if 0 <= i < start + len(value):
            struct.pack_into(fmt, out, i + at, big, big)
            return bytes(out)
    if ts == "1.2.840.10008.1.2.5":  # RLE: the first frame's segment count
        i = start + 8 + struct.unpack_from("<I", out, start + 4)[0] + 8
        struct.pack_into("<I", out, i, rng.choice([0, 15, 16, 0xFFFFFFFF]))
        return bytes(out)
    raise ValueError("no codestream header to change")


def fuzz_corpus(out_dir: Path, n_files: int, shared_data: Path | None, seed: int = 19) -> list[tuple[Path, str]]:
    """Write ``n_files`` mutated files under ``out_dir`` (``NNNN-<kind>.dcm``); returns ``(path, kind)`` pairs.

    Kinds cycle through :data:`MUTATIONS` over the seeds of :func:`seed_files`; a seed that cannot take a kind
    gets ``byte_flip`` of its raw bytes instead.
    """
    seeds = seed_files(shared_data, seed=seed)
    compressed = compressed_seed_files(shared_data)
    assert seeds and compressed, "no seed files: the fuzz corpus would be empty"
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(n_files):
        rng = random.Random(seed * 1_000_003 + i)
        kind = MUTATIONS[i % len(MUTATIONS)]
        pool = compressed if kind in COMPRESSED_KINDS else seeds
        src = pool[(i // len(MUTATIONS)) % len(pool)] if kind in COMPRESSED_KINDS else seeds[i % len(seeds)]
        raw = src.read_bytes()
        try:
            data = mutate(raw, kind, rng)
        except Exception:  # noqa: BLE001  a seed that cannot be re-written: flip its raw bytes
            kind = "byte_flip_raw"
            out = bytearray(raw)
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(132, min(len(out), 4096))] = rng.randrange(256)
            data = bytes(out)
        path = out_dir / f"{i:04d}-{kind}.dcm"
        path.write_bytes(data)
        made.append((path, kind))
    return made
