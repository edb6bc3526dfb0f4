"""Synthetic radiology report text for the demo corpus, with its ground truth.

Two steps, both deterministic given a :class:`random.Random`:

1. :func:`plan_entities` evolves a per-patient, per-family entity state from one study to the next
   (present findings persist, grow, shrink, resolve; new ones appear) and returns what the next report
   asserts about each entity (assertion and interval change vs the patient's prior study of the family).
2. :func:`render_report` turns such a plan into clinical English with section headers (variants from
   ``phrases.yaml``) and restricted-data preamble/footer lines; it returns the text, the ground-truth
   entity list and every planted PHI value.

Entity phrases are ontology synonyms (``Concept.synonyms['en']``) that name exactly one concept of the
study's modality family, so a longest-match extractor over the family's synonyms recovers exactly the
entities of the truth record. Anatomy structures named by a normal or technique sentence are recorded
with assertion ``present`` and change ``none``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import date, datetime
from typing import Any

from etl.demo.report_types import (  # noqa: F401  (re-exported: the generator's public names stay here)
    ASSERTIONS,
    CHANGES,
    PHRASES_FILE,
    DemoReportError,
    EntityState,
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

# ----------------------------------------------------------------------------------------------- phrases


def family_phrases(family: str) -> dict[str, tuple[str, ...]]:
    """Usable English phrases per finding/condition concept of one family.

    A phrase is a synonym of the concept that no other concept of the family shares, without
    commas, slashes or conjunctions, at most 40 characters, not a 2-4 letter abbreviation, and not a
    plural whose singular is also usable.

    Returns
    -------
    dict
        concept id -> tuple of phrases (sorted; concepts with no usable phrase are left out).

    Raises
    ------
    DemoReportError
        ``unknown_family`` for a family the ontology does not have.
    """
    onto = load_ontology()
    book = load_phrases()
    if family not in onto.families:
        raise DemoReportError("unknown_family", f"{family!r} is not one of {sorted(onto.families)}")
    concepts = onto.family_concepts(family)
    owners: dict[str, set[str]] = {}
    for c in concepts:
        for s in c.synonyms.get("en", ()):
            owners.setdefault(s.lower(), set()).add(c.id)
    out: dict[str, tuple[str, ...]] = {}
    for c in concepts:
        if c.category == "anatomy":
            continue
        cands = {
            s.lower()
            for s in c.synonyms.get("en", ())
            if owners[s.lower()] == {c.id}
            and not any(ch in s for ch in ",/")
            and " and " not in s
            and " or " not in s
            and len(s) <= 40
            and not _is_abbreviation(s)
            and s.lower().split()[0] not in book["excluded_phrase_starts"]
        }
        cands = {s for s in cands if not (s.endswith("s") and s[:-1] in cands)}
        if cands:
            out[c.id] = tuple(sorted(cands))
    return out


def _is_plural(phrase: str, book: dict[str, Any]) -> bool:
    last = phrase.split()[-1]
    if last in book["plural_words"]:
        return True
    return last.endswith("s") and not any(last.endswith(e) for e in book["singular_endings"])


# ------------------------------------------------------------------------------------------ entity state


def _phrases_of(family: str, language: str) -> dict[str, tuple[str, ...]]:
    """:func:`family_phrases` in English, :func:`etl.demo.reports_local.local_family_phrases` in another language."""
    if language == "en":
        return family_phrases(family)
    from etl.demo.reports_local import local_family_phrases

    return local_family_phrases(family, language)


def _candidates(family: str, us_subtype: str | None, language: str = "en") -> list[str]:
    onto = load_ontology()
    book = load_phrases()
    phrases = _phrases_of(family, language)
    ids = sorted(phrases)
    if family == "2D-Ultrasound":
        sub = book["us_subtypes"].get(us_subtype or "")
        if sub is None:
            raise DemoReportError("unknown_us_subtype", f"{us_subtype!r} is not one of {sorted(book['us_subtypes'])}")
        ids = [
            i
            for i in ids
            if (onto.concepts[i].category == "finding" and onto.concepts[i].anatomy_id in sub["anatomy"])
            or i in sub["conditions"]
        ]
    return ids


def _new_state(
    rng: random.Random, entity_id: str, family: str, fixed_side: str | None, language: str = "en"
) -> EntityState:
    onto = load_ontology()
    book = load_phrases()
    c = onto.concepts[entity_id]
    phrase = rng.choice(_phrases_of(family, language)[entity_id])
    severity = rng.randrange(3) if c.category == "finding" else None
    side: str | None = None
    location = ""
    anat = c.anatomy_id
    if anat in book["laterality_prefix_anatomy"]:
        side = fixed_side or rng.choice(["right", "left", "left", "right", "bilateral"])
        if side == "bilateral" and language == "en" and not _is_plural(phrase, book):
            side = rng.choice(["right", "left"])
    elif anat in book["lobe_anatomy"]:
        side = rng.choice(["right", "left", "bilateral"])
        if side == "bilateral":
            location = book["bilateral_lobe_location"]
        else:
            location = f"in the {side} {rng.choice(book['lobes'][side])} lobe"
    elif anat in book["brain_anatomy"]:
        side = rng.choice(["right", "left"])
        location = f"in the {side} {rng.choice(book['brain_lobes'])} lobe"
    return EntityState(entity_id, phrase, severity, side, location)


def plan_entities(
    rng: random.Random,
    family: str,
    prior: dict[str, EntityState] | None,
    *,
    us_subtype: str | None = None,
    fixed_side: str | None = None,
    language: str = "en",
) -> tuple[list[PlannedMention], dict[str, EntityState]]:
    """Decide what the next report of a patient says about the family's entities.

    Parameters
    ----------
    rng : random.Random
        Source of all choices (seeded by the caller for determinism).
    family : str
        Modality family (``'2D-CXR'``, ``'3D-CT'``, ``'3D-Brain-MRI'``, ``'2D-Ultrasound'``).
    prior : dict or None
        Entity state after the patient's previous study of this family (entity id -> EntityState),
        or None when this is the patient's first study of the family (then every change is ``none``).
    us_subtype : str, optional
        ``breast``/``liver``/``thyroid`` for ultrasound (restricts the concepts).
    fixed_side : str, optional
        Laterality forced on lateralised entities (the examined breast).
    language : str
        Report language: ``en``, or a language of ``phrases_local.yaml`` (``de``, ``es``); only concepts with a
        usable synonym in that language are planned, and their phrases are in that language.

    Returns
    -------
    mentions : list of PlannedMention
        One per entity the report states (each entity at most once).
    state : dict
        The present entities after this study (input for the next one).

    Raises
    ------
    DemoReportError
        ``unknown_family`` / ``unknown_us_subtype``.
    """
    onto = load_ontology()
    book = load_phrases()
    cands = _candidates(family, us_subtype, language)
    mentions: list[PlannedMention] = []
    state: dict[str, EntityState] = {}
    used: set[str] = set()
    if prior:
        for eid in sorted(prior):
            st = prior[eid]
            used.add(eid)
            c = onto.concepts[eid]
            if st.severity is None:
                opts = ["unchanged", "unchanged", "improved", "worsened", "resolved"]
            else:
                size = _scale(c, book) is book["severity"]["size"]
                up, down = ("increased", "decreased") if size else ("worsened", "improved")
                opts = ["unchanged", "unchanged", "resolved"]
                opts += [up] if st.severity < 2 else []
                opts += [down] if st.severity > 0 else []
            change = rng.choice(opts)
            if change == "resolved":
                mentions.append(PlannedMention(eid, "absent", "resolved", st))
                continue
            if st.severity is not None and change in ("increased", "worsened"):
                st = replace(st, severity=st.severity + 1)
            elif st.severity is not None and change in ("decreased", "improved"):
                st = replace(st, severity=st.severity - 1)
            mentions.append(PlannedMention(eid, "present", change, st))
            state[eid] = st
    free = [i for i in cands if i not in used]
    rng.shuffle(free)
    n_new = rng.choice([0, 1, 1, 2]) if prior is not None else rng.choice([0, 1, 1, 2, 2, 3])
    for eid in free[:n_new]:
        st = _new_state(rng, eid, family, fixed_side, language)
        mentions.append(PlannedMention(eid, "present", "new" if prior is not None else "none", st))
        state[eid] = st
    rest = free[n_new:]
    n_unc = rng.choice([0, 0, 1])
    for eid in rest[:n_unc]:
        mentions.append(PlannedMention(eid, "uncertain", "none", _new_state(rng, eid, family, fixed_side, language)))
    n_abs = rng.choice([1, 2, 2, 3])
    for eid in rest[n_unc : n_unc + n_abs]:
        mentions.append(PlannedMention(eid, "absent", "none", _new_state(rng, eid, family, fixed_side, language)))
    return mentions, state


# ------------------------------------------------------------------------------------------- rendering


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _fill(template: str, values: dict[str, str]) -> str:
    full = dict(values)
    for k, v in values.items():
        full[_cap(k)] = _cap(v)
    return template.format(**full)


def _mention_values(m: PlannedMention, book: dict[str, Any]) -> dict[str, str]:
    onto = load_ontology()
    st = m.state
    c = onto.concepts[m.entity_id]
    lat = st.phrase
    if st.side and m.entity_id and c.anatomy_id in book["laterality_prefix_anatomy"]:
        lat = f"{st.side} {lat}"
    if st.location:
        lat = f"{lat} {st.location}"
    sev = _scale(c, book)[st.severity] if st.severity is not None else ""
    desc = f"{sev} {lat}" if sev else lat
    plural = _is_plural(st.phrase, book)
    return {
        "phrase": st.phrase,
        "lat": lat,
        "desc": desc,
        "sev": sev,
        "is": "are" if plural else "is",
        "has": "have" if plural else "has",
    }


def mention_sentence(rng: random.Random, m: PlannedMention, *, impression: bool = False) -> str:
    """One sentence stating ``m`` (findings style, or a short impression item).

    Raises
    ------
    DemoReportError
        ``bad_phrase_file`` when the assertion/change pair has no template.
    """
    book = load_phrases()
    vals = _mention_values(m, book)
    onto = load_ontology()
    if impression:
        key = m.assertion if m.change == "none" else m.change
        tmpl = book["impression_items"].get(key)
        if tmpl is None:
            raise DemoReportError("bad_phrase_file", f"no impression item for {key!r}")
        return _fill(tmpl, vals)
    if m.assertion == "absent" and m.change == "none":
        key = "absent"
    elif m.assertion == "uncertain":
        key = "uncertain"
    elif m.change == "none":
        key = "condition_present" if onto.concepts[m.entity_id].category == "condition" else "present"
    else:
        key = m.change
    options = [t for t in book["templates"][key] if "{sev}" not in t or vals["sev"]]
    if not options:
        raise DemoReportError("bad_phrase_file", f"no usable template for {key!r}")
    return _fill(rng.choice(options), vals)


def format_date(rng: random.Random, d: date | datetime, country: str) -> str:
    """Render a date in one of the country's report styles (e.g. ``03/14/2023``, ``14 March 2023``)."""
    book = load_phrases()
    styles = book["date_formats"].get(country, book["date_formats"]["default"])
    month = book["months"][d.month - 1]
    return rng.choice(styles).format(
        yyyy=f"{d.year:04d}", mm=f"{d.month:02d}", dd=f"{d.day:02d}", d=str(d.day), Month=month, Mon=month[:3]
    )


def _name_display(rng: random.Random, ctx: ReportContext) -> str:
    book = load_phrases()
    t = rng.choice(book["name_display"])
    return t.format(
        Given=ctx.patient_given.title(),
        Family=ctx.patient_family.title(),
        GIVEN=ctx.patient_given.upper(),
        FAMILY=ctx.patient_family.upper(),
        M=ctx.patient_middle[:1].upper() or "J",
    )


def render_report(rng: random.Random, ctx: ReportContext, mentions: list[PlannedMention]) -> RenderedReport:
    """Write one report for ``mentions`` in the context ``ctx``.

    Returns
    -------
    RenderedReport
        ``text`` with INDICATION/TECHNIQUE/COMPARISON/FINDINGS/IMPRESSION sections (header variants,
        sometimes on their own line, sometimes empty); ``entities`` the ground truth; ``phi`` every
        restricted value written into the text as ``(phi_type, value)``.

    Raises
    ------
    DemoReportError
        ``unknown_family`` for a family the phrase book has no indication for.
    """
    book = load_phrases()
    if ctx.family not in book["indication"]:
        raise DemoReportError("unknown_family", f"no phrases for family {ctx.family!r}")
    phi: list[tuple[str, str]] = []
    truth: dict[str, tuple[str, str]] = {}
    own_line = rng.random() < 0.5
    lines: list[str] = []

    def section(kind: str, body: str) -> None:
        head = rng.choice(book["sections"][kind])
        if not body:
            lines.append(head)
        elif own_line or "\n" in body:
            lines.append(f"{head}\n{body}")
        else:
            lines.append(f"{head} {body}")

    def date_text(d: date | datetime, kind: str = "date") -> str:
        s = format_date(rng, d, ctx.country)
        phi.append((kind, s))
        return s

    if ctx.with_preamble:
        name = _name_display(rng, ctx)
        phi.append(("name", name))
        lines.append(render_preamble(rng, ctx, book["header"], name, date_text, phi, truth))

    # INDICATION
    ind_opts = book["indication"][ctx.family]
    if isinstance(ind_opts, dict):
        ind_opts = ind_opts[ctx.us_subtype]
    indication = rng.choice(ind_opts)
    if rng.random() < 0.4:
        age = book["age_phrase"].format(age=ctx.age_years, sex_word=rng.choice(book["sex_words"][ctx.sex]))
        if ctx.age_years > 89:
            phi.append(("age", f"{ctx.age_years}-year-old"))
        indication = f"{_cap(age)}. {indication}"
    section("indication", indication)

    # TECHNIQUE
    tech = rng.choice(book["technique"][ctx.technique_key])
    tech_text = tech["text"].format(side=ctx.side or "")
    for a in tech["mentions"]:
        truth[a] = ("present", "none")
    if tech_text and ctx.with_preamble and rng.random() < 0.3:
        tech_text += " Patient identity was confirmed with two identifiers."
    section("technique", tech_text)

    # COMPARISON
    if ctx.prior_date is not None and ctx.prior_exam is not None:
        comp = rng.choice(book["comparison"]["prior"]).format(exam=ctx.prior_exam, date=date_text(ctx.prior_date))
        comp = _cap(comp)
    else:
        comp = rng.choice(book["comparison"]["none"])
    section("comparison", comp)

    # FINDINGS
    onto = load_ontology()
    busy_anatomy = {
        onto.concepts[m.entity_id].anatomy_id for m in mentions if m.assertion != "absent" or m.change == "resolved"
    }
    sentences: list[str] = []
    absent_plain = [m for m in mentions if m.assertion == "absent" and m.change == "none"]
    others = [m for m in mentions if not (m.assertion == "absent" and m.change == "none")]
    for m in others:
        sentences.append(mention_sentence(rng, m))
    i = 0
    while i < len(absent_plain):
        m = absent_plain[i]
        if i + 1 < len(absent_plain) and rng.random() < 0.5:
            m2 = absent_plain[i + 1]
            tmpl = rng.choice(book["templates"]["absent_pair"])
            sentences.append(tmpl.format(phrase=m.state.phrase, phrase2=m2.state.phrase))
            i += 2
        else:
            sentences.append(mention_sentence(rng, m))
            i += 1
    add_normal_sentences(rng, book, ctx, busy_anatomy, sentences, truth)
    rng.shuffle(sentences)
    for m in mentions:
        truth[m.entity_id] = (m.assertion, m.change)
    section("findings", " ".join(sentences) if rng.random() < 0.7 else "\n".join(sentences))

    # IMPRESSION
    items = [mention_sentence(rng, m, impression=True) for m in others]
    if not items:
        items = [rng.choice(book["normal_impression"][ctx.family])]
    if len(items) > 1 and rng.random() < 0.6:
        body = "\n".join(f"{k}. {t}" for k, t in enumerate(items, 1))
    else:
        body = " ".join(items)
    section("impression", body)

    # footer
    sign_date = format_date(rng, ctx.report_datetime, ctx.country)
    sign_time = ctx.report_datetime.strftime("%H:%M")
    footer = rng.choice(book["footer"])
    footer_text = footer.format(
        radiologist=ctx.radiologist,
        referrer=ctx.referrer,
        sign_date=sign_date,
        sign_time=sign_time,
        phone=ctx.phone,
    )
    phi.append(("name", ctx.radiologist) if "{radiologist}" in footer else ("name", ctx.referrer))
    phi.append(("date", sign_date))
    if "{sign_time}" in footer:
        phi.append(("time", sign_time))
    if "{phone}" in footer:
        phi.append(("phone", ctx.phone))
    lines.append(footer_text)

    entities = [{"entity_id": k, "assertion": v[0], "change": v[1]} for k, v in sorted(truth.items())]
    return RenderedReport(text="\n\n".join(lines) + "\n", entities=entities, phi=phi)
