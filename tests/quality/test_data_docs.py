"""Data Docs: the project's own pages of GX's validation results, readable offline (no CDN, no beacon)."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest
from test_quality_checks import TODAY, build, clean_rows

from quality.data_docs import DataDocsInputError, load_validations, write_data_docs
from quality.gx_suites import run_suites
from schemas.ontology import load_ontology

#: a URL that leaves the site: scheme-relative or absolute with any scheme but data:
_EXTERNAL = re.compile(r"^\s*(?://|[a-z][a-z0-9+.-]*:)", re.IGNORECASE)


class _Resources(HTMLParser):
    """Every resource reference of a page: ``src``/``href``/``srcset``/``action``/``poster`` attributes, ``url()``
    and ``@import`` of inline CSS, and whether a script, iframe or object is present."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.active: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed"):
            self.active.append(tag)
        self._in_style = tag == "style"
        for k, v in attrs:
            if k in ("src", "href", "srcset", "action", "poster", "data") and v is not None:
                self.refs.append(v)
            if k == "style" and v:
                self._css(v)

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self._css(data)

    def _css(self, css: str) -> None:
        self.refs += re.findall(r"url\(\s*['\"]?([^'\")]+)", css) + re.findall(r"@import\s+['\"]([^'\"]+)", css)


def external_references(html: str) -> list[str]:
    """Resource references of ``html`` that point outside its site (``data:`` and ``#`` excepted)."""
    p = _Resources()
    p.feed(html)
    out = [r for r in p.refs if not r.startswith(("data:", "#")) and _EXTERNAL.match(r)]
    return out + [f"<{t}>" for t in p.active]


def test_the_checker_sees_what_gx_own_pages_load():
    gx_head = (
        '<link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css">'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>'
        '<img src="//great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?dataContextId=x">'
        '<style>@import "https://cdn.example/x.css"; a{background:url(https://cdn.example/i.png)}</style>'
    )
    assert len(external_references(gx_head)) == 6  # five URLs and the script
    ok = '<a href="../review">r</a><a href="validations/s/r/t.html">v</a><link rel="icon" href="data:,">'
    assert external_references(ok) == []


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    project, docs = tmp / "reports", tmp / "reports" / "data_docs"
    run_suites(
        build(clean_rows()),
        load_ontology(),
        today=TODAY,
        project_dir=project,
        data_docs_dir=docs,
        run_name="run-ok",
        only={"studies"},
    )
    rows = clean_rows()
    rows["studies"].append(dict(rows["studies"][0]))  # a duplicate key: a critical failure
    run_suites(
        build(rows),
        load_ontology(),
        today=TODAY,
        project_dir=project,
        data_docs_dir=docs,
        run_name="run-bad",
        only={"studies"},
    )
    return project, docs


def test_every_page_is_offline_and_its_links_resolve(site):
    project, docs = site
    pages = sorted(docs.rglob("*"))
    assert pages and all(p.suffix == ".html" for p in pages if p.is_file())  # no GX static/, fonts or images
    html_pages = [p for p in pages if p.is_file()]
    assert len(html_pages) == 1 + 2 * 2  # index + (studies, studies__phi_warning) x 2 runs
    for page in html_pages:
        text = page.read_text(encoding="utf-8")
        assert external_references(text) == [], page
        assert "dataContextId" not in text and "great-expectations-web-assets" not in text
        assert "<style>" in text  # styled inline
        p = _Resources()
        p.feed(text)
        for ref in p.refs:
            if ref.startswith("data:"):
                continue
            target = Path(unquote(urljoin(page.as_uri(), ref).split("#", 1)[0].removeprefix("file://")))
            if docs in target.parents or target == docs / "index.html":
                assert target.is_file(), (page, ref)
            else:  # the dashboard beside the site and the served review page
                assert target.parent.name == "dashboard" or target.name == "review", (page, ref)
        assert 'href="' in text and "review-nav" in text  # the quarantine review is linked from every page


def test_index_and_pages_show_the_results(site):
    project, docs = site
    index = (docs / "index.html").read_text()
    assert index.index("Run run-bad") < index.index("Run run-ok")  # newest first
    bad = index[index.index("Run run-bad") : index.index("Run run-ok")]
    assert '<span class="badge fail">FAIL</span>' in bad and ">studies</a>" in bad
    page = next((docs / "validations" / "studies" / "run-bad").glob("*.html")).read_text()
    assert "expect_column_values_to_be_unique:study_key" in page
    assert re.search(r'<span class="badge fail">FAIL</span></td><td>critical</td>', page)
    assert '"unexpected_count": 2' in html.unescape(page)
    # the same results as GX's store: one page per stored result, nothing else
    assert len(load_validations(project / "gx" / "uncommitted" / "validations")) == 4


def test_pages_are_a_function_of_the_results(site, tmp_path):
    project, docs = site
    again = tmp_path / "again"
    write_data_docs(project / "gx" / "uncommitted" / "validations", again)
    pages = sorted(docs.rglob("*.html"))
    assert len(pages) >= 5  # the index and the four result pages: an empty site cannot pass
    for p in pages:
        assert (again / p.relative_to(docs)).read_bytes() == p.read_bytes()


def test_a_broken_result_file_is_refused(tmp_path):
    bad = tmp_path / "v" / "suite" / "run" / "20250101T000000.000000Z"
    bad.mkdir(parents=True)
    (bad / "x.json").write_text(json.dumps({"results": "nope"}))
    with pytest.raises(DataDocsInputError) as err:
        write_data_docs(tmp_path / "v", tmp_path / "out")
    assert err.value.reason == "bad_validation_result" and not (tmp_path / "out").exists()
