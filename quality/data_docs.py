"""The Data Docs site: the project's own static pages of the Great Expectations validation results.

GX 1.x renders its Data Docs with Bootstrap, jQuery, bootstrap-table, Font Awesome and Vega loaded from eight
CDNs and a logo URL carrying the data context id (an outbound request from a hospital network), and the
``great_expectations`` package ships none of those scripts (its ``render/view/static`` folder holds only its
own CSS, fonts and images): offline, GX's pages are unstyled, the index is empty (bootstrap-table fills it from
a script) and the status icons are blank. These pages show the same validation results (the JSON GX's
validation results store writes under ``gx/uncommitted/validations/``) with the curator dashboard's inline CSS:
no script, no font, no image, no URL outside the site.

Layout (``reports/data_docs/``, rewritten whole on every run, so the site is a function of the stored results)::

    index.html                                            every run (newest first): one row per suite
    validations/<suite>/<run_name>/<run_time>.html        one validation result: every expectation

PHI safety: the results are requested in GX's ``SUMMARY`` format without unexpected values
(:data:`quality.gx_suites.RESULT_FORMAT`), so a page holds counts, expectation arguments (column names, sets,
bounds, the PHI scan's regular expressions) and never a value of the data.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from string import Template
from urllib.parse import quote

from quality.page_kit import (
    PAGES,
    RELEASE_PENDING,
    REVIEW_LINK,
    TEMPLATE_FILE,
    Html,
    badge,
    cards,
    esc,
    section,
    table,
)
from schemas.errors import ReasonCodedError

INDEX = "index.html"
#: result keys shown (counts and scalar observations only: never a value of the data)
RESULT_KEYS = ("element_count", "missing_count", "unexpected_count", "unexpected_percent", "observed_value")
_KWARGS_INLINE = 160


class DataDocsInputError(ReasonCodedError, ValueError):
    """A validation result file that cannot be rendered; ``reason`` is ``bad_validation_result``."""


@dataclass(frozen=True)
class Validation:
    """One stored validation result.

    Attributes
    ----------
    suite, run_name, run_time : str
        the store's folder names (``run_time`` as GX writes it: ``20261201T234736.980728Z``).
    data : dict
        the result JSON (``results``, ``statistics``, ``success``, ``meta``).
    """

    suite: str
    run_name: str
    run_time: str
    data: dict

    @property
    def page(self) -> str:
        """The page's path relative to the site root."""
        return f"validations/{self.suite}/{self.run_name}/{self.run_time}.html"


def load_validations(validations_dir: Path) -> list[Validation]:
    """Every validation result of a GX file context's results store.

    Parameters
    ----------
    validations_dir : pathlib.Path
        ``<project>/gx/uncommitted/validations`` (``<suite>/<run_name>/<run_time>/<batch id>.json``); a missing
        folder gives an empty list.

    Returns
    -------
    list of Validation
        sorted by run time (newest first), then suite name.

    Raises
    ------
    DataDocsInputError
        ``bad_validation_result`` for a file that is not a JSON object with ``results`` and ``statistics``.
    """
    out = []
    if not validations_dir.is_dir():
        return out
    for f in sorted(validations_dir.glob("*/*/*/*.json")):
        run_time, run_name, suite = f.parent.name, f.parent.parent.name, f.parent.parent.parent.name
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise DataDocsInputError(
                "bad_validation_result", f"{suite}/{run_name}/{run_time}: {type(err).__name__} reading the result"
            ) from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("results"), list)
            or not isinstance(data.get("statistics"), dict)
        ):
            raise DataDocsInputError(
                "bad_validation_result", f"{suite}/{run_name}/{run_time}: not a GX validation result"
            )
        out.append(Validation(suite, run_name, run_time, data))
    out.sort(key=lambda v: v.suite)
    out.sort(key=lambda v: v.run_time, reverse=True)
    return out


def _href(path: str) -> str:
    return quote(path, safe="/")


def _nav(depth: int, here: str) -> str:
    up = "../" * depth
    cls = ' class="here"' if here == INDEX else ""
    links = [f'<a href="{up}{INDEX}"{cls}>Data Docs</a>']
    links += [f'<a href="{up}../dashboard/{p}">{esc(t)}</a>' for p, t in PAGES]
    links.append(REVIEW_LINK.replace('href="quarantine.html', f'href="{up}../dashboard/quarantine.html'))
    return "".join(links)


def _stats(v: Validation) -> tuple[int, int, int]:
    s = v.data["statistics"]
    return (
        int(s.get("evaluated_expectations") or 0),
        int(s.get("successful_expectations") or 0),
        int(s.get("unsuccessful_expectations") or 0),
    )


def _severity(result: dict) -> str:
    cfg = result.get("expectation_config") or {}
    return str((cfg.get("meta") or {}).get("severity") or cfg.get("severity") or "")


def _index_body(validations: list[Validation]) -> str:
    if not validations:
        return section("Validation results", '<p class="empty">no validation results stored yet: run the build</p>')
    runs: dict[str, list[Validation]] = {}
    for v in validations:
        runs.setdefault(v.run_name, []).append(v)
    parts = [
        section(
            "Validation results",
            cards(
                [
                    ("runs", len(runs)),
                    ("validations", len(validations)),
                    (
                        "failed validations, latest run",
                        sum(not v.data.get("success") for v in next(iter(runs.values()))),
                    ),
                ]
            ),
            '<p class="muted">One Great Expectations Checkpoint per suite (a curated table or a view of '
            "one) per run; results in GX's SUMMARY format (counts only, never a value). The newest "
            "run first.</p>",
        )
    ]
    for run, vs in runs.items():
        rows = []
        for v in sorted(vs, key=lambda v: (bool(v.data.get("success")), v.suite)):
            n, ok, bad = _stats(v)
            sev = sorted({_severity(r) for r in v.data["results"] if not r.get("success")} - {""})
            rows.append(
                (
                    badge(bool(v.data.get("success")), "critical" if "critical" in sev else "warning"),
                    Html(f'<a href="{_href(v.page)}">{esc(v.suite)}</a>'),
                    ", ".join(sev),
                    n,
                    ok,
                    bad,
                    v.run_time,
                )
            )
        parts.append(
            section(
                f"Run {run}",
                table(
                    ["status", "suite", "failed severity", "expectations", "passed", "failed", "validated at"],
                    rows,
                    numeric=[3, 4, 5],
                ),
            )
        )
    return "".join(parts)


def _kwargs_html(kwargs: dict) -> Html:
    shown = {k: v for k, v in sorted(kwargs.items()) if k != "batch_id"}
    text = json.dumps(shown, sort_keys=True, ensure_ascii=False)
    if len(text) <= _KWARGS_INLINE:
        return Html(f'<span class="mono">{esc(text)}</span>')
    return Html(
        f'<details><summary class="mono">{esc(text[:_KWARGS_INLINE])} …</summary>'
        f'<span class="mono">{esc(text)}</span></details>'
    )


def _validation_body(v: Validation) -> str:
    n, ok, bad = _stats(v)
    meta = v.data.get("meta") or {}
    rows = []
    for r in sorted(v.data["results"], key=lambda r: (bool(r.get("success")), _severity(r) != "critical")):
        cfg = r.get("expectation_config") or {}
        kwargs = cfg.get("kwargs") or {}
        res = r.get("result") or {}
        obs = {k: res[k] for k in RESULT_KEYS if isinstance(res.get(k), (int, float)) and not isinstance(res[k], bool)}
        exc = r.get("exception_info") or {}
        if isinstance(exc, dict) and exc.get("raised_exception"):
            obs["exception"] = str(exc.get("exception_message") or "")[:200]
        rows.append(
            (
                badge(bool(r.get("success")), _severity(r) or "critical"),
                _severity(r),
                str((cfg.get("meta") or {}).get("check") or ""),
                str(cfg.get("type") or ""),
                str(kwargs.get("column") or kwargs.get("column_list") or ""),
                _kwargs_html(kwargs),
                Html(f'<span class="mono">{esc(json.dumps(obs, sort_keys=True))}</span>'),
            )
        )
    facts = [
        ("suite", v.suite),
        ("run", v.run_name),
        ("validated at", meta.get("validation_time") or v.run_time),
        ("Great Expectations", meta.get("great_expectations_version", "")),
        ("checkpoint id", meta.get("checkpoint_id", "")),
    ]
    return "".join(
        [
            section(
                f"Suite {v.suite}",
                table(["key", "value"], facts),
                cards(
                    [
                        ("expectations", n),
                        ("passed", ok),
                        ("failed", bad),
                        ("result", "success" if v.data.get("success") else "failure"),
                    ]
                ),
            ),
            section(
                "Expectations",
                table(
                    ["status", "severity", "check", "expectation", "column", "arguments", "observed"],
                    rows,
                    wrap=[2, 3, 5, 6],
                ),
            ),
        ]
    )


def write_data_docs(validations_dir: Path, out_dir: Path) -> Path:
    """Write the Data Docs site for every stored validation result (the folder is replaced whole).

    Parameters
    ----------
    validations_dir : pathlib.Path
        the GX results store (:func:`load_validations`).
    out_dir : pathlib.Path
        the site folder (``reports/data_docs``); everything in it is deleted first (GX's own site included).

    Returns
    -------
    pathlib.Path
        ``out_dir / "index.html"``.

    Raises
    ------
    DataDocsInputError
        ``bad_validation_result`` (nothing is deleted or written then).
    """
    validations = load_validations(Path(validations_dir))
    template = Template(TEMPLATE_FILE.read_text(encoding="utf-8"))
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    latest = validations[0].run_name if validations else "none"
    failed = sum(not v.data.get("success") for v in validations if v.run_name == latest)
    subtitle = f"latest run: {failed} failed validation(s)" if validations else "no validation results"

    def write(rel: str, title: str, body: str, run_id: str) -> None:
        depth = rel.count("/")
        doc = template.substitute(
            release=RELEASE_PENDING,
            site="MedReCo-DB Data Docs",
            title=esc(title),
            run_id=esc(run_id),
            subtitle=esc(subtitle),
            nav=_nav(depth, rel if rel == INDEX else ""),
            body=body,
        )
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(doc, encoding="utf-8")

    write(INDEX, "Validation results", _index_body(validations), latest)
    for v in validations:
        write(v.page, f"{v.suite} · {v.run_time}", _validation_body(v), v.run_name)
    return out_dir / INDEX
