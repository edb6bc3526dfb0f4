"""``medreco reports ...``: report commands for curators (a Typer sub-app, registered by :mod:`medreco.cli.app`).

``medreco reports annotate IN.jsonl OUT.jsonl``: per input line ``{"id", "input"}`` one output line
``{"id", "deidentified_text", "sections", "entities": [...]}`` (see :mod:`entity_extraction.annotate`).
Exit status 0 on success; non-zero with a one-line reason naming the input line on the first bad line,
unless ``--skip-bad`` lists bad lines in ``<OUT>.errors.jsonl`` (``{"line", "reason"}``, never the line's
content) and goes on. OUT is written atomically: it appears complete or not at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from schemas.ontology import FAMILIES

#: family of lines that name none (entity_extraction.annotate.DEFAULT_FAMILY; not imported here so that
#: `medreco --help` and the other commands start without loading spaCy)
DEFAULT_FAMILY = "2D-CXR"

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="annotate radiology reports")
#: inputs with at least this many lines get a progress bar (unless --quiet).
PROGRESS_MIN_LINES = 50


@app.callback()
def _reports() -> None:
    """Radiology report commands."""


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def errors_path(out: Path) -> Path:
    """``<OUT>.errors.jsonl``: where ``--skip-bad`` lists the bad input lines."""
    return out.with_name(out.name + ".errors.jsonl")


def _progress(total: int, quiet: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("annotating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=quiet or total < PROGRESS_MIN_LINES,
    )


@app.command()
def annotate(
    in_path: Path = typer.Argument(..., metavar="IN.jsonl", help='input: one JSON object {"id", "input"} per line'),
    out_path: Path = typer.Argument(..., metavar="OUT.jsonl", help="output: one annotated JSON object per report"),
    family: str = typer.Option(
        DEFAULT_FAMILY,
        "--family",
        help=f"family of lines without 'family'/'modality'/'body_part' ({', '.join(FAMILIES)})",
    ),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="list bad lines in <OUT>.errors.jsonl instead of failing"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar, no summary line"),
    language: str = typer.Option(
        "en",
        "--language",
        help="the site's report language (ISO 639-1): a default for texts too short or mixed "
        "to tell, not a fact; each report's language is identified",
    ),
) -> None:
    """De-identify, section and extract ontology entities from every report of a JSONL file.

    Text de-identification uses the pattern rules only (no DICOM header is linked to a line): every date
    becomes [DATE]. A line may name its "family" (2D-CXR, 3D-CT, 3D-Brain-MRI, 2D-Ultrasound) or its
    "modality" and "body_part"; otherwise --family applies. Each report's language is identified; English,
    German, French and Spanish reports are processed with their language's rules, a report in any other language
    is withheld: its line has no text, only "withheld" {"reason": "unsupported_language", "detail"}.
    """
    from entity_extraction.annotate import AnnotateInputError, parse_line
    from entity_extraction.languages.annotate import ExtractorPool, annotate_any

    if family not in FAMILIES:
        _fail(f"--family: unknown family {family!r} (one of {', '.join(FAMILIES)})", 2)
    if not in_path.is_file():
        _fail(f"{in_path}: no such file")
    if not out_path.parent.is_dir():
        _fail(f"{out_path.parent}: no such folder for OUT")
    if in_path.resolve() == out_path.resolve():
        _fail("OUT must not be IN")
    with in_path.open("rb") as fh:
        total = sum(1 for _ in fh)
    extractors = ExtractorPool()
    withheld: dict[str, int] = {}
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    bad: list[dict] = []
    seen: dict[object, int] = {}
    written = 0
    try:
        with in_path.open("rb") as src, tmp.open("w", encoding="utf-8") as dst, _progress(total, quiet) as bar:
            task = bar.add_task("annotate", total=total)
            for lineno, raw in enumerate(src, start=1):
                bar.advance(task)
                try:
                    try:
                        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                    except UnicodeDecodeError as exc:
                        raise AnnotateInputError(f"not UTF-8 (byte offset {exc.start})") from None
                    record = parse_line(line)
                    if record is None:
                        continue
                    if record["id"] in seen:
                        raise AnnotateInputError(f"duplicate 'id' (first on line {seen[record['id']]})")
                    result = annotate_any(record, extractors, family, language)
                except AnnotateInputError as err:
                    if not skip_bad:
                        _fail(f"{in_path} line {lineno}: {err.reason}")
                    bad.append({"line": lineno, "reason": err.reason})
                    continue
                seen[record["id"]] = lineno
                if "withheld" in result:
                    withheld[result["withheld"]["reason"]] = withheld.get(result["withheld"]["reason"], 0) + 1
                dst.write(json.dumps(result, ensure_ascii=False) + "\n")
                written += 1
        if skip_bad:
            err_tmp = tmp.with_name(tmp.name + ".errors")
            err_tmp.write_text("".join(json.dumps(b) + "\n" for b in bad), encoding="utf-8")
            os.replace(err_tmp, errors_path(out_path))
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    if not quiet:
        skipped = f", {len(bad)} bad line(s) listed in {errors_path(out_path)}" if skip_bad else ""
        held = sum(withheld.values())
        held_note = (
            f", {held} withheld (" + ", ".join(f"{k}={v}" for k, v in sorted(withheld.items())) + ")" if held else ""
        )
        typer.echo(f"annotated {written - held} report(s) -> {out_path}{held_note}{skipped}")
