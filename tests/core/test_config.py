"""Configuration validation: a bad config fails before any work, naming the field and the problem."""

from __future__ import annotations

import pytest
import yaml

from schemas.config import PROJECT_ROOT, ConfigError, load_config, parse_config

GOOD = {
    "storage": {"root": "/tmp/x"},
    "institutions": [
        {"id": "us-a", "country": "US", "language": "en", "timezone": "America/New_York", "source_uri": "sources/us-a"},
    ],
}


def _with(path: list, value):
    import copy

    data = copy.deepcopy(GOOD)
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return data


def test_demo_and_real_configs_validate():
    demo = load_config(PROJECT_ROOT / "config" / "demo.yaml")
    assert len(demo.institutions) == 8
    assert len({i.country for i in demo.institutions}) == 6
    assert sorted(i.language for i in demo.institutions) == ["de", "en", "en", "en", "en", "en", "en", "es"]
    real = load_config(PROJECT_ROOT / "config" / "shared-real.yaml")
    assert {i.id for i in real.institutions} == {"shared-dicom", "shared-dicom-edge", "openi"}


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (["institutions", 0, "timezone"], "Mars/Olympus", "institutions.0.timezone: unknown IANA time zone"),
        (["institutions", 0, "country"], "USA", "institutions.0.country: must be an ISO 3166-1 alpha-2 code"),
        (["institutions", 0, "language"], "English", "institutions.0.language: must be an ISO 639-1 code"),
        (["institutions", 0, "report_format"], "pdf", "institutions.0.report_format"),
        (["shard_count"], 0, "shard_count: Input should be greater than or equal to 1"),
        (["institutions", 0, "shardz"], 3, "institutions.0.shardz: unknown field"),
    ],
)
def test_bad_field_is_named(path, value, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(_with(path, value))
    assert expected in str(err.value)


def test_duplicate_institution_and_bad_split():
    data = _with(["institutions"], GOOD["institutions"] * 2)
    with pytest.raises(ConfigError, match="institution ids must be unique, repeated: us-a"):
        parse_config(data)
    with pytest.raises(ConfigError, match=r"splits: .*must be 1.0"):
        parse_config({**GOOD, "splits": {"train": 0.5, "val": 0.1, "test": 0.1}})
    with pytest.raises(ConfigError, match="external_test_institutions names unknown institutions: nowhere"):
        parse_config({**GOOD, "splits": {"external_test_institutions": ["nowhere"]}})


def test_secret_in_config_is_refused():
    with pytest.raises(ConfigError, match="secret must not be in the config file"):
        parse_config({**GOOD, "pseudonym_key": "abc"})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(GOOD))
    cfg = load_config(ok)
    assert cfg.base_dir == str(tmp_path.resolve())
    assert cfg.config_hash() == load_config(ok).config_hash()


def test_cli_run_fails_before_work_on_bad_config(tmp_path):
    from typer.testing import CliRunner

    from medreco.cli.app import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_with(["institutions", 0, "timezone"], "Nowhere/City")))
    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 1
    assert "institutions.0.timezone: unknown IANA time zone 'Nowhere/City'" in result.output
    assert not (tmp_path / "x").exists()


def test_cli_run_refuses_a_missing_key(monkeypatch, tmp_path):
    from helpers import demo_config_with_empty_sources
    from typer.testing import CliRunner

    from medreco.cli.app import app

    monkeypatch.delenv("MEDRECO_PSEUDONYM_KEY", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_MEDRECO_PSEUDONYM", raising=False)
    result = CliRunner().invoke(app, ["run", "--config", str(demo_config_with_empty_sources(tmp_path))])
    assert result.exit_code == 1
    assert "no pseudonymisation secret" in result.output and "refusing to run" in result.output


def test_config_hash_ignores_where_zones_are_stored_but_not_what_is_built():
    local = parse_config(GOOD)
    s3 = parse_config({**GOOD, "storage": {"root": "s3://bucket/medreco", "s3_endpoint_url": "http://127.0.0.1:9000"}})
    assert local.config_hash() == s3.config_hash()
    assert parse_config({**GOOD, "shard_count": 3}).config_hash() != local.config_hash()


@pytest.mark.parametrize(
    ("path", "wrong", "meant"),
    [
        ((), "shard_cout", "shard_count"),
        (("normalisation",), "image_sise", "image_size"),
        (("institutions", 0), "reprot_format", "report_format"),
    ],
)
def test_a_near_miss_config_key_gets_a_did_you_mean(path, wrong, meant):
    import yaml

    from schemas.config import PROJECT_ROOT, ConfigError, parse_config

    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    node = data
    for part in path:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[wrong] = 1
    with pytest.raises(ConfigError, match=rf"{wrong}: unknown field \(did you mean `{meant}`\?\)"):
        parse_config(data)
