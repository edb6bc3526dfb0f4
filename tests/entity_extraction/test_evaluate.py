"""Tests for entity_extraction.evaluate (harness math, label maps) and the ``eval entities`` sub-command."""

import csv
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from entity_extraction.evaluate import (
    NEGBIO_MAP_FILE,
    EvaluationDataError,
    evaluate,
    load_coded_hedges,
    load_label_map,
    load_mesh_map,
    load_openi_dir,
    mesh_heads,
    negbio_ceiling_by_fold,
    open_i_reading,
    render_table,
)
from medreco.cli.eval import app
from schemas.config import PROJECT_ROOT
from schemas.ontology import load_ontology

OPENI = PROJECT_ROOT.parent / "shared" / "data" / "openi"
CXR = "2D-CXR"
LABELS = [
    "Atelectasis",
    "Cardiomegaly",
    "Effusion",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pneumonia",
    "Pneumothorax",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Fibrosis",
    "Pleural_Thickening",
    "Hernia",
]

# uid, MeSH, indication, findings, impression, NegBio positives
ROWS = [
    (
        "1",
        "Cardiomegaly/mild;Pleural Effusion/right",
        "",
        "Mild cardiomegaly. No pleural effusion.",
        "",
        {"Cardiomegaly", "Effusion"},
    ),
    ("2", "normal", "", "Small left pleural effusion.", "", set()),
    ("3", "No Indexing", "", "Stable cardiomegaly.", "", {"Cardiomegaly"}),
    (
        "4",
        "Pulmonary Atelectasis/base/left;Catheters, Indwelling",
        "",
        "",
        "Left basilar atelectasis.",
        {"Atelectasis"},
    ),
    (
        "5",
        "Emphysema;Opacity/lung/round",
        "",
        "Emphysema. Nodule in the right upper lobe.",
        "",
        {"Emphysema", "Nodule"},
    ),
    ("6", "Calcified Granuloma/lung", "Pneumonia.", "Calcified granuloma.", "No acute disease.", set()),
]


def write_dir(root: Path, negbio: bool = True) -> Path:
    with (root / "indiana_reports.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["uid", "MeSH", "Problems", "image", "indication", "comparison", "findings", "impression"])
        for uid, mesh, ind, fin, imp, _ in ROWS:
            w.writerow([uid, mesh, "", "", ind, "", fin, imp])
    if negbio:
        with (root / "negbio_openi_gold14_labels.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["uid", "filename", *LABELS, "normal"])
            for uid, *_, pos in ROWS:
                w.writerow([uid, f"CXR{uid}", *[int(lab in pos) for lab in LABELS], int(not pos)])
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_dir(tmp_path_factory.mktemp("openi"))


@pytest.fixture(scope="module")
def results(tiny):
    return evaluate(tiny)


def counts(result):
    return {i: (s.tp, s.fp, s.fn) for i, s in result.per_entity.items() if s.tp or s.fp or s.fn}


def test_load_dir_builds_sectioned_text(tiny):
    reports = {r.uid: r for r in load_openi_dir(tiny)}
    assert reports["6"].text == "INDICATION: Pneumonia.\nFINDINGS: Calcified granuloma.\nIMPRESSION: No acute disease."
    assert reports["4"].text == "IMPRESSION: Left basilar atelectasis."
    assert reports["1"].mesh == ("Cardiomegaly/mild", "Pleural Effusion/right")
    assert reports["5"].labels["Emphysema"] == 1 and reports["5"].labels["Hernia"] == 0


def test_mesh_counts_and_figures(results):
    r = results["mesh"]
    # F018 r1 TP; F029 r1 FN (negated) + r2 FP ('normal'); F019 r4 TP (impression); F016 r5 TP (round opacity
    # + nodule) and r6 TP (calcified granuloma); r3 ('No Indexing' only) not scored; pneumonia in INDICATION
    # of r6 predicts nothing; emphysema (r5) is a 3D-CT concept: out of family, not scored.
    assert counts(r) == {"F018": (1, 0, 0), "F029": (0, 1, 1), "F019": (1, 0, 0), "F016": (2, 0, 0)}
    assert (r.n_reports, r.n_excluded) == (6, 1)
    assert r.micro == pytest.approx((0.8, 0.8, 0.8))
    assert r.macro == pytest.approx((0.75, 0.75, 0.75))  # mean over the 4 entities with gold positives
    assert r.out_of_family == {"F032": 1}
    assert sorted(r.errors) == [("1", "F029", "FN"), ("2", "F029", "FP")]
    assert r.per_entity["F029"].f1 == 0.0 and r.per_entity["F016"].precision == 1.0


def test_negbio_counts_and_figures(results):
    r = results["negbio"]
    # r3 has NegBio labels (scored here); r6 granuloma is F016 but NegBio 'Nodule' is 0 -> FP.
    assert counts(r) == {"F018": (2, 0, 0), "F029": (0, 1, 1), "F019": (1, 0, 0), "F016": (1, 1, 0)}
    assert r.n_excluded == 0
    assert r.micro == pytest.approx((4 / 6, 4 / 5, 8 / 11))
    # labels with no positive in the set are not scored (their concepts leave the universe)
    assert "C006" not in r.per_entity and "F027" not in r.per_entity
    assert any("Hernia" in n and "Pneumonia" in n for n in r.notes)
    # the bound NegBio's narrower labels set: MeSH gold as the prediction (r6 calcified granuloma -> FP)
    assert any(n.startswith("ceiling (NLM MeSH gold") and "micro precision" in n for n in r.notes)
    assert r.out_of_family == {"F032": 1}


def test_negbio_ceiling_by_fold(tiny, results):
    from entity_extraction.folds import FoldPlan

    plan = FoldPlan("openi", 5, frozenset({0, 1, 2}))
    parts = negbio_ceiling_by_fold(tiny, plan)
    # NLM's MeSH codes scored against NegBio: r1 cardiomegaly and effusion, r4 atelectasis, r5 nodule TP; r3 ('No
    # Indexing') codes nothing: its NegBio cardiomegaly FN; r6 calcified granuloma (MeSH: F016) is no NegBio nodule: FP
    assert counts(parts["all"]) == {"F018": (1, 0, 1), "F029": (1, 0, 0), "F019": (1, 0, 0), "F016": (1, 1, 0)}
    assert parts["all"].micro == pytest.approx((0.8, 0.8, 0.8))
    assert any("micro precision 0.800, recall 0.800, F1 0.800" in n for n in results["negbio"].notes)  # same figure
    tuned, held = parts["tuned"], parts["held-out"]
    assert len(tuned.errors) + len(held.errors) == 2 and {plan.part(u) for u in "123456"} == {"tuned", "held-out"}
    for part, result in (("tuned", tuned), ("held-out", held)):
        n = sum(1 for u in "123456" if plan.part(u) == part)
        assert result.n_reports == n  # every report has NegBio labels
        assert all(plan.part(uid) == part for uid, _, _ in result.errors)


def test_render_table_last_line(results):
    text = render_table(results["mesh"])
    lines = text.splitlines()
    assert lines[-1] == "micro P=0.800 R=0.800 F1=0.800 | macro P=0.750 R=0.750 F1=0.750"
    assert any(line.startswith("F029 ") and line.split()[-4:-3] == ["1"] for line in lines)
    assert "F032 Emphysema 1" in text


def test_cli_entities(tiny, tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["entities", "--openi", str(tiny), "--labels", "mesh", "--no-folds"])
    assert out.exit_code == 0, out.output
    assert out.output.strip().splitlines()[-1] == "micro P=0.800 R=0.800 F1=0.800 | macro P=0.750 R=0.750 F1=0.750"
    folded = runner.invoke(app, ["entities", "--openi", str(tiny), "--labels", "mesh"])
    assert folded.exit_code == 0, folded.output
    lines = folded.output.strip().splitlines()
    assert lines[-4] == "micro P=0.800 R=0.800 F1=0.800 | macro P=0.750 R=0.750 F1=0.750"
    assert lines[-3].startswith("k-fold openi: mesh micro F1, present, NLM's reading of hedges: tuned (folds 0,1,2; n=")
    assert lines[-2].startswith("k-fold openi: mesh micro F1, present, product convention: tuned")
    assert lines[-1].startswith("k-fold openi: mesh micro F1, present or uncertain: tuned")
    reseeded = runner.invoke(app, ["entities", "--openi", str(tiny), "--labels", "mesh", "--fold-seed", "38"])
    assert reseeded.exit_code == 0, reseeded.output
    assert reseeded.output.strip().splitlines()[-1].startswith("k-fold openi (seed 38): mesh micro F1, present or")
    both = runner.invoke(app, ["entities", "--openi", str(tiny)])
    assert both.exit_code == 0 and both.output.count("micro P=") == 2
    # the NegBio block ends with the label set's own fold gap: NLM's MeSH codes as the prediction
    last = both.output.strip().splitlines()[-1]
    assert last.startswith("k-fold openi: negbio micro F1, ceiling (NLM's MeSH codes as the prediction): tuned (")
    bad = runner.invoke(app, ["entities", "--openi", str(tmp_path / "missing")])
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1 and "not_a_directory" in bad.output
    no_neg = write_dir(tmp_path, negbio=False)
    assert runner.invoke(app, ["entities", "--openi", str(no_neg)]).output.count("micro P=") == 1
    r = runner.invoke(app, ["entities", "--openi", str(no_neg), "--labels", "negbio"])
    assert r.exit_code == 1 and "missing_labels" in r.output
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["entities", "--openi", str(tmp_path / "empty")])
    assert r.exit_code == 1 and "missing_reports" in r.output


def test_bad_dir_and_label_set(tmp_path):
    (tmp_path / "indiana_reports.csv").write_text("uid,findings\n1,x\n")
    with pytest.raises(EvaluationDataError) as err:
        load_openi_dir(tmp_path)
    assert err.value.reason == "missing_columns"
    write_dir(tmp_path)
    with pytest.raises(EvaluationDataError) as err:
        evaluate(tmp_path, ("chexpert",))
    assert err.value.reason == "unknown_label_set"


def test_mesh_map_rules():
    m = load_mesh_map()
    assert m.family == CXR
    assert m.concepts("Opacity/lung/base/bilateral/interstitial") == ("F003",)
    assert m.concepts("Opacity/lung/base/left/streaky") == ()  # nonspecific opacity: no concept
    assert m.concepts("Aorta, Thoracic/tortuous") == ("F014",)
    assert m.concepts("Calcinosis/aorta") == ("F020",)
    assert m.concepts("Calcinosis/lung/hilum/lymph nodes") == ()
    assert m.concepts("Fractures, Bone/ribs/healed/multiple") == ("F010",)
    assert m.concepts("Fractures, Bone/ribs/right") == ("F006",)
    assert m.concepts("Fractures, Bone/clavicle") == ()
    assert m.concepts("Thoracic vertebrae/degenerative") == ("C017",)
    assert m.concepts("Subcutaneous  Emphysema/right") == ()
    assert m.concepts("Pneumothorax/apex") == ()
    assert m.concepts("Something New") is None


def test_bad_maps_rejected(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text(yaml.safe_dump({"family": CXR, "mapped": {"X": [{"ids": ["F999"]}]}}))
    with pytest.raises(EvaluationDataError):
        load_mesh_map(bad)
    bad.write_text(yaml.safe_dump({"family": CXR, "mapped": {"X": [{"ids": ["F018"], "reason": "r"}]}}))
    with pytest.raises(EvaluationDataError):
        load_mesh_map(bad)
    bad.write_text(yaml.safe_dump({"family": CXR, "mapped": {"X": [{"qualifiers": ["a"], "ids": ["F018"]}]}}))
    with pytest.raises(EvaluationDataError):  # no catch-all rule
        load_mesh_map(bad)
    bad.write_text(yaml.safe_dump({"family": CXR, "mapped": {"Nodule": ["F016"]}, "unmapped": {"Nodule": "x"}}))
    with pytest.raises(EvaluationDataError):
        load_label_map(bad)


def test_mesh_map_covers_every_openi_head_term():
    onto = load_ontology()
    m = load_mesh_map()
    heads = mesh_heads(OPENI / "indiana_reports.csv")
    assert len(heads) >= 115  # 119 distinct heads (case/spacing normalised) in the shared partition
    assert [h for h in heads if not m.known(h)] == []
    for head, reason in m.unmapped.items():
        assert reason.strip(), head
    for head, rules in m.mapped.items():
        assert any(r.ids for r in rules), head  # a mapped head names at least one concept
        for rule in rules:
            assert all(i in onto.concepts for i in rule.ids)
            assert rule.ids or rule.reason.strip()
    # hard but valid terms stay mapped
    for head in ("opacity", "markings", "density", "cicatrix", "calcinosis", "infiltrate", "emphysema"):
        assert head in m.mapped


def test_negbio_map_covers_all_14_labels():
    onto = load_ontology()
    lm = load_label_map()
    with (OPENI / "negbio_openi_gold14_labels.csv").open() as f:
        header = next(csv.reader(f))
    labels = [h for h in header if h not in ("uid", "filename", "normal")]
    assert labels == LABELS
    assert sorted(lm.mapped) + sorted(lm.unmapped) and set(lm.mapped) | set(lm.unmapped) == set(LABELS)
    assert not set(lm.mapped) & set(lm.unmapped)
    assert all(i in onto.concepts for ids in lm.mapped.values() for i in ids)
    assert set(lm.unmapped) == {"Pneumothorax", "Edema"}
    assert lm.mapped["Infiltration"] == ("F007",) and lm.mapped["Emphysema"] == ("F032",)
    assert NEGBIO_MAP_FILE.is_file()


def _mention(assertion, hedges):
    return {"entity_id": "F019", "assertion": assertion, "hedges": hedges}


def test_open_i_reading_codes_alternatives_and_probable_hedges_only():
    coded = load_coded_hedges()
    assert {"versus", "and/or", "probable", "borderline"} <= coded and "may represent" not in coded
    got = open_i_reading(
        [
            _mention("uncertain", ["versus"]),  # "atelectasis versus scar": NLM codes both readings
            _mention("uncertain", ["probable"]),
            _mention("uncertain", ["may represent"]),  # a low-likelihood hedge: not coded
            _mention("uncertain", ["possible", "versus"]),  # any uncoded cue keeps it uncertain
            _mention("uncertain", []),  # no cue known (another extractor): left as is
            _mention("absent", []),
        ],
        coded,
    )
    assert [m["assertion"] for m in got] == ["present", "present", "uncertain", "uncertain", "uncertain", "absent"]


def test_open_i_reading_on_extracted_text():
    from entity_extraction.extract import EntityExtractor, study_labels

    ex = EntityExtractor()
    coded = load_coded_hedges()
    onto = load_ontology()

    def states(text):
        ms = open_i_reading(ex.extract(text, CXR), coded)
        return {r["entity_id"]: r["state"] for r in study_labels(ms, CXR, onto) if r["state"] != "not_mentioned"}

    assert states("IMPRESSION: Left basilar atelectasis versus scar.") == {"F019": "present", "F008": "present"}
    assert states("IMPRESSION: Borderline cardiomegaly.")["F018"] == "present"
    assert states("IMPRESSION: Streaky opacity may represent atelectasis.")["F019"] == "uncertain"
    assert states("IMPRESSION: No pleural effusion.")["F029"] == "absent"


def test_bad_coded_hedges_rejected(tmp_path):
    for text in ("coded_hedges: []\n", "coded_hedges: versus\n", "other: [versus]\n", ": [\n"):
        bad = tmp_path / "m.yaml"
        bad.write_text(text)
        with pytest.raises(EvaluationDataError) as err:
            load_coded_hedges(bad)
        assert err.value.reason == "invalid_map"
