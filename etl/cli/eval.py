"""``medreco eval``: evaluation commands (a Typer sub-app; ``etl.cli.app`` registers it as ``eval``).

``medreco eval entities --openi DIR [--labels mesh|negbio|both]`` (default both; ``both`` scores MeSH alone when DIR has
no NegBio file) scores entity extraction on a directory in
the Open-i layout (see :mod:`entity_extraction.evaluate`) and prints one table per label set; the last line
of each table gives the micro and macro figures. Exit status 0 on success; 1 with a one-line reason on
stderr when DIR or its label files cannot be used.

``medreco eval deid --gold FILE.jsonl`` scores report text de-identification on a gold file in the layout of
``../shared/data/text-deid/PROVENANCE.md`` (see :mod:`entity_extraction.deid_eval`): recall per PHI type,
strict recall overall and non-PHI tokens lost. Exit status 0; 1 with a one-line reason when FILE cannot be used.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="evaluate entity extraction against labelled report sets")


class LabelChoice(StrEnum):
    """Which gold to score against."""

    mesh = "mesh"
    negbio = "negbio"
    both = "both"


@app.command("entities")
def entities(
    openi: Path = typer.Option(..., "--openi", help="directory in the Open-i layout (indiana_reports.csv, "
                                                    "optional negbio_openi_gold14_labels.csv)"),
    labels: LabelChoice = typer.Option(LabelChoice.both, "--labels", help="gold label set(s) to score"),
) -> None:
    """Per-entity precision/recall/F1 of present findings against the Open-i labels in DIR."""
    from entity_extraction.evaluate import NEGBIO_FILE, EvaluationDataError, evaluate, render_table

    sets: tuple[str, ...] = ("mesh", "negbio") if labels is LabelChoice.both else (labels.value,)
    if labels is LabelChoice.both and openi.is_dir() and not (openi / NEGBIO_FILE).is_file():
        sets = ("mesh",)  # NegBio labels are optional in the layout; asked for explicitly they are required
    try:
        results = evaluate(openi, sets)
    except EvaluationDataError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo("\n\n".join(render_table(results[s]) for s in sets))


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
