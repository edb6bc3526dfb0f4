"""Demo report text in German and Spanish (the demo's institutions in Germany and Spain), and reports in languages
without a language pack (Italian, Dutch, Chinese) that the build must withhold as ``unsupported_language``.

The plan of a report (:func:`etl.demo.reports.plan_entities` with ``language``) is rendered like an English one
(:func:`etl.demo.reports.render_report`: preamble, the five sections, footer; the same ground truth and PHI list)
with the phrase book ``phrases_local.yaml``. Entity phrases are the language's ontology synonyms
(``schemas/ontology/synonyms_<lang>.json``) that name exactly one concept of the study's family, so a longest-match
scan over the family's synonyms in that language recovers exactly the truth record's entities.
"""

from __future__ import annotations

import random
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from etl.demo.report_types import (
    DemoReportError,
    PlannedMention,
    RenderedReport,
    ReportContext,
    _is_abbreviation,
    _scale,
    add_normal_sentences,
    load_phrases,
    render_preamble,
)
from schemas.ontology import load_ontology

LOCAL_PHRASES_FILE = Path(__file__).with_name("phrases_local.yaml")
#: report languages of the local phrase book; the others of ``unsupported`` have no language pack
LOCAL_LANGUAGES = ("de", "es")


@lru_cache(maxsize=1)
def load_local_phrases() -> dict[str, Any]:
    """The German/Spanish phrase book (``phrases_local.yaml``).

    Raises
    ------
    DemoReportError
        ``bad_phrase_file`` when a language of :data:`LOCAL_LANGUAGES` or ``unsupported`` is missing.
    """
    data = yaml.safe_load(LOCAL_PHRASES_FILE.read_text(encoding="utf-8")) or {}
    missing = [k for k in (*LOCAL_LANGUAGES, "unsupported") if k not in data]
    if missing:
        raise DemoReportError("bad_phrase_file", f"{LOCAL_PHRASES_FILE} lacks keys {missing}")
    return data


def _book(language: str) -> dict[str, Any]:
    book = load_local_phrases()
    if language not in LOCAL_LANGUAGES:
        raise DemoReportError("unknown_language", f"{language!r} is not one of {LOCAL_LANGUAGES}")
    return book[language]


@lru_cache(maxsize=16)
def local_family_phrases(family: str, language: str) -> dict[str, tuple[str, ...]]:
    """Usable phrases per finding/condition concept of ``family`` in ``language``: synonyms that no other concept
    of the family shares, without commas or slashes, at most 40 characters, not a 2-4 letter abbreviation.

    Returns
    -------
    dict
        concept id -> sorted tuple of phrases (concepts without one are left out).

    Raises
    ------
    DemoReportError
        ``unknown_family``.
    """
    onto = load_ontology()
    if family not in onto.families:
        raise DemoReportError("unknown_family", f"{family!r} is not one of {sorted(onto.families)}")
    concepts = onto.family_concepts(family)
    owners: dict[str, set[str]] = {}
    for c in concepts:
        for s in c.synonyms.get(language, ()):
            owners.setdefault(s.lower(), set()).add(c.id)
    out: dict[str, tuple[str, ...]] = {}
    for c in concepts:
        if c.category == "anatomy":
            continue
        cands = sorted(
            {
                s.lower()
                for s in c.synonyms.get(language, ())
                if owners[s.lower()] == {c.id}
                and not any(ch in s for ch in ",/")
                and len(s) <= 40
                and not _is_abbreviation(s)
            }
        )
        if cands:
            out[c.id] = tuple(cands)
    return out


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _noun_case(phrase: str, language: str) -> str:
    """German nouns capitalised (the synonyms are lower case): every word but a leading inflected adjective."""
    if language != "de":
        return phrase
    words = phrase.split()
    adjective = ("e", "er", "es", "en", "em")
    return " ".join(
        w
        if (i < len(words) - 1 and w.endswith(adjective) and w not in ("der", "des")) or w in ("der", "des")
        else _cap(w)
        for i, w in enumerate(words)
    )


def _values(m: PlannedMention, language: str) -> dict[str, str]:
    book = _book(language)
    onto = load_ontology()
    c = onto.concepts[m.entity_id]
    phrase = _noun_case(m.state.phrase, language)
    lat = f"{phrase} {book['sides'][m.state.side]}" if m.state.side else phrase
    sev = ""
    if m.state.severity is not None:
        key = "size" if _scale(c, load_phrases()) is load_phrases()["severity"]["size"] else "degree"
        sev = book["severity"][key][m.state.severity]
    desc = f"{lat} ({sev})" if (sev and language == "de") else (f"{lat} {sev}" if sev else lat)
    vals = {"phrase": phrase, "lat": lat, "desc": desc, "sev": sev}
    vals.update({_cap(k): _cap(v) for k, v in list(vals.items())})
    return vals


def _sentence(rng: random.Random, m: PlannedMention, language: str, impression: bool = False) -> str:
    book = _book(language)
    vals = _values(m, language)
    if impression:
        return book["impression_items"][m.assertion if m.change == "none" else m.change].format(**vals)
    if m.assertion == "absent" and m.change == "none":
        key = "absent"
    elif m.assertion == "uncertain":
        key = "uncertain"
    elif m.change == "none":
        key = "condition_present" if load_ontology().concepts[m.entity_id].category == "condition" else "present"
    else:
        key = m.change
    options = [t for t in book["templates"][key] if "{sev}" not in t or vals["sev"]]
    if not options:
        raise DemoReportError("bad_phrase_file", f"no usable {language} template for {key!r}")
    return rng.choice(options).format(**vals)


def format_local_date(rng: random.Random, d: date | datetime, language: str) -> str:
    """A date as the language's reports write it (``12.03.2023``, ``12. März 2023``; ``12/03/2023``,
    ``12 de marzo de 2023``)."""
    book = _book(language)
    month = book["months"][d.month - 1]
    return rng.choice(book["date_formats"]).format(
        yyyy=f"{d.year:04d}",
        mm=f"{d.month:02d}",
        dd=f"{d.day:02d}",
        d=str(d.day),
        m=str(d.month),
        Month=month,
        month=month,
    )


def render_local_report(
    rng: random.Random, ctx: ReportContext, mentions: list[PlannedMention], language: str
) -> RenderedReport:
    """Write one report in ``language`` (``de`` or ``es``) for ``mentions``, like
    :func:`etl.demo.reports.render_report` (same sections, truth entities and PHI list).

    Raises
    ------
    DemoReportError
        ``unknown_language``, ``unknown_family``, ``bad_phrase_file``.
    """
    book = _book(language)
    if ctx.family not in book["indication"]:
        raise DemoReportError("unknown_family", f"no {language} phrases for family {ctx.family!r}")
    phi: list[tuple[str, str]] = []
    truth: dict[str, tuple[str, str]] = {}
    own_line = rng.random() < 0.5
    lines: list[str] = []

    def section(kind: str, body: str) -> None:
        head = rng.choice(book["sections"][kind])
        lines.append(f"{head}\n{body}" if (own_line or "\n" in body) else f"{head} {body}")

    def date_text(d: date | datetime) -> str:
        s = format_local_date(rng, d, language)
        phi.append(("date", s))
        return s

    if ctx.with_preamble:
        hdr = book["header"]
        shown = rng.choice(book["name_display"]).format(
            Given=ctx.patient_given,
            Family=ctx.patient_family,
            GIVEN=ctx.patient_given.upper(),
            FAMILY=ctx.patient_family.upper(),
            Title=book["titles"][ctx.sex],
        )
        name = shown.removeprefix(book["titles"][ctx.sex] + " ")
        phi.append(("name", name))
        lines.append(render_preamble(rng, ctx, hdr, shown, date_text, phi, truth))

    ind = book["indication"][ctx.family]
    if isinstance(ind, dict):
        ind = ind[ctx.us_subtype]
    indication = rng.choice(ind)
    if rng.random() < 0.4:
        age = book["age_phrase_m" if ctx.sex == "M" else "age_phrase"].format(age=ctx.age_years)
        if ctx.age_years > 89:
            phi.append(("age", str(ctx.age_years)))
        indication = f"{age}. {indication}"
    section("indication", indication)

    tech = rng.choice(book["technique"][ctx.technique_key])
    for a in tech["mentions"]:
        truth[a] = ("present", "none")
    section("technique", tech["text"])

    if ctx.prior_date is not None:
        comp = rng.choice(book["comparison"]["prior"]).format(
            exam=book["exam_names"][ctx.family], date=date_text(ctx.prior_date)
        )
        comp = _cap(comp)
    else:
        comp = rng.choice(book["comparison"]["none"])
    section("comparison", comp)

    onto = load_ontology()
    busy = {
        onto.concepts[m.entity_id].anatomy_id for m in mentions if m.assertion != "absent" or m.change == "resolved"
    }
    absent_plain = [m for m in mentions if m.assertion == "absent" and m.change == "none"]
    others = [m for m in mentions if not (m.assertion == "absent" and m.change == "none")]
    sentences = [_sentence(rng, m, language) for m in others]
    i = 0
    while i < len(absent_plain):
        m = absent_plain[i]
        if i + 1 < len(absent_plain) and rng.random() < 0.5:
            m2 = absent_plain[i + 1]
            sentences.append(
                rng.choice(book["templates"]["absent_pair"]).format(
                    phrase=_noun_case(m.state.phrase, language), phrase2=_noun_case(m2.state.phrase, language)
                )
            )
            i += 2
        else:
            sentences.append(_sentence(rng, m, language))
            i += 1
    add_normal_sentences(rng, book, ctx, busy, sentences, truth)
    rng.shuffle(sentences)
    for m in mentions:
        truth[m.entity_id] = (m.assertion, m.change)
    section("findings", " ".join(sentences) if rng.random() < 0.7 else "\n".join(sentences))

    items = [_sentence(rng, m, language, impression=True) for m in others]
    if not items:
        items = [rng.choice(book["normal_impression"][ctx.family])]
    body = "\n".join(f"{k}. {t}" for k, t in enumerate(items, 1)) if len(items) > 1 else items[0]
    section("impression", body)

    sign_date = format_local_date(rng, ctx.report_datetime, language)
    sign_time = ctx.report_datetime.strftime("%H:%M")
    footer = rng.choice(book["footer"])
    lines.append(
        footer.format(
            radiologist=ctx.radiologist,
            referrer=ctx.referrer,
            sign_date=sign_date,
            sign_time=sign_time,
            phone=ctx.phone,
        )
    )
    phi.append(("name", ctx.radiologist) if "{radiologist}" in footer else ("name", ctx.referrer))
    phi.append(("date", sign_date))
    if "{sign_time}" in footer:
        phi.append(("time", sign_time))
    if "{phone}" in footer:
        phi.append(("phone", ctx.phone))
    entities = [{"entity_id": k, "assertion": v[0], "change": v[1]} for k, v in sorted(truth.items())]
    return RenderedReport(text="\n\n".join(lines) + "\n", entities=entities, phi=phi)


def render_unsupported(ctx: ReportContext, language: str) -> RenderedReport:
    """An outside report in ``language`` (``it``, ``nl``, ``zh``: no language pack) about ``ctx``'s patient; no
    truth entities (the build withholds it), every PHI value listed.

    Raises
    ------
    DemoReportError
        ``unknown_language`` for a language the phrase book has no outside report in.
    """
    texts = load_local_phrases()["unsupported"]
    if language not in texts:
        raise DemoReportError("unknown_language", f"{language!r} is not one of {sorted(texts)}")
    name = f"{ctx.patient_given} {ctx.patient_family}"
    dob = f"{ctx.birth_date:%d/%m/%Y}"
    when = f"{ctx.study_datetime:%d/%m/%Y}"
    text = texts[language].format(name=name, dob=dob, date=when, radiologist=ctx.radiologist)
    phi = [("name", name), ("date", dob), ("date", when), ("name", ctx.radiologist)]
    return RenderedReport(text=text.strip() + "\n", entities=[], phi=phi)
