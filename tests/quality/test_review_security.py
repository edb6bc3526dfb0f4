"""Issue 19, item 5: the curator app has a login, checks Host and Origin, refuses to be framed, and every decision
carries the curator and is appended to an audit trail. Served app (token from the environment) and Airflow plugin
(Airflow's auth manager)."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from etl import zones
from etl.storage import Storage
from quality.review import load_audit
from quality.review_app import create_app
from quality.review_auth import (
    RequestGuard,
    ReviewAuthError,
    TokenAuth,
    allowed_hosts_from_env,
    token_from_env,
)
from schemas import ledger as ledger_schema
from schemas.base import table_from_rows

TOKEN = "review-token-for-tests-0123456789"
SHA = "ab" * 32
ITEM = SHA[:12]
LOCAL = {"host": "127.0.0.1:8765"}
SAME_ORIGIN = {**LOCAL, "origin": "http://127.0.0.1:8765"}


def _basic(user: str, password: str = TOKEN) -> dict:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture()
def storage(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    row = {
        "run_id": "r1",
        "source_uri": "/src/x.dcm",
        "sha256": SHA,
        "bytes": 1,
        "institution": "inst",
        "kind": "dicom",
        "shard": 0,
        "status": "quarantined",
        "stage": "deidentify",
        "reason": "verification_failed",
        "detail": "1 identifying value(s) remain",
        "duplicate_of": None,
    }
    st.write_table(zones.ledger_file("r1"), table_from_rows([row], ledger_schema.SCHEMA))
    st.write_text(zones.DASHBOARD_INDEX, "<html><body>dashboard</body></html>")
    return st


@pytest.fixture()
def client(storage):
    app = create_app(storage, authenticate=TokenAuth(TOKEN), guard=RequestGuard(allowed_hosts_from_env()))
    return TestClient(app, base_url="http://127.0.0.1:8765", follow_redirects=False)


@pytest.mark.parametrize("path", ["/review", "/api/quarantine", "/dashboard/index.html", "/"])
def test_unauthenticated_requests_get_401(client, path):
    r = client.get(path, headers=LOCAL)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert "verification_failed" not in r.text and "dashboard</body>" not in r.text
    assert client.get(path, headers={**LOCAL, **_basic("alice", "wrong-token-0123456789")}).status_code == 401
    assert client.get(path, headers={**LOCAL, "authorization": "Bearer nope"}).status_code == 401


def test_authenticated_curator_reads_the_queue(client):
    r = client.get("/api/quarantine", headers={**LOCAL, **_basic("alice")})
    assert r.status_code == 200 and r.json()[0]["id"] == ITEM


def test_dns_rebinding_host_is_refused(client):
    r = client.get("/api/quarantine", headers={"host": "attacker.example:8765", **_basic("alice")})
    assert r.status_code == 403 and ITEM not in r.text


@pytest.mark.parametrize("origin", [None, "http://attacker.example", "null"])
def test_cross_site_or_origin_less_post_is_refused(client, storage, origin):
    headers = {**LOCAL, **_basic("alice"), **({"origin": origin} if origin else {})}
    r = client.post(f"/review/{ITEM}", data={"decision": "reject"}, headers=headers)
    assert r.status_code == 403
    assert not storage.is_file(zones.REVIEW_FILE) and load_audit(storage) == []


def test_decisions_carry_the_curator_and_are_audited(client, storage):
    r = client.post(
        f"/review/{ITEM}", data={"decision": "reject", "note": "bad header"}, headers={**SAME_ORIGIN, **_basic("alice")}
    )
    assert r.status_code == 303
    r = client.post(
        "/api/decisions",
        json={"id": ITEM, "decision": "release", "note": "fixed upstream"},
        headers={**LOCAL, "authorization": f"Bearer {TOKEN}"},
    )  # explicit credential: no Origin needed
    assert r.status_code == 200 and r.json()["curator"] == "token"
    audit = load_audit(storage)
    assert [(a["curator"], a["decision"], a["previous"]) for a in audit] == [
        ("alice", "reject", None),
        ("token", "release", "reject"),
    ]
    assert all(a["sha256"] == SHA and a["decided_at"] and a["reason"] == "verification_failed" for a in audit)
    files = storage.list_files(zones.LEDGER + "/review_audit")
    assert len(files) == 2  # one object per decision, none rewritten


def test_frame_and_content_security_headers(client):
    for path in ("/review", "/dashboard/index.html", "/nope"):
        r = client.get(path, headers={**LOCAL, **_basic("alice")})
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert "default-src 'none'" in r.headers["content-security-policy"]  # the dashboard and Data Docs too
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/review", headers=LOCAL).headers["x-frame-options"] == "DENY"  # on a 401 too


def test_served_app_needs_a_token_from_the_environment(monkeypatch):
    monkeypatch.delenv("MEDRECO_REVIEW_TOKEN", raising=False)
    with pytest.raises(ReviewAuthError) as err:
        token_from_env()
    assert err.value.reason == "missing_review_token"
    monkeypatch.setenv("MEDRECO_REVIEW_TOKEN", "short")
    with pytest.raises(ReviewAuthError):
        token_from_env()
    monkeypatch.setenv("MEDRECO_REVIEW_TOKEN", TOKEN)
    assert token_from_env() == TOKEN


def test_dashboard_serve_refuses_to_start_without_a_token(storage, tmp_path, monkeypatch):
    from conftest import config_for
    from typer.testing import CliRunner

    from medreco.cli.app import app

    monkeypatch.delenv("MEDRECO_REVIEW_TOKEN", raising=False)
    cfg = config_for(tmp_path / "root")
    result = CliRunner().invoke(app, ["dashboard", "--config", str(cfg), "--serve"])
    assert result.exit_code != 0 and "MEDRECO_REVIEW_TOKEN" in result.output


# ---- the Airflow plugin: Airflow's auth manager --------------------------------------------------------------


@pytest.fixture()
def plugin_client(storage, airflow_home, monkeypatch):
    import importlib

    monkeypatch.setattr("etl.pipeline.runtime.default_config_path", lambda: "unused")
    plugin = importlib.import_module("plugins.medreco_review_plugin")
    from quality.review_auth import airflow_curator

    app = create_app(
        storage, authenticate=airflow_curator, guard=RequestGuard(allowed_hosts_from_env(), frame_ancestors="'self'")
    )
    assert plugin.MedrecoReviewPlugin.fastapi_apps[0]["url_prefix"] == "/medreco"
    return TestClient(app, base_url="http://localhost:8080", follow_redirects=False)


def _airflow_token(username: str, role: str | None) -> str:
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    manager = create_auth_manager()
    manager.init()
    return manager.generate_jwt(SimpleAuthManagerUser(username=username, role=role))


def test_plugin_routes_need_an_airflow_login(plugin_client):
    host = {"host": "localhost:8080"}
    for path in ("/review", "/api/quarantine", "/dashboard/index.html"):
        r = plugin_client.get(path, headers=host)
        assert r.status_code == 401, path
    r = plugin_client.post(
        f"/review/{ITEM}", data={"decision": "reject"}, headers={**host, "origin": "http://localhost:8080"}
    )
    assert r.status_code == 401


def test_plugin_user_becomes_the_curator(plugin_client, storage):
    host = {"host": "localhost:8080"}
    token = _airflow_token("alice", "admin")
    r = plugin_client.get("/api/quarantine", headers={**host, "authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.headers["x-frame-options"] == "SAMEORIGIN"
    r = plugin_client.post(
        f"/review/{ITEM}",
        data={"decision": "reject"},
        headers={**host, "origin": "http://localhost:8080", "cookie": f"_token={token}"},
    )
    assert r.status_code == 303
    assert [a["curator"] for a in load_audit(storage)] == ["alice"]
    no_role = _airflow_token("mallory", None)
    assert (
        plugin_client.get("/api/quarantine", headers={**host, "authorization": f"Bearer {no_role}"}).status_code == 403
    )


def test_a_refused_note_shows_the_page_again_with_the_reason_and_the_note(client, storage):
    """A note with digits is refused (no date, id or phone can be typed into the de-identified zone), but on the
    review page, saying why, with the note back in its form; not as a raw JSON error (issue 40, point 8)."""
    r = client.post(
        f"/review/{ITEM}",
        data={"decision": "reject", "note": "see ticket 4411"},
        headers={**SAME_ORIGIN, **_basic("alice")},
    )
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in r.text and "no digits" in r.text and 'value="see ticket 4411"' in r.text
    assert not storage.is_file(zones.REVIEW_FILE) and load_audit(storage) == []


@pytest.mark.parametrize(
    ("user", "ok"),
    [
        ("Anne Smith", True),
        ("anne.smith@site.org", True),
        (" anne", False),
        ("anne  smith", False),
        ("anne ", False),
        ("DOE^JOHN", False),
    ],
)
def test_curator_names_may_hold_single_spaces(client, storage, user, ok):
    r = client.post(
        f"/review/{ITEM}", data={"decision": "reject", "note": "bad header"}, headers={**SAME_ORIGIN, **_basic(user)}
    )
    assert (r.status_code == 303) == ok, (user, r.status_code)
    if ok:
        assert load_audit(storage)[-1]["curator"] == user


def test_table_cells_wrap_between_words_only(client):
    page = client.get("/review", headers={**LOCAL, **_basic("alice")}).text
    assert "overflow-wrap:break-word" in page and "overflow-wrap:anywhere" not in page


def test_training_pages_are_served_but_not_the_records(client, storage):
    """The dashboard's Training page links ``../training/<version>.html``: served; the JSON records beside it
    (checkpoint folders, storage URIs) are not."""
    storage.write_text("reports/training/0.2.0.html", "<html><body>cells</body></html>")
    storage.write_text("reports/training/0.2.0.json", '{"jobs": {}}')
    auth = {**LOCAL, **_basic("alice")}
    assert client.get("/training/0.2.0.html", headers=auth).text.endswith("cells</body></html>")
    assert client.get("/training/0.2.0.json", headers=auth).status_code == 404
    assert client.get("/training/0.2.0/encoder-x.json", headers=auth).status_code == 404
    assert client.get("/training/0.2.0.html", headers=LOCAL).status_code == 401
