"""Keyed pseudonyms: deterministic, domain separated, secret never shown, missing key refused."""

from __future__ import annotations

import pytest

from etl.keys import MAX_DATE_SHIFT_DAYS, MissingKeyError, PseudonymKey, load_key


def test_pseudonyms_are_deterministic_and_domain_separated(key):
    assert key.pseudonym("patient", "a|1") == key.pseudonym("patient", "a|1")
    assert key.pseudonym("patient", "a|1") != key.pseudonym("study", "a|1")
    other = PseudonymKey(b"another-secret-0123456789abcdef01")
    assert other.pseudonym("patient", "a|1") != key.pseudonym("patient", "a|1")


def test_uid_form(key):
    uid = key.uid("1.2.840.113619.2.55.3.604688119.969.1268071029.320")
    assert uid.startswith("2.25.") and len(uid) <= 64 and uid[5:].isdigit()
    assert key.uid("1.2.3") == key.uid("1.2.3 ") != key.uid("1.2.4")


def test_date_shift_range_and_never_zero(key):
    shifts = [key.date_shift_days(f"p{i}") for i in range(2000)]
    assert all(1 <= abs(s) <= MAX_DATE_SHIFT_DAYS for s in shifts)
    assert min(shifts) < 0 < max(shifts)


def test_secret_never_in_repr(key):
    assert "medreco-test-secret" not in repr(key)


def test_missing_or_short_key_is_refused(monkeypatch):
    monkeypatch.delenv("MEDRECO_PSEUDONYM_KEY", raising=False)
    with pytest.raises(MissingKeyError, match="refusing to run without one"):
        load_key(allow_airflow=False)
    monkeypatch.setenv("MEDRECO_PSEUDONYM_KEY", "short")
    with pytest.raises(MissingKeyError, match="too short"):
        load_key(allow_airflow=False)


def test_shards_spread(key):
    shards = [key.shard(key.pseudonym("patient", str(i)), 8) for i in range(800)]
    assert set(shards) == set(range(8))
    assert max(shards.count(s) for s in range(8)) < 140


def test_storage_root_refuses_a_second_key(tmp_path, key):
    import yaml

    from etl.pipeline.context import BuildContext, KeyMismatchError
    from schemas.config import parse_config

    cfg = parse_config(
        yaml.safe_load(f"""
storage: {{root: {tmp_path / "root"}}}
institutions: [{{id: us-a, country: US, language: en, timezone: America/New_York, source_uri: sources/us-a}}]
""")
    )
    BuildContext.from_config(cfg, "r1", key).check_key()
    BuildContext.from_config(cfg, "r2", key).check_key()  # same key: fine
    other = PseudonymKey(b"a-different-secret-0123456789abcdef")
    with pytest.raises(KeyMismatchError, match="was built with pseudonymisation key fingerprint"):
        BuildContext.from_config(cfg, "r3", other).check_key()
