"""``medreco eval``: evaluation commands (a Typer sub-app; ``medreco.cli.app`` registers it as ``eval``).

``medreco eval entities --openi DIR [--labels mesh|negbio|both]`` (default both; ``both`` scores MeSH alone when DIR has
no NegBio file) scores entity extraction on a directory in
the Open-i layout (see :mod:`entity_extraction.evaluate`) and prints one table per label set; the last line
of each table gives the micro and macro figures. ``--negex FILE`` (the NegEx/ConText annotated test-kit layout)
prints negation precision/recall/F1; ``--ct-extractions DIR`` (the layout of ``../shared/data/ct-report-extractions``)
prints the gold present/absent findings found and the assertion accuracy (see
:mod:`entity_extraction.evaluate_outside`). The options combine; at least one is required. Exit status 0 on
success; 1 with a one-line reason on stderr when a set or its label files cannot be used.

``medreco eval deid --gold FILE.jsonl`` scores report text de-identification on a gold file in the layout of
``../shared/data/text-deid/PROVENANCE.md`` (see :mod:`entity_extraction.deid_eval`): recall per PHI type,
strict recall overall and non-PHI tokens lost. Exit status 0; 1 with a one-line reason when FILE cannot be used.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="evaluate entity extraction against labelled report sets")


class LabelChoice(StrEnum):
    """Which gold to score against."""

    mesh = "mesh"
    negbio = "negbio"
    both = "both"


@app.command("entities")
def entities(
    openi: Path | None = typer.Option(None, "--openi", help="directory in the Open-i layout (indiana_reports.csv, "
                                                            "optional negbio_openi_gold14_labels.csv)"),
    labels: LabelChoice = typer.Option(LabelChoice.both, "--labels", help="gold label set(s) to score (--openi)"),
    negex: Path | None = typer.Option(None, "--negex", help="file in the NegEx/ConText annotated test-kit layout"),
    ct_extractions: Path | None = typer.Option(None, "--ct-extractions",
                                               help="directory in the ct-report-extractions layout"),
) -> None:
    """Score entity extraction on labelled report sets: Open-i labels, the NegEx kit, CT extractions."""
    from entity_extraction.evaluate import NEGBIO_FILE, EvaluationDataError, evaluate, render_table
    from entity_extraction.evaluate_outside import (
        evaluate_ct,
        evaluate_negex,
        load_ct_extractions,
        load_negex_kit,
        render_ct,
        render_negex,
    )
    from entity_extraction.extract import EntityExtractor

    if openi is None and negex is None and ct_extractions is None:
        typer.echo("error: give at least one of --openi, --negex, --ct-extractions", err=True)
        raise typer.Exit(1)
    blocks: list[str] = []
    try:
        extractor = EntityExtractor()
        if openi is not None:
            sets: tuple[str, ...] = ("mesh", "negbio") if labels is LabelChoice.both else (labels.value,)
            if labels is LabelChoice.both and openi.is_dir() and not (openi / NEGBIO_FILE).is_file():
                sets = ("mesh",)  # NegBio labels are optional in the layout; asked for explicitly they are required
            results = evaluate(openi, sets, extractor=extractor)
            blocks.extend(render_table(results[s]) for s in sets)
        if negex is not None:
            blocks.append(render_negex(evaluate_negex(load_negex_kit(negex), extractor), f"NegEx kit {negex.name}"))
        if ct_extractions is not None:
            blocks.append(render_ct(evaluate_ct(load_ct_extractions(ct_extractions), extractor)))
    except EvaluationDataError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo("\n\n".join(blocks))


@app.command("deid")
def deid(gold: Path = typer.Option(..., "--gold", help="JSONL gold file: {id, text, phi: [{start, end, type}]}")) -> None:
    """Strict recall per PHI type and non-PHI tokens lost of report text de-identification on FILE."""
    from entity_extraction.deid_eval import GoldFormatError, evaluate_deid, load_gold, render_deid_table

    try:
        notes = load_gold(gold)
    except (OSError, GoldFormatError) as err:
        typer.echo(f"error: {gold}: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(render_deid_table(evaluate_deid(notes)))


@app.callback()
def _main() -> None:
    """Evaluation commands."""
