"""Hostile and corrupt DICOM files planted in real files of the shared data (issue 41), for the tests and the fuzz
campaign (benchmarks/fuzz_campaign.py). Each builder returns the bytes of one attack; none writes to disk."""

from __future__ import annotations

import io
import random
import struct
import warnings
import zlib
from pathlib import Path

import pydicom
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset, write_file_meta_info
from pydicom.tag import Tag
from pydicom.uid import DeflatedExplicitVRLittleEndian, ExplicitVRLittleEndian

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
DICOM = SHARED / "dicom"
NATIVE_CT = DICOM / "transfer-syntaxes" / "1.2.840.10008.1.2.1.dcm"
RLE = DICOM / "transfer-syntaxes" / "1.2.840.10008.1.2.5.dcm"
JPEG = DICOM / "transfer-syntaxes" / "1.2.840.10008.1.2.4.50.dcm"
J2K = DICOM / "transfer-syntaxes" / "1.2.840.10008.1.2.4.90.dcm"
DEFLATED = DICOM / "transfer-syntaxes" / "1.2.840.10008.1.2.1.99.dcm"
MRN, ACCESSION = "MR77312458", "AC20991734"


def read(path: Path) -> Dataset:
    """A shared-data file as a dataset."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(path, force=True)


def to_bytes(ds: Dataset) -> bytes:
    """Part-10 bytes of ``ds`` in its own transfer syntax (Deflated included)."""
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def deflated(ds: Dataset) -> bytes:
    """``ds`` written Deflated Explicit VR Little Endian (PS3.5 A.5)."""
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    return to_bytes(ds)


def with_ids(ds: Dataset) -> Dataset:
    """``ds`` with a known MRN and accession number."""
    ds.PatientID, ds.AccessionNumber = MRN, ACCESSION
    return ds


def deflated_phi_in_model() -> bytes:
    """Attack 1: a Deflated file with the MRN and accession number in ManufacturerModelName."""
    ds = with_ids(read(NATIVE_CT))
    ds.ManufacturerModelName = f"{MRN} {ACCESSION}"
    return deflated(ds)


def rle_panic() -> bytes:
    """Attack 2: an RLE Lossless NM frame with 3 bits flipped so that pylibjpeg-rle panics (index out of bounds);
    seed 7, trial 30, found by search."""
    src = RLE.read_bytes()
    value = read(RLE).PixelData
    start = src.find(value[:64])
    rng = random.Random(7)
    for _ in range(31):
        b = bytearray(src)
        for _ in range(3):
            i = rng.randrange(start + 100, start + len(value) - 10)
            b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def jpeg_size_bomb() -> bytes:
    """Attack 5a: a baseline JPEG whose frame header declares 65500 x 65500 (the DICOM header says otherwise)."""
    src = bytearray(JPEG.read_bytes())
    ds = read(JPEG)
    at = src.find(b"\xff\xc0", src.find(b"\xff\xd8\xff"))
    assert at > 0 and (ds.Rows, ds.Columns) != (65500, 65500)
    struct.pack_into(">HH", src, at + 5, 65500, 65500)
    return bytes(src)


def j2k_size_bomb() -> bytes:
    """Attack 5a': a JPEG 2000 codestream whose SIZ declares 60000 x 60000."""
    src = bytearray(J2K.read_bytes())
    at = src.find(b"\xff\x4f\xff\x51")
    struct.pack_into(">IIII", src, at + 8, 60000, 60000, 0, 0)
    return bytes(src)


def deflate_bomb(inflated: int = 300 * 1024 * 1024) -> bytes:
    """Attack 5b: a Deflated file whose dataset inflates to ``inflated`` bytes (a private OB value of zeros)."""
    ds = with_ids(read(NATIVE_CT))
    del ds.PixelData
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, False
    write_dataset(fp, ds)
    head = fp.getvalue() + struct.pack("<HH", 0x0009, 0x0010) + b"LO" + struct.pack("<H", 4) + b"BOMB"
    n = inflated - len(head)
    head += struct.pack("<HH", 0x0009, 0x1000) + b"OB\x00\x00" + struct.pack("<I", n)
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = [comp.compress(head)]
    chunk = b"\x00" * (1 << 24)
    left = n
    while left > 0:
        body.append(comp.compress(chunk[: min(left, len(chunk))]))
        left -= len(chunk)
    body.append(comp.flush())
    ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    meta = DicomBytesIO()
    meta.is_little_endian, meta.is_implicit_VR = True, False
    write_file_meta_info(meta, ds.file_meta, enforce_standard=True)
    return b"\x00" * 128 + b"DICM" + meta.getvalue() + b"".join(body)


def item_bomb(items: int = 1_000_000) -> bytes:
    """Attack 5c: a sequence of ``items`` empty items (undefined length, delimited) in a real CT file."""
    ds = with_ids(read(NATIVE_CT))
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    data = to_bytes(ds)
    seq = (
        struct.pack("<HH", 0x0040, 0x0275)
        + b"SQ\x00\x00"
        + b"\xff\xff\xff\xff"
        + (b"\xfe\xff\x00\xe0" + b"\x00\x00\x00\x00") * items
        + b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"
    )
    at = data.find(struct.pack("<HH", 0x0040, 0x0280))  # before any later element: insert in tag order
    pix = data.find(struct.pack("<HH", 0x7FE0, 0x0010) + b"OW")
    at = at if at > 0 else pix
    return data[:at] + seq + data[at:]


SEG = DICOM / "sr-seg-other" / "highdicom_seg_ct_overlap.dcm"
TRACKING_UID = 0x00620021
#: explicit VRs with a 2-byte length field (PS3.5 7.1.2); the others have 2 reserved bytes and a 4-byte length
_SHORT_VRS = {
    b"AE",
    b"AS",
    b"AT",
    b"CS",
    b"DA",
    b"DS",
    b"DT",
    b"FL",
    b"FD",
    b"IS",
    b"LO",
    b"LT",
    b"PN",
    b"SH",
    b"SL",
    b"SS",
    b"ST",
    b"TM",
    b"UI",
    b"UL",
    b"US",
}


def _element_at(data: bytes, at: int, explicit: bool) -> tuple[int, int]:
    """(header size, value length) of the element whose tag starts at ``at``."""
    if not explicit:
        return 8, struct.unpack_from("<I", data, at + 4)[0]
    if bytes(data[at + 4 : at + 6]) in _SHORT_VRS:
        return 8, struct.unpack_from("<H", data, at + 6)[0]
    return 12, struct.unpack_from("<I", data, at + 8)[0]


def length_fault(data: bytes, tag: int, through: int, explicit: bool, occurrence: int = 0) -> bytes:
    """``data`` with the length field of the ``occurrence``-th element ``tag`` enlarged so that its value swallows
    every following byte up to the end of the next element ``through`` (its header and value)."""
    out = bytearray(data)
    key = struct.pack("<HH", *divmod(tag, 0x10000))
    at = -1
    for _ in range(occurrence + 1):
        at = out.find(key, at + 1)
    assert at > 0, f"no element {tag:08X}"
    head, _ = _element_at(out, at, explicit)
    end_at = out.find(struct.pack("<HH", *divmod(through, 0x10000)), at + head)
    assert end_at > 0, f"no element {through:08X} after {tag:08X}"
    t_head, t_len = _element_at(out, end_at, explicit)
    swallowed = end_at + t_head + t_len - (at + head)
    if explicit and head == 8:
        assert swallowed < 0x10000, "too far for a 2-byte length"
        struct.pack_into("<H", out, at + 6, swallowed)
    else:
        struct.pack_into("<I", out, at + head - 4, swallowed)
    return bytes(out)


def tracking_uid_swallowed(tag: int = 0x00620020, explicit: bool = False, segment: int = 0) -> tuple[bytes, str]:
    """Attack 4b: a real Segmentation in which the ``segment``-th element ``tag`` of its Segment Sequence (by default
    the Tracking ID, UT) has a length fault that makes its value swallow the following elements through the
    segment's Tracking UID (their headers and values), so the UID rides inside a kept value. Returns the file's
    bytes (Implicit VR Little Endian as shared, or Explicit VR Little Endian) and the swallowed UID."""
    ds = with_ids(read(SEG))
    if explicit:
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    uid = str(ds.SegmentSequence[segment].TrackingUID)
    return length_fault(to_bytes(ds), tag, TRACKING_UID, explicit, segment), uid


def bad_vr_patient_id() -> bytes:
    """Fuzz campaign seed 60517, mutant 255 (a byte flip), planted in the shared native CT: the VR bytes of the
    PatientID element read ``0x4c 0xdd``, a VR no standard has, so pydicom raises ``NotImplementedError`` when the
    value is first read (after the header parsed)."""
    data = bytearray(to_bytes(with_ids(read(NATIVE_CT))))
    at = data.find(struct.pack("<HH", 0x0010, 0x0020) + b"LO")
    assert at > 132
    data[at + 4 : at + 6] = b"\x4c\xdd"
    return bytes(data)


def flipped_vr(tag: int, vr: bytes, value: bytes | None = None, patient_name: str | None = None) -> bytes:
    """The shared native CT (Explicit VR) with the VR bytes of element ``tag`` replaced by ``vr`` (fuzz campaign
    seed 60517, mutants 525 and 569: SeriesNumber's ``IS`` read ``I\\x9a``, another IS ``I\\xa4``), and its value by
    ``value`` (2-byte length form, even length) and PatientName by ``patient_name`` when given."""
    ds = with_ids(read(NATIVE_CT))
    if patient_name is not None:
        ds.PatientName = patient_name
    if value is not None:
        ds[tag] = RawDataElement(Tag(tag), ds[tag].VR, len(value), value, 0, False, True)
    data = bytearray(to_bytes(ds))
    at = data.find(struct.pack("<HH", *divmod(tag, 0x10000)), 132)
    assert at > 132 and data[at + 4 : at + 6] == ds[tag].VR.encode()
    data[at + 4 : at + 6] = vr
    return bytes(data)
