"""Great Expectations gates: planted faults fail the gate naming the expectation, the quality stage writes a GE
file context, Data Docs with a retention cap and the dashboard, and curator decisions round-trip through the
FastAPI review app into the next run's ledger."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from test_quality_checks import TODAY, build, clean_rows

from etl.pipeline.context import BuildContext
from etl.pipeline.ledger import REJECTED_REASON, REVIEW_FILE, apply_review, build_ledger, finalise
from etl.sources.discover import PLAN_SCHEMA
from etl.storage import Storage
from quality.checks import run_checks
from quality.dashboard import PAGES
from quality.gate import QualityGateError, quality_stage, raise_on_critical
from quality.gx_suites import prune_validation_results, run_suites
from schemas.base import table_from_rows
from schemas.config import PROJECT_ROOT
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

PLANTED_NAME = "Matilda Walker"


def _ledger_rows() -> list[dict]:
    """The clean ledger with realistic digests (distinct 12-digit opaque ids)."""
    rows = clean_rows()["ledger"]
    for i, r in enumerate(rows):
        r["sha256"] = hashlib.sha256(b"file %d" % i).hexdigest()
    rows[3]["duplicate_of"] = rows[0]["source_uri"]
    return rows


def _gate(rows, only) -> str:
    report = run_checks(build(rows), load_ontology(), today=TODAY, only=set(only))
    with pytest.raises(QualityGateError) as err:
        raise_on_critical(report)
    return str(err.value)


def test_duplicate_key_fails_the_gate_naming_the_expectation():
    rows = clean_rows()
    rows["studies"].append(dict(rows["studies"][0]))
    msg = _gate(rows, {"studies"})
    assert "studies: expect_column_values_to_be_unique:study_key" in msg and "2 of 4 values" in msg


def test_prior_after_current_fails_the_gate():
    rows = clean_rows()
    rows["pairs"][0]["prior_study_key"], rows["pairs"][0]["current_study_key"] = "s2", "s1"
    msg = _gate(rows, {"pairs"})
    # the order needs the studies table (a cross-table check); the negative gap is a GE expectation
    assert "pairs: pair_order" in msg
    assert "pairs: expect_column_values_to_be_between" not in msg  # gap_days stayed 60
    rows["pairs"][0]["gap_days"] = -60
    assert "pairs: expect_column_values_to_be_between:gap_days" in _gate(rows, {"pairs"})


def test_out_of_ontology_entity_fails_the_gate():
    rows = clean_rows()
    rows["entity_mentions"][0]["entity_id"] = "F999"
    msg = _gate(rows, {"entity_mentions"})
    assert "entity_mentions: expect_column_values_to_be_in_set:entity_id" in msg
    assert "F999" not in msg


def test_leaked_name_in_report_fails_the_gate():
    rows = clean_rows()
    rows["reports"][1]["text"] += f" Discussed with Dr. {PLANTED_NAME} on the ward."
    msg = _gate(rows, {"reports"})
    assert "reports: expect_column_values_to_not_match_regex_list:text|indication" in msg
    assert "1 of 12 values" in msg and "Walker" not in msg


def test_warnings_do_not_fail_the_gate():
    rows = clean_rows()
    rows["images"][0]["view"] = "FRONTAL"  # a warning-level expectation
    report = run_checks(build(rows), load_ontology(), today=TODAY, only={"images"})
    assert [r.check for r in report.warnings] == ["expect_column_values_to_be_in_set:view"]
    raise_on_critical(report)  # no exception


def test_data_docs_retention_keeps_the_newest_runs(tmp_path):
    tables = build(clean_rows())
    project, docs = tmp_path / "reports", tmp_path / "reports" / "data_docs"
    for i in range(4):
        run_suites(
            tables,
            load_ontology(),
            today=TODAY,
            project_dir=project,
            data_docs_dir=docs,
            run_name=f"run-{i}",
            keep_runs=2,
            only={"splits"},
        )
    results = project / "gx" / "uncommitted" / "validations"
    suites = sorted(p.name for p in results.iterdir() if p.is_dir())
    assert suites == ["splits", "splits__phi_warning"]
    for suite in suites:
        assert sorted(p.name for p in (results / suite).iterdir()) == ["run-2", "run-3"]
        assert sorted(p.name for p in (docs / "validations" / suite).iterdir()) == ["run-2", "run-3"]
    index = (docs / "index.html").read_text()
    assert "run-3" in index and "run-2" in index and "run-1" not in index and "run-0" not in index
    # a retry of the same run replaces its results instead of adding a third run
    run_suites(
        tables,
        load_ontology(),
        today=TODAY,
        project_dir=project,
        data_docs_dir=docs,
        run_name="run-3",
        keep_runs=2,
        only={"splits"},
    )
    assert sorted(p.name for p in (results / "splits").iterdir()) == ["run-2", "run-3"]
    assert len(list((results / "splits" / "run-3").iterdir())) == 1
    assert prune_validation_results(project, docs, 0) == ["run-2", "run-3"]
    with pytest.raises(ValueError):
        prune_validation_results(project, docs, -1)


# ----------------------------------------------------------------------------- the quality stage on a root


def _root_with_run(tmp_path: Path, rows: dict, run_id: str) -> BuildContext:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["storage"]["root"] = str(tmp_path / "root")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    ctx = BuildContext.from_config_file(cfg, run_id=run_id)
    st = ctx.storage
    for name, table in build(rows).items():
        if name != "ledger":
            st.write_table(ctx.table_path(name, 0), table)
    rows["ledger"] = _ledger_rows()
    ledger = [dict(r, run_id=run_id) for r in rows["ledger"]]
    plan = [
        dict(
            source_uri=r["source_uri"],
            institution=r["institution"],
            sha256=r["sha256"],
            bytes=r["bytes"],
            kind=r["kind"],
            shard=r["shard"],
            status="pending" if r["status"] in ("ingested", "quarantined") else r["status"],
            reason=r["reason"] if r["status"] not in ("ingested", "quarantined") else None,
            detail=None,
            duplicate_of=r["duplicate_of"],
        )
        for r in ledger
    ]
    st.write_table(ctx.plan_path(), table_from_rows(plan, PLAN_SCHEMA))
    events = [
        dict(
            source_uri=r["source_uri"],
            sha256=r["sha256"],
            stage=r["stage"],
            status=r["status"],
            reason=r["reason"],
            detail=r["detail"],
        )
        for r in ledger
        if r["status"] in ("ingested", "quarantined")
    ]
    from etl.pipeline.context import EVENT_SCHEMA

    st.write_table(ctx.events_path("deidentify", 0), table_from_rows(events, EVENT_SCHEMA))
    return ctx


@pytest.fixture(scope="module")
def failed_stage(tmp_path_factory):
    """One quality stage on a root whose reports keep a planted name: it must fail before the snapshot."""
    tmp = tmp_path_factory.mktemp("gate")
    rows = clean_rows()
    rows["reports"][0]["findings"] = f"Small effusion. Discussed with Dr. {PLANTED_NAME}."
    ctx = _root_with_run(tmp, rows, "run-1")
    finalise(ctx)
    with pytest.raises(QualityGateError) as err:
        quality_stage(ctx)
    return ctx, str(err.value)


def test_quality_stage_fails_names_the_expectation_and_writes_docs(failed_stage):
    ctx, msg = failed_stage
    assert "reports: expect_column_values_to_not_match_regex_list:text|" in msg
    root = Path(ctx.storage.root)
    assert (root / "reports" / "gx" / "great_expectations.yml").is_file()
    checkpoints = sorted(p.stem for p in (root / "reports" / "gx" / "checkpoints").glob("*.json"))
    assert "medreco_reports" in checkpoints and "medreco_reports__phi_critical" in checkpoints
    docs = root / "reports" / "data_docs"
    assert (docs / "index.html").is_file()
    assert list((docs / "validations" / "reports__phi_critical" / "run-1").rglob("*.html"))
    assert (root / "reports" / "dashboard" / "checks.html").is_file()  # the curator sees why
    doc = json.loads((root / "reports" / "quality" / "run-1.json").read_text())
    assert doc["passed"] is False
    # no value of the data reached the reports zone: counts only (GE partial_unexpected_count 0)
    for f in (root / "reports").rglob("*"):
        if f.is_file() and f.suffix in (".json", ".html", ".yml"):
            assert "Walker" not in f.read_text(encoding="utf-8", errors="replace"), f


# ----------------------------------------------------------------------------- curator decisions


def test_apply_review_rejects_and_notes_release():
    rows = _ledger_rows()
    ledger = table_from_rows(rows, SCHEMAS["ledger"])
    q_sha, in_sha = rows[2]["sha256"], rows[0]["sha256"]
    review = [
        {"sha256": q_sha[:12], "decision": "reject", "decided_at": "2025-06-02T10:00:00+00:00"},
        {"sha256": in_sha, "decision": "reject", "decided_at": "2025-06-02T10:00:00+00:00"},
    ]
    out, counts = apply_review(ledger, review)
    row = out.to_pylist()[2]
    assert (row["status"], row["stage"], row["reason"]) == ("quarantined", "review", REJECTED_REASON)
    assert "was deidentify: burned_in_annotation" in row["detail"]
    assert counts == {"rejected": 1, "release_pending_fix": 0, "released": 0, "rejected_but_ingested": 1}
    out, counts = apply_review(ledger, [{"sha256": q_sha, "decision": "release", "decided_at": "2025-06-02"}])
    row = out.to_pylist()[2]
    assert row["reason"] == "burned_in_annotation" and "release approved by a curator 2025-06-02" in row["detail"]
    assert counts["release_pending_fix"] == 1
    assert out.num_rows == ledger.num_rows and out.schema.equals(SCHEMAS["ledger"])


def test_review_app_records_a_decision_the_next_run_honours(failed_stage):
    from fastapi.testclient import TestClient

    from quality.review_app import create_app
    from quality.review_auth import RequestGuard, TokenAuth, allowed_hosts_from_env

    ctx, _ = failed_stage
    st: Storage = ctx.storage
    token = "review-token-for-tests-0123456789"
    login = "Basic " + base64.b64encode(f"carol:{token}".encode()).decode()
    app = create_app(st, authenticate=TokenAuth(token), guard=RequestGuard(allowed_hosts_from_env()))
    # a logged-in curator on the served app's own origin (login, Host and Origin checks:
    # tests/quality/test_review_security.py)
    client = TestClient(
        app, base_url="http://127.0.0.1:8765", headers={"authorization": login, "origin": "http://127.0.0.1:8765"}
    )
    items = client.get("/api/quarantine").json()
    assert [i["decision"] for i in items] == ["pending"]
    oid = items[0]["id"]
    assert len(oid) == 12 and "source_uri" not in items[0] and "DOE" not in json.dumps(items)
    page = client.get("/review")
    assert page.status_code == 200 and f'id="reject-{oid}"' in page.text
    r = client.post(
        f"/review/{oid}", data={"decision": "reject", "note": "burned in text confirmed"}, follow_redirects=False
    )
    assert r.status_code == 303
    assert client.get("/api/quarantine").json()[0]["decision"] == "reject"
    stored = json.loads(st.read_text(REVIEW_FILE))["decisions"]
    assert len(stored) == 1 and stored[0]["sha256"].startswith(oid) and len(stored[0]["sha256"]) == 64
    # the decision names the logged-in curator and keeps the note typed in the page's form
    assert (stored[0]["curator"], stored[0]["note"]) == ("carol", "burned in text confirmed")
    page = client.get("/review").text
    assert f'id="note-{oid}"' in page and 'name="note"' in page and 'id="curator">carol<' in page
    assert (
        '<td data-label="curator" data-curator>carol</td><td data-label="note" data-note>burned in text confirmed</td>'
        in page
    )
    assert all(f'/dashboard/{p}"' in page for p, _ in PAGES) and '/data_docs/index.html"' in page
    # refused: unknown item, bad decision, digits in a note, another site's form
    assert client.post("/review/0123456789ab", data={"decision": "reject"}).status_code == 404
    assert client.post(f"/review/{oid}", data={"decision": "maybe"}).status_code == 400
    assert client.post(f"/review/{oid}", data={"decision": "reject", "note": "MRN 1234567"}).status_code == 400
    assert (
        client.post(
            f"/review/{oid}", data={"decision": "reject"}, headers={"origin": "http://evil.example"}
        ).status_code
        == 403
    )
    assert client.post("/api/decisions", json={"id": oid, "decision": "reject"}).json()["decision"] == "reject"
    # the dashboard and Data Docs are served from the reports zone; nothing else
    assert client.get("/dashboard/index.html").status_code == 200
    assert client.get("/data_docs/index.html").status_code == 200
    assert client.get("/dashboard/../ledger/key_fingerprint.json").status_code == 404
    assert client.get("/sources/x").status_code == 404
    # the next run: the ledger honours the decision
    nxt = BuildContext(cfg=ctx.cfg, storage=st, key=ctx.key, run_id="run-2")
    st.write_bytes(nxt.plan_path(), st.read_bytes(ctx.plan_path()))
    st.write_bytes(nxt.events_path("deidentify", 0), st.read_bytes(ctx.events_path("deidentify", 0)))
    result = finalise(nxt)
    assert result["review"]["rejected"] == 1 and result["balanced"]
    led = st.read_table(nxt.ledger_path).to_pylist()
    rejected = [r for r in led if r["sha256"].startswith(oid)]
    assert [(r["status"], r["reason"]) for r in rejected] == [("quarantined", REJECTED_REASON)]
    record = json.loads(st.read_text(f"quarantine/run-2/{rejected[0]['sha256']}.json"))
    assert record["review"]["decision"] == "reject" and record["reason"] == REJECTED_REASON


def test_build_ledger_then_review_keeps_balance():
    rows = _ledger_rows()
    plan = table_from_rows(
        [
            dict(
                source_uri=r["source_uri"],
                institution=r["institution"],
                sha256=r["sha256"],
                bytes=r["bytes"],
                kind=r["kind"],
                shard=0,
                status="pending",
                reason=None,
                detail=None,
                duplicate_of=None,
            )
            for r in rows[:3]
        ],
        PLAN_SCHEMA,
    )
    events = pa.table(
        {
            "source_uri": [r["source_uri"] for r in rows[:3]],
            "sha256": [r["sha256"] for r in rows[:3]],
            "stage": ["deidentify"] * 3,
            "status": ["ingested", "ingested", "quarantined"],
            "reason": [None, None, "burned_in_annotation_risk"],
            "detail": [None, None, None],
            "sop_key": [None] * 3,
            "study_key": [None] * 3,
        }
    )
    ledger = build_ledger("run-9", plan, events)
    out, counts = apply_review(
        ledger, [{"sha256": rows[2]["sha256"], "decision": "reject", "decided_at": dt.datetime(2025, 6, 2).isoformat()}]
    )
    assert [r["status"] for r in out.to_pylist()] == ["ingested", "ingested", "quarantined"]
    assert counts["rejected"] == 1


def test_airflow_plugin_registers_the_review_app(failed_stage, tmp_path, monkeypatch):
    import importlib.util

    from fastapi.testclient import TestClient

    ctx, _ = failed_stage
    cfg = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    cfg["storage"]["root"] = str(ctx.storage.root)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("MEDRECO_CONFIG", str(tmp_path / "cfg.yaml"))
    spec = importlib.util.spec_from_file_location(
        "medreco_review_plugin", PROJECT_ROOT / "plugins" / "medreco_review_plugin.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.MedrecoReviewPlugin
    from airflow.plugins_manager import AirflowPlugin

    assert issubclass(plugin, AirflowPlugin)
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/medreco" and plugin.external_views[0]["href"] == "medreco/review"
    client = TestClient(app["app"], base_url="http://localhost:8080")
    # behind Airflow's login: without an Airflow token every route is refused (the logged-in flow, with the
    # Airflow user as the curator, is tested in tests/quality/test_review_security.py)
    for path in ("/review", "/dashboard/quarantine.html"):
        r = client.get(path)
        assert r.status_code == 401 and "quarantine review" not in r.text
