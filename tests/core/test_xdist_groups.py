"""The work units ``make test`` hands its two pytest-xdist workers (tests/xdist_groups.py)."""

from __future__ import annotations

from xdist_groups import SHARED_BUILD_FILES, work_unit

from schemas.config import PROJECT_ROOT


def test_a_test_runs_with_its_file_and_shared_build_users_run_together():
    assert (
        work_unit("tests/deid/test_deid_fuzz.py::test_each_attack_gets_its_outcome") == "tests/deid/test_deid_fuzz.py"
    )
    assert work_unit("tests/core/test_keys.py::test_uid_form[a::b]") == "tests/core/test_keys.py"
    assert work_unit("tests/assemble/test_vqa.py::test_demo_build_has_every_question_type") == "demo_build"
    assert work_unit("tests/pipeline/test_build_e2e.py::test_real_shared_data_build") == "demo_build"


def test_every_listed_file_exists_and_uses_its_fixture():
    for fixture, files in SHARED_BUILD_FILES.items():
        for f in files:
            assert fixture in (PROJECT_ROOT / f).read_text(encoding="utf-8"), (fixture, f)
