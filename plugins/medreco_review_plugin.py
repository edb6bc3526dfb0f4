"""Airflow 3 plugin: the MedReCo-DB curator app (dashboard, Data Docs, quarantine review) inside the Airflow UI.

Mounted by the Airflow API server at ``/medreco`` (``fastapi_apps``) and linked from the UI's Browse menu
(``external_views``, shown in an iframe at ``/plugin/medreco-review``). The storage root is that of the
pipeline config (``$MEDRECO_CONFIG`` or ``config/demo.yaml``), opened per request, so loading the plugin
does no work and needs no key. The app is :func:`quality.review_app.create_app`; the API server needs the
project on its ``PYTHONPATH`` and this folder as ``[core] plugins_folder``. FastAPI plugin routes are not
behind Airflow's login: expose the API server to curators only (as the restricted zone requires anyway).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/medreco"


def _storage():
    from etl.build.runtime import default_config_path
    from etl.storage import Storage
    from schemas.config import load_config

    cfg = load_config(default_config_path())
    return Storage.open(cfg.storage.root, endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region,
                        base_dir=cfg.base_dir)


def _app():
    from quality.review_app import create_app

    return create_app(_storage)


class MedrecoReviewPlugin(AirflowPlugin):
    """Registers the curator app (``fastapi_apps``) and a Browse-menu entry for its review page."""

    name = "medreco_review"
    fastapi_apps = [{"app": _app(), "url_prefix": URL_PREFIX, "name": "MedReCo-DB curator dashboard"}]
    external_views = [{"name": "MedReCo quarantine review", "href": URL_PREFIX.lstrip("/") + "/review",
                       "destination": "nav", "category": "browse", "url_route": "medreco-review"}]
