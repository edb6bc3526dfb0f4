"""Work units for ``pytest -n 2 --dist loadgroup`` (``make test``): one per test file, except the files whose tests
share a session-scoped build, which form one unit together, so that no fixture that builds is built twice.

pytest-xdist 3.8's own ``loadgroup`` does not group under pytest 9.2: it tags node ids by assigning
``item._nodeid``, which pytest 9 no longer reads (node ids come from ``Node._id``), so every test became its own
unit and a module fixture (the fuzz corpus, 87 s) was built in both workers. This scheduler groups by node id
prefix in the controller instead, which needs no such tag.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: session build fixture -> the test files that use it (checked at collection: tests/conftest.py)
SHARED_BUILD_FILES = {
    "demo_build": frozenset(
        {
            "tests/assemble/test_vqa.py",
            "tests/pipeline/test_build_e2e.py",
            "tests/pipeline/test_demo_faces.py",
            "tests/quality/test_dashboard_browser.py",
            "tests/snapshots/test_reader_venv.py",
        }
    ),
}
_UNIT_OF_FILE = {f: name for name, files in SHARED_BUILD_FILES.items() for f in files}


def work_unit(nodeid: str) -> str:
    """The work unit of a test id: its shared build's name when its file is listed in
    :data:`SHARED_BUILD_FILES`, else its file path (the part before the first ``::``)."""
    path = nodeid.split("::", 1)[0]
    return _UNIT_OF_FILE.get(path, path)


class SharedBuildScheduling(LoadScopeScheduling):
    """pytest-xdist's ``loadscope`` scheduling with :func:`work_unit` as the scope: a unit runs whole in one
    worker, units are handed out in collection order as workers free up."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
