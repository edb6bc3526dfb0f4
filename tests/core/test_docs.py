"""The documentation: the MkDocs site builds in strict mode (every page link and anchor resolves), the README stays
short and its links resolve, code paths named in the docs exist, and README and docs state what is true now
(no commit ids, no "before" figures, no machine-load notes).

MkDocs cannot follow a link from ``docs/`` to a code file outside it, so the docs name code by path in backticks
(``etl/pipeline/stages.py``); :func:`test_code_paths_named_in_the_docs_exist` checks those paths instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.config import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
README = PROJECT_ROOT / "README.md"
#: the pages the site must have (issue 39: one page per topic)
PAGES = (
    "index",
    "design",
    "command-line",
    "configuration",
    "deidentification",
    "pixels",
    "reports",
    "snapshots",
    "quality",
    "training",
    "operations",
)
#: top-level folders whose paths the docs name in backticks (checked to exist)
CODE_ROOTS = (
    "schemas",
    "etl",
    "entity_extraction",
    "quality",
    "training",
    "dags",
    "plugins",
    "medreco",
    "reader",
    "infra",
    "benchmarks",
    "tests",
    "config",
    "constraints",
)
#: history in a document that should state what is true now: a commit id in backticks (7-40 hex digits with at least
#: one letter and one digit), a bare 40-hex id, "before" (a before/after figure), machine-load notes
HISTORY = {
    "commit id": re.compile(r"`(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}`|\b[0-9a-f]{40}\b"),
    "'before'": re.compile(r"\bbefore\b", re.IGNORECASE),
    "machine-load note": re.compile(
        r"\bunder load\b|\bload average\b|\bmachine load\b|\bloaded machine\b", re.IGNORECASE
    ),
}
#: backticked names that look like repository paths but are not (an AWS Secrets Manager prefix in infra/README.md)
NOT_PATHS = {"medreco/airflow/connections"}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _md_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_topic_page_is_there_and_in_the_nav():
    nav = (PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES:
        assert (DOCS / f"{page}.md").is_file(), page
        assert f" {page}.md" in nav, page


def test_the_site_builds_strict_with_every_link_and_anchor_resolved(tmp_path):
    done = _mkdocs_build(PROJECT_ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    for page in PAGES:
        html = (tmp_path / "site" / f"{page}.html").read_text(encoding="utf-8")
        assert not re.findall(r"<(?:script|link|img)[^>]+(?:src|href)=\"(?:https?:)?//", html), page  # works offline


@pytest.mark.parametrize(
    ("link", "says"),
    [("pixels.md", "not found"), ("reports.md#no-such-heading", "anchor"), ("../etl/storage.py", "not found")],
)
def test_a_broken_link_fails_the_build(tmp_path, link, says):
    """The check above can fail: the same config on a copy of the docs with one bad link is refused."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    if link == "pixels.md":
        (docs / "pixels.md").unlink()
        link = "index.md"  # index.md links to the removed page already
    else:
        with (docs / "index.md").open("a", encoding="utf-8") as f:
            f.write(f"\nSee [this]({link}).\n")
    config = tmp_path / "mkdocs.yml"
    text = (PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config.write_text(text.replace("docs_dir: docs", f"docs_dir: {docs}"), encoding="utf-8")
    done = _mkdocs_build(config, tmp_path / "site")
    assert done.returncode != 0
    assert says in done.stderr.lower(), done.stderr[-2000:]


def test_readme_is_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 200, f"README.md has {n} lines: move detail into docs/"


def test_every_relative_link_of_the_readme_resolves():
    text = README.read_text(encoding="utf-8")
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]
    assert len(links) >= 10  # the README links into docs/
    missing = [t for t in links if not (PROJECT_ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, missing


def _code_paths(text: str) -> set[str]:
    """Repository paths named in backticks: ``etl/pipeline/stages.py``, ``quality/`` (``path::name`` -> path)."""
    out = set()
    for span in re.findall(r"`([^`\s]+)`", text):
        path = span.split("::", 1)[0].rstrip("/")
        if (
            path.split("/", 1)[0] in CODE_ROOTS
            and "/" in span
            and re.fullmatch(r"[\w./-]+", path)
            and ".." not in path
            and path not in NOT_PATHS
        ):
            out.add(path)
    return out


def test_code_paths_named_in_the_docs_exist():
    pages = [*_md_files(), *(PROJECT_ROOT / f for f in ("SECURITY.md", "benchmarks/README.md", "infra/README.md"))]
    named = {
        (md.relative_to(PROJECT_ROOT).as_posix(), p)
        for md in pages
        for p in _code_paths(md.read_text(encoding="utf-8"))
    }
    assert len(named) >= 50
    missing = sorted(f"{md}: {p}" for md, p in named if not (PROJECT_ROOT / p).exists())
    assert not missing, "\n".join(missing)


def test_the_path_check_can_fail():
    assert _code_paths("see `etl/pipeline/stages.py::run_stage`, `quality/` and `.demo/root`, `a/b`") == {
        "etl/pipeline/stages.py",
        "quality",
    }


def test_readme_and_docs_state_what_is_true_now():
    found = []
    for md in _md_files():
        for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            found += [
                f"{md.relative_to(PROJECT_ROOT)}:{n}: {what}: {line.strip()[:100]}"
                for what, rx in HISTORY.items()
                if rx.search(line)
            ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("at `0f30c66` it was", "commit id"),
        ("the figure before it", "'before'"),
        ("measured under load", "machine-load note"),
        ("c610e6c4" * 5, "commit id"),
    ],
)
def test_the_history_check_can_fail(line, what):
    assert HISTORY[what].search(line)


@pytest.mark.parametrize(
    "line",
    [
        "`0444` files",
        "`2.25.<keyed hash>`",
        "`deadbeef`",
        "`ct_spacing_mm`",
        "ahead of the run",
        "the load on the store",
    ],
)
def test_the_history_check_passes_ordinary_text(line):
    assert not any(rx.search(line) for rx in HISTORY.values())


def _config_fields(model, prefix: str = "") -> set[str]:
    """Dotted names of every field of a config model, nested models walked (a list of models: its item's fields)."""
    import typing

    from pydantic import BaseModel

    out = set()
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        dotted = f"{prefix}{name}"
        out.add(dotted)
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out |= _config_fields(arg, f"{dotted}.")
    return out


def test_every_config_field_is_documented():
    from schemas.config import PipelineConfig

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    fields = _config_fields(PipelineConfig)
    assert {"storage.root", "institutions.timezone", "deid.burned_in_text.ocr_off.modality"} <= fields
    # a field is named in backticks by its dotted path, or (inside its section's table) by its own name
    missing = sorted(f for f in fields if f"`{f}`" not in text and f"`{f.rsplit('.', 1)[-1]}`" not in text)
    assert not missing, missing
