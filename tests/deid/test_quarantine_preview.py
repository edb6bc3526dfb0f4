"""Issue 40, point 8: a curator judges a file quarantined ``burned_in_text_remaining`` or ``defacing_failed`` from
a preview of its de-identified pixels (text blanked, face set to air) with the boxes that failed, stored in the
restricted ledger zone and served only by the review app behind its login (never under ``reports/``)."""

from __future__ import annotations

import base64
import hashlib
import io

import numpy as np
import pytest
from ocr_required import require_ocr
from PIL import Image
from test_burned_in_text import _bytes, _faint_beside_strong, _rf

from etl import zones
from etl.deid.preview import FAILED_RGB, render_png

TOKEN = "preview-test-review-token-0123456789"
LOCAL = {"host": "127.0.0.1:8765"}


def _faint_id_file() -> bytes:
    """An RF frame whose header PatientID is burned in faintly under a full-contrast name: the name is blanked,
    the ID is read by the PHI sweep after blanking, so the file is quarantined ``burned_in_text_remaining``."""
    return _bytes(_rf(_faint_beside_strong("7712093")))


def _red(png: bytes) -> np.ndarray:
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return (rgb[..., 0] == FAILED_RGB[0]) & (rgb[..., 1] == FAILED_RGB[1]) & (rgb[..., 2] == FAILED_RGB[2])


def test_text_still_read_after_blanking_carries_the_cleaned_frame_and_the_failed_box(key):
    from etl.deid.instance import deidentify_file
    from etl.deid.policy import build_policy
    from schemas.config import Institution

    require_ocr()
    inst = Institution(id="site-p", country="US", language="en", timezone="UTC", source_uri="/nowhere")
    out = deidentify_file(_faint_id_file(), key, inst, build_policy(), "dicom", 0)
    assert out.reason == "burned_in_text_remaining" and out.preview is not None
    (view,) = out.preview.views
    assert view.image.shape == (464, 512) and view.image.dtype == np.uint8
    # the failed box is the faint ID's line (drawn at x 276, y 370, 17 px font), not the blanked name
    assert view.failed and all(260 <= x0 and x1 <= 360 and 360 <= y0 and y1 <= 395 for x0, y0, x1, y1 in view.failed)
    # the preview shows the pixels after blanking: the name's line is black, inside a blanked (cyan) box
    assert any(x0 <= 130 and x1 >= 300 and y0 <= 50 and y1 >= 64 for x0, y0, x1, y1 in view.blanked)
    assert int(view.image[50:64, 130:300].max()) == 0
    png = render_png(out.preview)
    red = _red(png)
    ys, xs = np.nonzero(red)
    assert red.sum() > 100 and 260 <= xs.min() and xs.max() <= 370 and 355 <= ys.min() and ys.max() <= 405


def test_defacing_that_fails_after_the_face_was_removed_shows_sagittal_and_axial_views_with_the_face_box(
    monkeypatch,
):
    from etl.deid import deface_series as S
    from etl.demo import heads as H

    head, _face = H.template_head()
    series = H.head_series(H.ct_like(head), modality="CT", seed=4, size=(112, 112, 56), spacing=(2.0, 2.0, 2.5))
    files = {str(i): b for i, b in enumerate(series.files)}
    seen: list[int] = []
    monkeypatch.setattr(S, "detect_faces", lambda image: (seen.append(1), len(seen) - 1)[1])  # 0 before, 1 after
    out = S.deface_series(files, "HEAD")
    assert (out.status, out.reason) == ("quarantined", "defacing_failed")
    assert out.detail.startswith("face_detected_after")
    sagittal, axial = out.preview.views
    assert (sagittal.label, axial.label) == ("sagittal", "axial")
    h, w = sagittal.image.shape
    (x0, y0, x1, y1) = sagittal.failed[0]
    assert x1 <= w // 2 and y0 >= h // 4  # the face box: anterior (left), below the top of the head
    assert int(sagittal.image[y0:y1, x0:x1].min()) == 0  # set to air inside it: the defaced pixels are shown
    assert axial.failed and axial.failed[0][1] == 0  # anterior up in the axial view
    assert _red(render_png(out.preview)).sum() > 100
    monkeypatch.undo()
    tilted = H.head_series(H.ct_like(head), modality="CT", tilt_deg=180, size=(112, 112, 56), spacing=(2.0, 2.0, 2.5))
    out = S.deface_series({str(i): b for i, b in enumerate(tilted.files)}, "HEAD")
    assert out.detail.startswith("rotation:")  # failed before a face region: the views, no box
    assert [v.label for v in out.preview.views] == ["sagittal", "axial"] and not any(
        v.failed for v in out.preview.views
    )


@pytest.fixture()
def quarantined_root(tmp_path, key):
    """The build stages on a folder of one faint-ID RF file and one clean file, then the run's ledger."""
    from helpers import run_pixel_stages

    from etl.pipeline.ledger import finalise

    require_ocr()
    source = tmp_path / "source"
    source.mkdir()
    (source / "faint_id.dcm").write_bytes(_faint_id_file())
    clean = _rf(np.full((464, 512), 80, np.uint8))
    clean.PatientID = "5550001"
    (source / "clean.dcm").write_bytes(_bytes(clean))
    ctx = run_pixel_stages(tmp_path, source, "site-p", key)
    finalise(ctx)
    return ctx, hashlib.sha256((source / "faint_id.dcm").read_bytes()).hexdigest()


def test_the_stage_stores_the_preview_in_the_ledger_zone_and_the_review_app_serves_it_after_login(quarantined_root):
    from fastapi.testclient import TestClient

    from quality.review import quarantine_items
    from quality.review_app import create_app
    from quality.review_auth import RequestGuard, TokenAuth, allowed_hosts_from_env

    ctx, sha = quarantined_root
    st = ctx.storage
    assert st.list_files(zones.PREVIEWS_DIR) == [zones.quarantine_preview(sha)]
    assert not [p for p in st.list_files(zones.REPORTS) if p.endswith(".png")]  # never beside the dashboard
    (item,) = [i for i in quarantine_items(st) if i["id"] == sha[:12]]
    assert item["reason"] == "burned_in_text_remaining" and item["preview"] is True
    app = create_app(st, authenticate=TokenAuth(TOKEN), guard=RequestGuard(allowed_hosts_from_env()))
    client = TestClient(app, base_url="http://127.0.0.1:8765", follow_redirects=False)
    login = {"authorization": "Basic " + base64.b64encode(f"curator:{TOKEN}".encode()).decode()}
    for path in (f"/review/{sha[:12]}/preview.png", f"/review/{sha[:12]}"):
        r = client.get(path, headers=LOCAL)
        assert r.status_code == 401 and b"PNG" not in r.content  # nothing without the login
    r = client.get(f"/review/{sha[:12]}/preview.png", headers={**LOCAL, **login})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content == st.read_bytes(zones.quarantine_preview(sha)) and _red(r.content).sum() > 100
    assert r.headers["cache-control"] == "no-store"
    page = client.get("/review", headers={**LOCAL, **login}).text
    assert f'src="/review/{sha[:12]}/preview.png"' in page
    detail = client.get(f"/review/{sha[:12]}", headers={**LOCAL, **login})
    assert detail.status_code == 200 and 'id="preview"' in detail.text
    other = "0" * 12
    assert client.get(f"/review/{other}/preview.png", headers={**LOCAL, **login}).status_code == 404
