"""Issue 33 through a whole demo build: the demo corpus's head MR and head CT series (made from the pydeface average
head, with a face; answer key ``answer_key/heads.jsonl``: face, brain and inner skull, upper eyes and brow per voxel)
leave the build defaced in the curated DICOM and in their NIfTI volume objects, and no picture the build writes shows
a face.

Measured per head series: face tissue left in the face region (<= 5%), brain and inner skull voxels changed (<= 1%),
the frontal-face detector on a front render of the surface (a face before, none after), and, reported apart (the
face mask is not meant to take them), how much of the upper eyes and brow tissue is removed.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

from etl.deid import deface as D
from etl.deid import deface_series as S
from etl.demo.heads import BRAIN, BROW, FACE

pytestmark = pytest.mark.slow


def _volume(payloads: dict[str, bytes]) -> tuple[S._Volume, np.ndarray]:
    """The series stacked along its normal, and its rescaled values (HU for CT)."""
    vol = S._volume({name: S._read(data) for name, data in payloads.items()})
    return vol, vol.stored * vol.slope + vol.intercept


@pytest.fixture(scope="module")
def heads(demo_build) -> list[dict]:
    """Per head series of the answer key: its source and curated volumes, labels, NIfTI row and audit record."""
    root, st, run_id = demo_build["root"], demo_build["storage"], demo_build["first"]["run_id"]
    key = [json.loads(x) for x in (root / "answer_key" / "heads.jsonl").read_text().splitlines()]
    events = [r for p in st.list_files(f"ledger/runs/{run_id}/events/deidentify") for r in st.read_table(p).to_pylist()]
    by_uri = {r["source_uri"]: r for r in events}
    curated = {p.rsplit("/", 1)[-1].removesuffix(".dcm"): p for p in st.list_files("curated/dicom")}
    images = st.read_table("curated/images").to_pylist()
    audit = [a for p in st.list_files(f"ledger/runs/{run_id}/audit/deface") for a in json.loads(st.read_text(p))]
    out = []
    for h in key:
        rows = [by_uri[str(root / f)] for f in h["files"]]
        assert [r["status"] for r in rows] == ["ingested"] * len(rows), h["modality"]
        src, src_values = _volume({f: (root / f).read_bytes() for f in h["files"]})
        cur_bytes = {r["sop_key"]: st.read_bytes(curated[r["sop_key"]]) for r in rows}
        cur, cur_values = _volume(cur_bytes)
        labels = np.load(io.BytesIO(gzip.decompress((root / h["labels"]).read_bytes())))
        volumes = [i for i in images if i["study_key"] == rows[0]["study_key"] and i["payload_format"] == "nifti"]
        assert len(volumes) == 1, h["modality"]
        record = [a for a in audit if a["series_key"] == volumes[0]["series_key"]]
        out.append(
            {
                **h,
                "src": src,
                "src_values": src_values,
                "cur": cur,
                "cur_values": cur_values,
                "cur_bytes": cur_bytes,
                "labels": labels,
                "nifti": st.path(volumes[0]["payload_uri"]),
                "audit": record,
            }
        )
    return out


def test_the_demo_corpus_holds_head_mr_and_head_ct_with_a_face(heads):
    assert sorted(h["modality"] for h in heads) == ["CT", "MR", "MR"]
    for h in heads:
        assert h["labels"].shape == h["src_values"].shape
        thr = D.tissue_threshold(h["src_values"], h["modality"])
        face = (h["labels"] == FACE) & (h["src_values"] > thr)
        assert face.sum() > 3000 and (h["labels"] == BRAIN).sum() > 40_000 and (h["labels"] == BROW).sum() > 300
        render = D.front_render(h["src"].image, S._image_threshold(h["src"], thr))
        assert D.detect_faces(render) >= 1, h["modality"]  # the detector sees the face of the source: can fail


def test_curated_dicom_of_every_head_series_is_defaced_and_marked(heads, capsys):
    figures = []
    for h in heads:
        src, cur, b, a, labels = h["src"], h["cur"], h["src_values"], h["cur_values"], h["labels"]
        # the curated files stack in the same geometry as the source (the answer key's grid)
        assert np.allclose(src.image.GetOrigin(), cur.image.GetOrigin()) and a.shape == b.shape
        thr = D.tissue_threshold(b, h["modality"])
        face = (labels == FACE) & (b > thr)
        brain = labels == BRAIN
        brow = (labels == BROW) & (b > thr)
        m = {
            "modality": h["modality"],
            "face_tissue_left": float((a[face] > thr).mean()),
            "brain_changed": float((a[brain] != b[brain]).mean()),
            "upper_eyes_brow_removed": float((a[brow] <= thr).mean()),
            "faces_before": D.detect_faces(D.front_render(src.image, S._image_threshold(src, thr))),
            "faces_after": D.detect_faces(D.front_render(cur.image, S._image_threshold(cur, thr))),
        }
        figures.append(m)
        assert m["face_tissue_left"] <= 0.05, m
        assert m["brain_changed"] <= 0.01, m
        assert m["faces_after"] == 0 and m["faces_before"] >= 1, m
        assert 0.0 <= m["upper_eyes_brow_removed"] < 1.0, m  # reported apart: the mask leaves most of the brow
        for data in h["cur_bytes"].values():
            ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
            assert ds.RecognizableVisualFeatures == "NO"
            assert "113102" in [item.CodeValue for item in ds.DeidentificationMethodCodeSequence]
        assert [r["status"] for r in h["audit"]] == ["defaced"] and h["audit"][0]["faces_after"] == 0
    with capsys.disabled():
        print("\ndemo heads through the build:", json.dumps(figures))


def test_nifti_volume_object_of_every_head_series_holds_no_face(heads):
    for h in heads:
        nifti = sitk.ReadImage(h["nifti"], sitk.sitkFloat32)
        src = sitk.GetImageFromArray(h["src_values"].astype(np.float32))
        src.CopyInformation(h["src"].image)
        key = sitk.GetImageFromArray(h["labels"])
        key.CopyInformation(h["src"].image)
        air = -1000.0 if h["modality"] == "CT" else 0.0
        on_nifti = sitk.GetArrayFromImage(sitk.Resample(key, nifti, sitk.Transform(), sitk.sitkNearestNeighbor, 0))
        source = sitk.GetArrayFromImage(sitk.Resample(src, nifti, sitk.Transform(), sitk.sitkNearestNeighbor, air))
        values = sitk.GetArrayFromImage(nifti)
        # the NIfTI's own units (CT in HU; MR may be scaled): its tissue threshold from its values
        thr = D.tissue_threshold(values, h["modality"])
        src_thr = D.tissue_threshold(source, h["modality"])
        face = (on_nifti == FACE) & (source > src_thr)
        assert face.sum() > 3000, h["modality"]
        assert float((values[face] > thr).mean()) <= 0.05, h["modality"]
        assert D.detect_faces(D.front_render(nifti, thr)) == 0, h["modality"]


_DATA_URI = re.compile(rb"data:image/[a-z+]+;base64,([A-Za-z0-9+/=]+)")
_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF8", b"RIFF")


def _pictures(demo_build) -> list[tuple[str, bytes]]:
    """Every picture under the storage root outside ``sources/`` and ``answer_key/``: image files, image bytes in a
    binary column of any Parquet file, and ``data:image`` URIs in any other file."""
    import pyarrow.parquet as pq

    root = demo_build["root"]
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        if rel.startswith(("sources/", "answer_key/")):
            continue
        data = path.read_bytes()
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            for name in table.column_names:
                if str(table.schema.field(name).type) in ("binary", "large_binary"):
                    found += [(f"{rel}:{name}", v) for v in table[name].to_pylist() if v and v.startswith(_SIGNATURES)]
        elif data.startswith(_SIGNATURES):
            found.append((rel, data))
        else:
            found += [(f"{rel}:data-uri", base64.b64decode(m.group(1))) for m in _DATA_URI.finditer(data)]
    return found


def test_every_picture_the_build_writes_shows_no_face(demo_build, heads):
    """The build's pictures are the 2D rows' PNG payloads (curated tables and the snapshot's copies): none is made
    from a head series (head series ship as NIfTI volumes only), and the face detector finds no face on any."""
    from PIL import Image

    st = demo_build["storage"]
    head_studies = {
        json.loads(x)["study_uid"] for x in (demo_build["root"] / "answer_key" / "heads.jsonl").read_text().splitlines()
    }
    assert len(head_studies) == 3
    images = st.read_table("curated/images").to_pylist()
    pictures = _pictures(demo_build)
    assert pictures and any(name.startswith("curated/images/") for name, _ in pictures)
    png_rows = [i for i in images if i["payload_format"] == "png"]
    assert png_rows and {i["modality"] for i in png_rows} <= {"CR", "DX", "US"}
    head_series = {h["audit"][0]["series_key"] for h in heads}
    assert not [i for i in images if i["series_key"] in head_series and i["payload_format"] != "nifti"]
    for name, data in pictures:
        arr = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
        assert D.detect_faces(arr) == 0, name
