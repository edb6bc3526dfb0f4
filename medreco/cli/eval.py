"""``medreco eval``: evaluation commands (a Typer sub-app; ``medreco.cli.app`` registers it as ``eval``).

``medreco eval entities --openi DIR [--labels mesh|negbio|both]`` (default both; ``both`` scores MeSH alone when DIR has
no NegBio file) scores entity extraction on a directory in
the Open-i layout (see :mod:`entity_extraction.evaluate`) and prints one table per label set; the last line
of each table gives the micro and macro figures. ``--negex FILE`` (the NegEx/ConText annotated test-kit layout)
prints negation precision/recall/F1; ``--ct-extractions DIR`` (the layout of ``../shared/data/ct-report-extractions``)
prints the gold present/absent findings found and the assertion accuracy (see
:mod:`entity_extraction.evaluate_outside`); ``--chexpert FILE`` (the CheXpert labelled-report layout) prints mention,
negation, uncertain and positive F1 (:mod:`entity_extraction.evaluate_chexpert`); ``--trigger-probe`` scores the NegEx
trigger probe (:mod:`entity_extraction.trigger_probe`). Unless ``--no-folds``, each figure is also printed on the folds
rule work may look at and on the held-out folds, with their difference (k-fold discipline:
:mod:`entity_extraction.folds`, ``entity_extraction/eval_folds.yaml``; ``--fold-seed N`` draws another fold
assignment). Open-i labels are scored with hedges read as NLM's indexing reads them
(:func:`entity_extraction.evaluate.open_i_reading`), and on the folds also with present study labels only and with
present or uncertain ones counted as coded; the NegBio block ends with the same fold line for NegBio's ceiling
(NLM's MeSH codes as the prediction, :func:`entity_extraction.evaluate.negbio_ceiling_by_fold`), the gap the label
set gives with no rule involved. The options combine; at least one is required. Exit status 0 on
success; 1 with a one-line reason on stderr when a set or its label files cannot be used.

``medreco eval deid --gold FILE.jsonl`` scores report text de-identification on a gold file in the layout of
``../shared/data/text-deid/PROVENANCE.md`` (see :mod:`entity_extraction.deid.evaluation`): recall per PHI type,
strict recall overall and non-PHI tokens lost; ``--folds 5`` splits FILE by patient and prints each fold, the
development (tuned) folds and the ``--held-out`` folds (default 3,4) apart; ``--synthetic N`` also scores N
generated notes (:mod:`entity_extraction.deid.synthetic`, held-out templates, ``--seed``). Exit status 0; 1 with a
one-line reason when FILE cannot be used or the folds do not fit.
``--language de|fr|es`` scores that language pack (:mod:`entity_extraction.languages`) and honours the gold's
``ignore`` spans (``../shared/data/text-deid-es/PROVENANCE.md``).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="evaluate entity extraction against labelled report sets",
)


class LabelChoice(StrEnum):
    """Which gold to score against."""

    mesh = "mesh"
    negbio = "negbio"
    both = "both"


@app.command("entities")
def entities(
    openi: Path | None = typer.Option(
        None,
        "--openi",
        help="directory in the Open-i layout (indiana_reports.csv, optional negbio_openi_gold14_labels.csv)",
    ),
    labels: LabelChoice = typer.Option(LabelChoice.both, "--labels", help="gold label set(s) to score (--openi)"),
    negex: Path | None = typer.Option(None, "--negex", help="file in the NegEx/ConText annotated test-kit layout"),
    ct_extractions: Path | None = typer.Option(
        None, "--ct-extractions", help="directory in the ct-report-extractions layout"
    ),
    chexpert: Path | None = typer.Option(
        None, "--chexpert", help="CSV in the CheXpert labelled-report layout (Reports + 14 observations)"
    ),
    trigger_probe: bool = typer.Option(
        False, "--trigger-probe", help="score the NegEx trigger probe (frames of the published trigger list)"
    ),
    folds: bool = typer.Option(
        True, "--folds/--no-folds", help="also print each figure on the tuned and held-out folds (eval_folds.yaml)"
    ),
    fold_seed: int | None = typer.Option(
        None, "--fold-seed", help="draw the folds with this seed (not the assignment rules were written on)"
    ),
) -> None:
    """Score entity extraction on labelled report sets: Open-i labels, the NegEx kit, CT extractions, the trigger
    probe."""
    from entity_extraction.evaluate import (
        NEGBIO_FILE,
        EvaluationDataError,
        evaluate_by_fold,
        load_coded_hedges,
        negbio_ceiling_by_fold,
        render_table,
    )
    from entity_extraction.evaluate_chexpert import evaluate_chexpert, load_chexpert_labelled, render_chexpert
    from entity_extraction.evaluate_outside import (
        evaluate_ct,
        evaluate_negex,
        load_ct_extractions,
        load_negex_kit,
        render_ct,
        render_negex,
    )
    from entity_extraction.extract import EntityExtractor
    from entity_extraction.folds import FoldsError, load_fold_plans, render_fold_line
    from entity_extraction.trigger_probe import build_probe, render_probe, score_probe

    if openi is None and negex is None and ct_extractions is None and chexpert is None and not trigger_probe:
        typer.echo(
            "error: give at least one of --openi, --negex, --ct-extractions, --chexpert, --trigger-probe", err=True
        )
        raise typer.Exit(1)
    blocks: list[str] = []
    try:
        plans = {name: plan.reseeded(fold_seed) for name, plan in load_fold_plans().items()}
        extractor = EntityExtractor()
        if openi is not None:
            sets: tuple[str, ...] = ("mesh", "negbio") if labels is LabelChoice.both else (labels.value,)
            if labels is LabelChoice.both and openi.is_dir() and not (openi / NEGBIO_FILE).is_file():
                sets = ("mesh",)  # NegBio labels are optional in the layout; asked for explicitly they are required
            # the labels are NLM's, so they are scored as NLM's indexing reads hedges (openi_assertion_map.yaml);
            # the product's own convention and "present or uncertain" are printed beside
            nlm = evaluate_by_fold(openi, sets, plans["openi"], extractor=extractor, coded_hedges=load_coded_hedges())
            readings = {"present, NLM's reading of hedges": nlm}
            if folds:
                readings["present, product convention"] = evaluate_by_fold(
                    openi, sets, plans["openi"], extractor=extractor
                )
                readings["present or uncertain"] = evaluate_by_fold(
                    openi, sets, plans["openi"], extractor=extractor, states=("present", "uncertain")
                )
            for s in sets:
                block = render_table(nlm[s]["all"], reading="present, hedges read as NLM's indexing does")
                if folds:
                    for name, results in readings.items():
                        block += "\n" + render_fold_line(
                            plans["openi"],
                            f"{s} micro F1, {name}",
                            {p: r.micro[2] for p, r in results[s].items()},
                            {p: r.n_reports - r.n_excluded for p, r in results[s].items()},
                        )
                if folds and s == "negbio":
                    # the label set's own fold noise: NLM's MeSH codes as the prediction (no rule of ours involved)
                    ceiling = negbio_ceiling_by_fold(openi, plans["openi"])
                    block += "\n" + render_fold_line(
                        plans["openi"],
                        "negbio micro F1, ceiling (NLM's MeSH codes as the prediction)",
                        {p: r.micro[2] for p, r in ceiling.items()},
                        {p: r.n_reports - r.n_excluded for p, r in ceiling.items()},
                    )
                blocks.append(block)
        if negex is not None:
            items = load_negex_kit(negex)
            block = render_negex(evaluate_negex(items, extractor), f"NegEx kit {negex.name}")
            if folds:
                plan = plans["negex-kit"]
                kit_parts = {
                    p: [it for i, it in enumerate(items) if plan.part(str(i)) == p] for p in ("tuned", "held-out")
                }
                f1 = {p: evaluate_negex(v, extractor).all.prf[2] for p, v in kit_parts.items()}
                block += "\n" + render_fold_line(
                    plan, "negation F1, all targets", f1, {p: len(v) for p, v in kit_parts.items()}
                )
            blocks.append(block)
        if ct_extractions is not None:
            reports = load_ct_extractions(ct_extractions)
            result = evaluate_ct(reports, extractor)
            block = render_ct(result)
            if folds:
                plan = plans["ct-extractions"]
                ct_parts = {
                    p: evaluate_ct([r for r in reports if plan.part(r.id) == p], extractor)
                    for p in ("tuned", "held-out")
                }
                n = {p: r.n_reports for p, r in ct_parts.items()}
                block += "\n" + render_fold_line(
                    plan, "findings found", {p: r.found / max(r.items, 1) for p, r in ct_parts.items()}, n
                )
                block += "\n" + render_fold_line(
                    plan,
                    "mention assertion accuracy",
                    {p: r.mention_right / max(r.found, 1) for p, r in ct_parts.items()},
                    n,
                )
                block += "\n" + render_fold_line(
                    plan,
                    "study-level assertion accuracy",
                    {p: r.pairs_right / max(r.pairs_found, 1) for p, r in ct_parts.items()},
                    n,
                )
            blocks.append(block)
        if chexpert is not None:
            labelled = load_chexpert_labelled(chexpert)
            block = render_chexpert(
                evaluate_chexpert(labelled, extractor), f"CheXpert labelled reports {chexpert.name}"
            )
            if folds:
                plan = plans["chexpert"]
                cx_parts = {
                    p: evaluate_chexpert([r for r in labelled if plan.part(str(r.index)) == p], extractor)
                    for p in ("tuned", "held-out")
                }
                n = {p: sum(1 for r in labelled if plan.part(str(r.index)) == p) for p in cx_parts}
                for fig in ("mention", "negation", "uncertain"):
                    block += "\n" + render_fold_line(
                        plan,
                        f"{fig} F1",
                        {
                            p: r.scores[fig].prf[2] if r.scores[fig].tp + r.scores[fig].fp + r.scores[fig].fn else None
                            for p, r in cx_parts.items()
                        },
                        n,
                    )
            blocks.append(block)
        if trigger_probe:
            frames = build_probe()
            block = render_probe(score_probe(frames, extractor))
            if folds:
                plan = plans["negex-probe"]
                probe_parts = {p: [f for f in frames if plan.part(f.trigger) == p] for p in ("tuned", "held-out")}
                block += "\n" + render_fold_line(
                    plan,
                    "probe accuracy",
                    {p: score_probe(v, extractor).accuracy for p, v in probe_parts.items()},
                    {p: len(v) for p, v in probe_parts.items()},
                )
            blocks.append(block)
    except (EvaluationDataError, FoldsError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo("\n\n".join(blocks))


@app.command("deid")
def deid(
    gold: Path | None = typer.Option(None, "--gold", help="JSONL gold file: {id, text, phi: [{start, end, type}]}"),
    folds: int = typer.Option(0, "--folds", help="also split the gold by patient into N folds (0: no folds)"),
    held_out: str = typer.Option("3,4", "--held-out", help="folds never looked at while rules are written"),
    synthetic: int = typer.Option(0, "--synthetic", help="also score N generated notes (Faker, held-out templates)"),
    seed: int = typer.Option(1, "--seed", help="seed of the generated notes"),
    language: str = typer.Option(
        "en", "--language", help="language of the gold's texts: en, or a language pack (de, fr, es)"
    ),
) -> None:
    """Strict recall per PHI type and non-PHI tokens lost of report text de-identification on FILE, by fold, and on
    generated notes."""
    from entity_extraction.deid.evaluation import (
        GoldFormatError,
        evaluate_deid,
        evaluate_folds,
        load_gold,
        render_deid_table,
        render_fold_table,
    )

    if gold is None and not synthetic:
        typer.echo("error: give --gold FILE and/or --synthetic N", err=True)
        raise typer.Exit(1)
    if language != "en":
        if gold is None:
            typer.echo("error: --language needs --gold FILE", err=True)
            raise typer.Exit(1)
        _deid_language(gold, language)
        return
    blocks = []
    if gold is not None:
        try:
            notes = load_gold(gold)
            held = tuple(int(f) for f in held_out.split(",") if f.strip())
            blocks.append(
                render_fold_table(evaluate_folds(notes, folds, held))
                if folds
                else render_deid_table(evaluate_deid(notes))
            )
        except (OSError, GoldFormatError, ValueError) as err:
            typer.echo(f"error: {gold}: {err}", err=True)
            raise typer.Exit(1) from None
    if synthetic:
        from entity_extraction.deid.synthetic import generate_notes

        blocks.append(
            f"generated notes (seed {seed}, held-out templates):\n"
            + render_deid_table(evaluate_deid(generate_notes(synthetic, seed=seed)))
        )
    typer.echo("\n\n".join(blocks))


def _deid_language(gold: Path, language: str) -> None:
    """``eval deid --language xx`` for a language pack: ``ignore`` spans of the gold (not identifiers under HIPAA
    Safe Harbor) count neither as PHI nor as non-PHI tokens (:mod:`entity_extraction.languages.evaluate`)."""
    from entity_extraction.deid.evaluation import DeidScore, render_deid_table
    from entity_extraction.languages.evaluate import load_gold_with_ignore, score_deid
    from entity_extraction.languages.local_deid import available_languages, deidentify_local

    if language not in available_languages():
        typer.echo(
            f"error: --language {language!r}: no language pack (en, {', '.join(available_languages())})", err=True
        )
        raise typer.Exit(1)
    try:
        docs = load_gold_with_ignore(gold)
    except (OSError, ValueError, KeyError, TypeError) as err:
        typer.echo(f"error: {gold}: {err}", err=True)
        raise typer.Exit(1) from None
    score = score_deid(docs, lambda t: deidentify_local(t, language, known_phi=[], date_shift_days=None)[0])
    typer.echo(
        render_deid_table(
            DeidScore(
                per_type=score.per_type,
                non_phi_tokens=score.non_phi_tokens,
                non_phi_lost=score.non_phi_lost,
                notes=score.docs,
            )
        )
    )


@app.callback()
def _main() -> None:
    """Evaluation commands."""
