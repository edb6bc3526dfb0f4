"""Airflow 3 plugin: the MedReCo-DB curator app (dashboard, Data Docs, quarantine review) inside the Airflow UI.

Mounted by the Airflow API server at ``/medreco`` (``fastapi_apps``) and linked from the UI's Browse menu
(``external_views``, shown in an iframe at ``/plugin/medreco-review``). The storage root is that of the
pipeline config (``$MEDRECO_CONFIG`` or ``config/demo.yaml``), opened per request, so loading the plugin
does no work and needs no key. The app is :func:`quality.review_app.create_app`; the API server needs the
project on its ``PYTHONPATH`` and this folder as ``[core] plugins_folder``.

Every route is behind Airflow's own login and auth manager (:func:`quality.review_auth.airflow_curator`: the API
server's JWT by bearer header or session cookie; permission on the custom view ``MedReCo curator review``, GET to
read, POST to decide): 401/403 as Airflow's API answers. The Airflow user's name is the decision's curator. Host
names: the ``[api] base_url`` host, the local names and ``$MEDRECO_REVIEW_ALLOWED_HOSTS``; pages may be framed
by the Airflow UI only (same origin).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/medreco"


def _storage():
    from etl.storage import Storage
    from schemas.config import default_config_path, load_config

    cfg = load_config(default_config_path())
    return Storage.open(
        cfg.storage.root, endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region, base_dir=cfg.base_dir
    )


def _base_url_host() -> str:
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    return urlsplit(conf.get("api", "base_url", fallback="") or "").hostname or ""


def _app():
    from quality.review_app import create_app
    from quality.review_auth import RequestGuard, airflow_curator, allowed_hosts_from_env

    guard = RequestGuard(allowed_hosts_from_env([_base_url_host()]), frame_ancestors="'self'")
    return create_app(_storage, authenticate=airflow_curator, guard=guard)


class MedrecoReviewPlugin(AirflowPlugin):
    """Registers the curator app (``fastapi_apps``) and a Browse-menu entry for its review page."""

    name = "medreco_review"
    fastapi_apps = [{"app": _app(), "url_prefix": URL_PREFIX, "name": "MedReCo-DB curator dashboard"}]
    external_views = [
        {
            "name": "MedReCo quarantine review",
            "href": URL_PREFIX.lstrip("/") + "/review",
            "destination": "nav",
            "category": "browse",
            "url_route": "medreco-review",
        }
    ]
