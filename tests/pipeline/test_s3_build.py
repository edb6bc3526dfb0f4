"""Object storage end to end: the whole build DAG (Airflow ``dag.test()``) with the storage root on
``s3://`` against moto's S3 server on 127.0.0.1, compared with the same build on a local folder.

Both builds run in this module with the same code, corpus, config and key, so nothing here hard-codes a
hash: the S3 snapshot must hold byte-identical tables (sha256 and rows per table) and the same curated
partitions. Its content hash differs from the local one because the content hash covers the config hash,
and the config names the storage root.
"""

from __future__ import annotations

import hashlib
import logging

import pytest
import yaml

from schemas.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # two full builds, about 60 s on 2 cores
BUCKET = "medreco-s3-e2e"
PREFIX = "deploy/root"


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def aws_env():
    mp = pytest.MonkeyPatch()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        mp.setenv(k, v)
    mp.delenv("AWS_ENDPOINT_URL", raising=False)
    mp.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    yield
    mp.undo()


def _etags(s3, prefix: str) -> dict[str, str]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory, airflow_home, moto_endpoint, aws_env):
    """The demo corpus built twice: on a local folder and on ``s3://BUCKET/PREFIX`` (sources uploaded)."""
    import boto3

    from etl.demo.corpus import generate_corpus
    from medreco.cli.embedded import run_build

    base = tmp_path_factory.mktemp("s3build")
    local_root = base / "root"
    generate_corpus(local_root, seed=11, n_patients=8)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    uploaded = 0
    for f in sorted((local_root / "sources").rglob("*")):
        if f.is_file():
            s3.upload_file(str(f), BUCKET, f"{PREFIX}/{f.relative_to(local_root).as_posix()}")
            uploaded += 1
    sources_before = _etags(s3, f"{PREFIX}/sources/")
    assert len(sources_before) == uploaded > 0

    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["storage"] = {"root": "root"}  # relative to the config file
    data["shard_count"] = 4
    local_cfg = base / "local.yaml"
    local_cfg.write_text(yaml.safe_dump(data))
    data["storage"] = {"root": f"s3://{BUCKET}/{PREFIX}", "s3_endpoint_url": moto_endpoint}
    s3_cfg = base / "s3.yaml"
    s3_cfg.write_text(yaml.safe_dump(data))

    local = run_build(local_cfg)
    remote = run_build(s3_cfg)
    return {
        "local": local,
        "s3": remote,
        "local_root": local_root,
        "local_cfg": local_cfg,
        "s3_cfg": s3_cfg,
        "client": s3,
        "sources_before": sources_before,
        "endpoint": moto_endpoint,
    }


def _s3_storage(builds):
    from etl.storage import Storage

    return Storage.open(f"s3://{BUCKET}/{PREFIX}", endpoint_url=builds["endpoint"])


def test_s3_build_succeeds_on_s3(builds):
    s3 = builds["s3"]
    assert s3["uri"] == f"s3://{BUCKET}/{PREFIX}/snapshots/{s3['version']}"
    assert s3["dashboard"] == f"s3://{BUCKET}/{PREFIX}/reports/dashboard/index.html"
    assert s3["ledger"]["balanced"] is True and s3["ledger"]["files_seen"] == len(builds["sources_before"])
    # the objects are really in the bucket, under the prefix (checked with boto3, not our storage code)
    keys = set(_etags(builds["client"], ""))
    base = f"{PREFIX}/snapshots/{s3['version']}"
    assert {f"{base}/manifest.json", f"{base}/manifest.sha256", f"{base}/DATASET_CARD.md"} <= keys
    assert f"{PREFIX}/reports/dashboard/index.html" in keys
    assert f"{PREFIX}/ledger/key_fingerprint.json" in keys
    assert all(k.startswith(f"{PREFIX}/") for k in keys), "nothing is written outside the storage prefix"
    assert not [k for k in keys if "/.tmp-" in k], "no temporary objects are left behind"


def test_s3_snapshot_verifies(builds):
    from etl.snapshots import verify

    assert verify(_s3_storage(builds), builds["s3"]["version"]) == []


def test_same_tables_as_local(builds):
    """Rows and bytes of every snapshot table are identical on S3 and on local disk."""
    from etl.snapshots import read_manifest
    from etl.storage import Storage

    local_m = read_manifest(Storage.open(str(builds["local_root"])), builds["local"]["version"])
    s3_m = read_manifest(_s3_storage(builds), builds["s3"]["version"])
    assert builds["local"]["tables"] == builds["s3"]["tables"]
    assert sum(builds["local"]["tables"].values()) > 0
    assert {t: (v["sha256"], v["rows"]) for t, v in s3_m["tables"].items()} == {
        t: (v["sha256"], v["rows"]) for t, v in local_m["tables"].items()
    }
    assert s3_m["ontology_version"] == local_m["ontology_version"]
    assert s3_m["key_fingerprint"] == local_m["key_fingerprint"]
    assert builds["local"]["ledger"] == builds["s3"]["ledger"]
    # the content hash also covers the config hash, which names the storage root (s3:// vs a folder):
    # that, not the content, is why the two content hashes differ
    from schemas.config import load_config

    assert local_m["config_hash"] == load_config(builds["local_cfg"]).config_hash()
    assert s3_m["config_hash"] == load_config(builds["s3_cfg"]).config_hash()


def test_curated_partitions_identical(builds):
    """Every curated file (Parquet partitions and de-identified DICOM) has the same bytes on S3."""
    from etl.storage import Storage

    local = Storage.open(str(builds["local_root"]))
    remote = _s3_storage(builds)
    local_files, s3_files = local.list_files("curated"), remote.list_files("curated")
    assert local_files and local_files == s3_files
    for rel in local_files:
        assert hashlib.sha256(remote.read_bytes(rel)).digest() == hashlib.sha256(local.read_bytes(rel)).digest(), rel


def test_source_zone_untouched(builds):
    """The raw source zone is read-only to the pipeline: no object under sources/ was added or rewritten."""
    assert _etags(builds["client"], f"{PREFIX}/sources/") == builds["sources_before"]
