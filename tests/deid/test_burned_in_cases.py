"""Burned-in PHI text in real pixel data (../shared/tools/burned_in_cases.py) through `medreco deid`: every
``must_remove`` box left without readable text (one blank value over the whole box) or its file quarantined,
negative controls ingested with their pixels unchanged, pixels changed only by blanking, and the share of area
blanked outside the planted boxes printed (precision)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pydicom
import pytest
from ocr_required import require_ocr

from schemas.config import PROJECT_ROOT

TOOL = PROJECT_ROOT.parent / "shared" / "tools" / "burned_in_cases.py"
#: measured floor (issue 17: 150 of 150 must_remove boxes without text or withheld since the PHI sweep with tiled
#: thresholds quarantines B30 (149 with the second look at unsure words beside a text line, 148 with the stroke value of
#: each line, 145 before it; 144 before the label-block bridges), 0.97% of the area outside the boxes blanked with the
#: fonts `make tools` installs (0.94% on a set drawn with other fonts; 0.85% before the stroke value: three more files
#: ingest; 1.60% before the tight blanks); unreadable glyph rows quarantined or blanked; 142 before that, 134 before the
#: age tokens, the widened ink window and the uncut edges; the rest are open, see README)
MIN_REMOVED = 150
#: share of the area outside the planted boxes blanked on files with text, mean over the ingested ones
MAX_AREA_OUTSIDE = 0.01


@pytest.fixture(scope="module", params=["as_shipped", "detector_on_every_file"])
def run(request, tmp_path_factory, key):
    """`medreco deid` on the cases as shipped (each case is a series of its own, so it is read in full), and with
    every file sent through the series text detector first (no file read whole for being a short series or for its
    header; files at header risk are still read in full): the detector must send every file with PHI text to the
    full read."""
    require_ocr()
    if not TOOL.is_file():
        pytest.fail(f"{TOOL} is missing: the burned-in text answer key cannot be generated")
    base = tmp_path_factory.mktemp("burned_in")
    cases = base / "cases"
    subprocess.run([sys.executable, str(TOOL), str(cases), "--check"], check=True, capture_output=True)
    from medreco.cli.deid_folder import deidentify_folder

    out = base / "out"
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "detector_on_every_file":
            import dataclasses

            from etl.deid import series_text

            shipped = series_text.load_series_policy()
            everywhere = dataclasses.replace(
                shipped,
                read_whole_up_to=0,
                image_types=frozenset(),
                sop_class_prefixes=(),
                modalities=frozenset(),
                burned_in_annotation_yes=False,
            )
            mp.setattr(series_text, "load_series_policy", lambda path=None: everywhere)
        balance = deidentify_folder(cases, out, key, "bic")
    ledger = pl.read_parquet(out / "ledger.parquet")
    answer = json.loads((cases / "answer_key.json").read_text())
    _fonts_as_drawn(answer)
    return {"cases": cases, "out": out, "ledger": ledger, "answer": answer, "balance": balance, "key": key}


def _fonts_as_drawn(answer):
    """The floors above were measured on the set drawn in the fonts the tool names; a machine without one gets
    DejaVu Sans instead: another set (there B11's vertical name and birth date were missed, see README)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("burned_in_cases", TOOL)
    tool = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("burned_in_cases", tool)  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    used = {it["font"] for e in answer["files"] for it in e["planted"] if it.get("font")}
    missing = sorted(set(tool.FONT_FILES.values()) - used)
    if missing:
        pytest.fail(
            f"fonts {missing} are not installed, so the cases are drawn in substitutes: `make tools` "
            "installs fonts-dejavu-core, fonts-liberation and fonts-noto-mono"
        )


def _output_pixels(run, entry):
    """The de-identified pixels of one answer-key file, or None when it was quarantined."""
    row = run["ledger"].filter(pl.col("source_uri").str.ends_with("/" + entry["path"])).row(0, named=True)
    if row["status"] != "ingested":
        return None
    src = pydicom.dcmread(run["cases"] / entry["path"])
    path = run["out"] / "files" / f"{run['key'].pseudonym('sop', str(src.SOPInstanceUID))}.dcm"
    assert path.is_file(), f"{entry['path']}: ingested but its output is missing"
    return pydicom.dcmread(path).pixel_array


@pytest.mark.slow
def test_must_remove_text_is_gone_negatives_untouched_and_area_outside_boxes_kept(run):
    assert run["balance"]["balanced"]
    removed = total = neg_ok = 0
    outside_text, outside_neg, missed = [], [], []
    for e in run["answer"]["files"]:
        src = pydicom.dcmread(run["cases"] / e["path"]).pixel_array
        out = _output_pixels(run, e)
        nf = e["frames"]
        b = src if nf > 1 else src[None]
        if out is None:  # quarantined: withheld, nothing of it ships
            assert not e["negative_control"], f"{e['path']}: a negative control was quarantined"
            removed += sum(it["expected"] == "must_remove" for it in e["planted"])
            total += sum(it["expected"] == "must_remove" for it in e["planted"])
            continue
        a = out if nf > 1 else out[None]
        diff = (a != b).any(axis=-1) if b.ndim == 4 else a != b
        covered = np.zeros(diff.shape, bool)
        for it in e["planted"]:
            frames = range(nf) if it["frame"] == "all" else [it["frame"]]
            for f in frames:
                for box in (it["box"], it.get("backdrop_box")):
                    if box:
                        covered[f, box[1] : box[3], box[0] : box[2]] = True
            if it["expected"] != "must_remove":
                continue
            total += 1
            x0, y0, x1, y1 = it["box"]
            blank = all(len(np.unique(a[f, y0:y1, x0:x1].reshape(-1, *a.shape[3:]), axis=0)) == 1 for f in frames)
            removed += blank
            if not blank:
                missed.append(f"{e['case']}:{it['kind']}")
        # every changed pixel holds one blank value per frame (nothing else was altered)
        for f in range(nf):
            if diff[f].any():
                vals = a[f][diff[f]]
                assert len(np.unique(vals.reshape(-1, *a.shape[3:]), axis=0)) == 1, f"{e['path']}: frame {f} altered"
        share = float((diff & ~covered).sum()) / diff.size
        if e["negative_control"]:
            outside_neg.append(share)
            neg_ok += not diff.any()
        else:
            outside_text.append(share)
    print(
        f"\nBURNED_IN removed={removed}/{total} missed={missed} negatives_unchanged={neg_ok}/"
        f"{len(outside_neg)} area_blanked_outside_boxes_text={100 * np.mean(outside_text):.2f}% "
        f"negatives={100 * np.mean(outside_neg):.2f}%"
    )
    assert neg_ok == len(outside_neg) == 10
    assert removed >= MIN_REMOVED
    # precision (issue 17 target: at most 1% of the area outside the planted boxes; 0.97% measured)
    assert np.mean(outside_text) <= MAX_AREA_OUTSIDE
