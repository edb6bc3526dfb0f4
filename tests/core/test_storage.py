"""Storage on a local folder and on S3 (moto's server on 127.0.0.1)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from etl.storage import Storage, StorageError, open_filesystem


def _exercise(st: Storage) -> None:
    st.write_bytes("ledger/a/b.bin", b"\x00\x01")
    st.write_text("reports/x.txt", "héllo")
    assert st.read_bytes("ledger/a/b.bin") == b"\x00\x01"
    assert st.read_text("reports/x.txt") == "héllo"
    assert st.is_file("ledger/a/b.bin") and not st.is_file("ledger/a")
    assert st.list_files() == ["ledger/a/b.bin", "reports/x.txt"]
    t = pa.table({"k": ["b", "a"], "v": [2, 1]})
    st.write_table("curated/t/shard=00000/part-0.parquet", t)
    st.write_table("curated/t/shard=00001/part-0.parquet", t.slice(0, 1))
    back = st.read_table("curated/t")
    assert back.num_rows == 3 and sorted(back["k"].to_pylist()) == ["a", "b", "b"]
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    assert st.read_table("curated/missing", schema=schema).num_rows == 0
    only_v = st.read_table("curated/t", schema=schema, columns=["v"])
    assert only_v.schema.names == ["v"] and sorted(only_v["v"].to_pylist()) == [1, 2, 2]
    assert st.read_table("curated/missing", schema=schema, columns=["k"]).schema.names == ["k"]
    assert st.read_table("curated/t/shard=00001/part-0.parquet", columns=["k"]).to_pydict() == {"k": ["b"]}
    with pytest.raises(StorageError, match="no Parquet files"):
        st.read_table("curated/missing")
    with pytest.raises(StorageError, match="cannot read"):
        st.read_bytes("nope.bin")
    st.delete("curated/t")
    assert st.list_files("curated") == []


def test_local(tmp_path):
    st = Storage.open(str(tmp_path / "root"))
    _exercise(st)
    assert not list((tmp_path / "root").rglob(".tmp-*")), "atomic writes leave no temporary files"


def test_relative_root_resolves_from_base_dir(tmp_path):
    st = Storage.open("data/root", base_dir=tmp_path)
    assert st.root == str((tmp_path / "data" / "root").resolve())


def test_unsupported_scheme():
    with pytest.raises(StorageError, match="unsupported storage URI scheme 'gs'"):
        open_filesystem("gs://bucket/x")
    with pytest.raises(StorageError, match="without a bucket"):
        open_filesystem("s3:///x")


@pytest.fixture(scope="module")
def moto_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_s3_against_moto(moto_server, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket="medreco")
    st = Storage.open("s3://medreco/prefix/root", endpoint_url=moto_server)
    assert not st.is_local
    assert st.full_uri("curated/x") == "s3://medreco/prefix/root/curated/x"
    _exercise(st)
    # the objects really are in the bucket, under the prefix (checked with boto3, not our code)
    st.write_text("reports/y.txt", "y")
    keys = [
        o["Key"] for o in boto3.client("s3", endpoint_url=moto_server).list_objects_v2(Bucket="medreco")["Contents"]
    ]
    assert "prefix/root/reports/y.txt" in keys
