"""Ontology entity extraction from radiology reports with medspaCy (TargetMatcher + ConText).

Pipeline (built once per :class:`EntityExtractor`): a blank spaCy tokenizer (plus a prefix rule that
splits glued list numbers, ``"1.No"`` -> ``"1."``, ``"No"``), spaCy's rule-based ``sentencizer``
(PyRuSH is about 10x slower), a component that also starts a sentence at every section header and
numbered list item, one medspaCy ``TargetMatcher`` per modality family whose rules are the ontology
synonyms, and one medspaCy ``ConText`` (Harkema H. et al., J Biomed Inform 2009;42(5):839-851) with
our own rule set (``context_rules.json``): negation, uncertainty, history, hypothetical, and the
custom categories CHANGE, LATERALITY, SEVERITY, CLAUSE_BREAK. medspaCy's default rules are *not*
used: its ``": no"`` rule outranks ``"no"`` so ``"FINDINGS: No pleural effusion"`` would not be negated.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import spacy
from loguru import logger
from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import compile_prefix_regex

from entity_extraction.sections import section_at, section_body_spans, section_spans
from schemas.ontology import FAMILIES, Ontology, load_ontology

logger.disable("PyRuSH")  # PyRuSH logs every token at DEBUG when medspaCy imports it

from medspacy.context import ConText, ConTextRule  # noqa: E402
from medspacy.target_matcher import TargetMatcher, TargetRule  # noqa: E402

CONTEXT_RULES_FILE = Path(__file__).with_name("context_rules.json")
#: anatomy + descriptor rules (English); see the file's description and :class:`EntityExtractor`.
DESCRIPTOR_RULES_FILE = Path(__file__).with_name("descriptor_rules_en.json")
_DESCRIPTOR = "DESCRIPTOR"
ASSERTIONS = ("present", "absent", "uncertain")
TEMPORALITIES = ("current", "historical", "hypothetical")
CHANGES = ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened", "none")
LATERALITIES = ("left", "right", "bilateral")
SEVERITIES = ("mild", "moderate", "severe", "small", "large", "trace")
#: sections whose mentions describe the current study (used by :func:`study_labels`), by priority group.
LABEL_SECTIONS = (("impression",), ("findings", "unsectioned"))
_LIST_ITEM = re.compile(r"^(?:\d{1,2}[.)]|[-*\u2022])$")
_SECTION_SENTS = "medreco_section_sentences"


class ExtractorConfigError(ValueError):
    """The extractor cannot be built (``reason``: ``unknown_family``, ``unsupported_language``,
    ``invalid_context_rules``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


if not Language.has_factory(_SECTION_SENTS):

    @Language.component(_SECTION_SENTS)
    def _section_sentences(doc: Doc) -> Doc:
        """Start a sentence at every section header, blank line and numbered/bulleted list item."""
        starts = {start for _, start, _ in section_spans(doc.text)}
        prev_ws = "\n"
        for tok in doc:
            if tok.i == 0:
                prev_ws = tok.whitespace_
                continue
            if tok.idx in starts or "\n\n" in prev_ws or (_LIST_ITEM.match(tok.text) and "\n" in prev_ws):
                tok.is_sent_start = True
            # whitespace before the next token: a newline token's text, else this token's trailing space
            prev_ws = tok.text if tok.is_space else tok.whitespace_
        return doc


def _plural_variants(term: str) -> set[str]:
    """The term plus the plural/singular of its last word (``nodule`` <-> ``nodules``)."""
    words = term.split(" ")
    last = words[-1]
    out = {term}
    if not last.isalpha() or len(last) <= 3:
        return out
    if last.endswith(("sis", "ous", "ia", "um")):
        return out
    if last.endswith("ies"):
        alt = last[:-3] + "y"
    elif last.endswith(("sses", "xes")):
        alt = last[:-2]
    elif last.endswith("ss"):
        alt = last + "es"
    elif last.endswith("s"):
        alt = last[:-1]
    elif last.endswith("y") and last[-2] not in "aeiou":
        alt = last[:-1] + "ies"
    else:
        alt = last + "s"
    out.add(" ".join(words[:-1] + [alt]))
    return out


@dataclass(frozen=True)
class _FamilyIndex:
    matcher: TargetMatcher
    candidates: dict[str, tuple[str, ...]]
    #: descriptor surface -> ((concept id, anatomy pattern), ...) for the family's concepts
    compose: dict[str, tuple[tuple[str, re.Pattern[str]], ...]]


@dataclass(frozen=True)
class _DescriptorRules:
    max_distance: int
    clause_breaks: frozenset[str]
    compose: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]  # (concept, anatomy phrases, descriptors)
    refine: dict[str, tuple[tuple[str, re.Pattern[str]], ...]]  # from id -> ((concept, descriptor pattern), ...)


def _phrase_regex(phrases: Iterable[str]) -> re.Pattern[str]:
    """Case-insensitive whole-word alternation of the phrases and their plural/singular variants."""
    variants = {v for p in phrases for v in _plural_variants(" ".join(p.lower().split()))}
    return re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(v) for v in sorted(variants, key=len, reverse=True))
                      + r")(?![\w-])", re.IGNORECASE)


def _load_descriptor_rules(path: Path | None) -> _DescriptorRules:
    if path is None:
        return _DescriptorRules(0, frozenset(), (), {})
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        compose = tuple((r["concept"], tuple(r["anatomy"]), tuple(r["descriptors"])) for r in data.get("compose", ()))
        refine: dict[str, list] = {}
        for r in data.get("refine", ()):
            for src in r["from"]:
                refine.setdefault(src, []).append((r["concept"], _phrase_regex(r["descriptors"])))
        return _DescriptorRules(int(data["max_distance"]), frozenset(t.lower() for t in data.get("clause_breaks", ())),
                                compose, {k: tuple(v) for k, v in refine.items()})
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ExtractorConfigError("invalid_descriptor_rules", f"{path.name}: {exc}") from exc


class EntityExtractor:
    """Rule-based extractor of MedReCo ontology mentions with assertion, temporality and change.

    Build once (about a second: tokenizer, four target matchers, ConText) and reuse for every report.

    Parameters
    ----------
    ontology : Ontology, optional
        Vocabulary (default :func:`schemas.ontology.load_ontology`). Target phrases are
        ``concept.synonyms[language]`` plus the plural/singular of their last word.
    language : str, default "en"
        Report language: selects synonyms; the ConText rules file must be in the same language.
    context_rules_path : str or Path, optional
        ConText rules JSON (default: the packaged English ``context_rules.json``); required for a
        language other than English.
    descriptor_rules_path : str or Path, optional
        Anatomy + descriptor rules JSON (default for English: ``descriptor_rules_en.json``; none for
        another language unless given). A descriptor word ("tortuous", "enlarged") names a concept only
        when one of its rule's anatomy phrases stands in the same clause within ``max_distance`` tokens
        (nearest anatomy wins); ``refine`` rules turn a mention into a more specific concept when a
        descriptor is near (``old healed rib fractures`` -> healing changes).

    Raises
    ------
    ExtractorConfigError
        ``unsupported_language`` (no synonyms, or no ConText rules, for ``language``);
        ``invalid_context_rules``, ``invalid_descriptor_rules`` (malformed rules file). Descriptor rules
        naming concepts the ontology lacks are ignored.
    """

    def __init__(self, ontology: Ontology | None = None, language: str = "en",
                 context_rules_path: str | Path | None = None,
                 descriptor_rules_path: str | Path | None = None) -> None:
        self.ontology = ontology or load_ontology()
        self.language = language
        if language != "en" and context_rules_path is None:
            raise ExtractorConfigError("unsupported_language", f"no ConText rules for language {language!r}")
        if not any(c.synonyms.get(language) for c in self.ontology.concepts.values()):
            raise ExtractorConfigError("unsupported_language", f"ontology has no {language!r} synonyms")
        nlp = spacy.blank(language)
        prefixes = [r"\d{1,2}\.(?=[A-Za-z])", *nlp.Defaults.prefixes]
        nlp.tokenizer.prefix_search = compile_prefix_regex(prefixes).search
        nlp.add_pipe("sentencizer")
        nlp.add_pipe(_SECTION_SENTS)
        self._nlp = nlp
        if descriptor_rules_path is None and language == "en":
            descriptor_rules_path = DESCRIPTOR_RULES_FILE
        self._descriptors = _load_descriptor_rules(Path(descriptor_rules_path) if descriptor_rules_path else None)
        # rules naming concepts this ontology lacks (a custom vocabulary) are left out
        refine = {src: tuple(o for o in opts if o[0] in self.ontology.concepts)
                  for src, opts in self._descriptors.refine.items() if src in self.ontology.concepts}
        self._descriptors = _DescriptorRules(
            self._descriptors.max_distance, self._descriptors.clause_breaks,
            tuple(r for r in self._descriptors.compose if r[0] in self.ontology.concepts),
            {k: v for k, v in refine.items() if v})
        self._families = {f: self._build_family(nlp, f) for f in FAMILIES if f in self.ontology.families}
        self._context = self._build_context(nlp, Path(context_rules_path or CONTEXT_RULES_FILE))
        anatomy = [c for c in self.ontology.concepts.values() if c.category == "anatomy"]
        self._anatomy_re = {
            c.id: re.compile(
                r"\b(?:" + "|".join(re.escape(s) for s in sorted(c.synonyms.get(language, ()), key=len, reverse=True))
                + r")\b",
                re.IGNORECASE,
            )
            for c in anatomy
            if c.synonyms.get(language)
        }

    def _build_family(self, nlp: Language, family: str) -> _FamilyIndex:
        surface: dict[str, list[str]] = {}
        for concept in self.ontology.family_concepts(family):
            for syn in concept.synonyms.get(self.language, ()):
                for variant in _plural_variants(" ".join(syn.lower().split())):
                    ids = surface.setdefault(variant, [])
                    if concept.id not in ids:
                        ids.append(concept.id)
        fam_ids = set(self.ontology.families[family]["finding"]) | set(self.ontology.families[family]["condition"])
        compose: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
        for concept_id, anatomy, descriptors in self._descriptors.compose:
            if concept_id not in fam_ids:
                continue
            pattern = _phrase_regex(anatomy)
            for desc in descriptors:
                for variant in _plural_variants(" ".join(desc.lower().split())):
                    if variant not in surface:  # an ontology synonym outranks a descriptor
                        compose.setdefault(variant, []).append((concept_id, pattern))
        matcher = TargetMatcher(nlp, name=f"targets_{family}", result_type="ents", prune=True)
        rules = [
            TargetRule(literal=term, category=ids[0], metadata={"candidates": tuple(ids)})
            for term, ids in sorted(surface.items())
        ] + [TargetRule(literal=term, category=_DESCRIPTOR, metadata={"descriptor": term}) for term in sorted(compose)]
        matcher.add(rules)
        return _FamilyIndex(matcher, {t: tuple(i) for t, i in surface.items()},
                            {t: tuple(v) for t, v in compose.items()})

    @staticmethod
    def _build_context(nlp: Language, path: Path) -> ConText:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            terminated_by = {k.upper(): {v.upper() for v in vals} for k, vals in data.get("terminated_by", {}).items()}
            rules = []
            for r in data["rules"]:
                category = r["category"].upper()
                metadata = {k: r[k] for k in ("value", "change") if k in r}
                rules.append(
                    ConTextRule(
                        literal=r["literal"],
                        category=category,
                        pattern=r.get("pattern"),
                        direction=r.get("direction", "BIDIRECTIONAL"),
                        max_scope=r.get("max_scope"),
                        terminated_by=set(terminated_by.get(category, ())),
                        metadata=metadata or None,
                    )
                )
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ExtractorConfigError("invalid_context_rules", f"{path.name}: {exc}") from exc
        context = ConText(nlp, name="medreco_context", rules=None, span_attrs=None,
                          prune_on_modifier_overlap=True, prune_on_target_overlap=False)
        context.add(rules)
        return context

    # ------------------------------------------------------------------ extraction
    def _family(self, family: str) -> _FamilyIndex:
        try:
            return self._families[family]
        except KeyError:
            raise ExtractorConfigError("unknown_family", f"family {family!r} not in {tuple(self._families)}") from None

    def _resolve_id(self, ent: Span, candidates: tuple[str, ...]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        sentence = ent.sent.text
        for cid in candidates:
            anatomy_id = self.ontology.concepts[cid].anatomy_id
            pattern = self._anatomy_re.get(anatomy_id or "")
            if pattern is not None and pattern.search(sentence):
                return cid
        return candidates[0]

    def _clause_window(self, ent: Span) -> Span:
        """Tokens around ``ent`` within ``max_distance``, its sentence, and no clause break."""
        sent, dist, breaks = ent.sent, self._descriptors.max_distance, self._descriptors.clause_breaks
        doc = ent.doc
        start = ent.start
        while start > max(sent.start, ent.start - dist) and doc[start - 1].lower_ not in breaks:
            start -= 1
        end = ent.end
        while end < min(sent.end, ent.end + dist) and doc[end].lower_ not in breaks:
            end += 1
        return doc[start:end]

    def _compose_id(self, ent: Span, options: tuple[tuple[str, re.Pattern[str]], ...]) -> str | None:
        """Concept of a descriptor mention: the rule whose anatomy phrase is nearest in the clause window."""
        window = self._clause_window(ent)
        text, base = window.text, window.start_char
        best: tuple[int, str] | None = None
        for concept_id, pattern in options:
            for m in pattern.finditer(text):
                s, e = base + m.start(), base + m.end()
                if s < ent.end_char and e > ent.start_char:
                    continue  # the descriptor itself
                gap = ent.start_char - e if e <= ent.start_char else s - ent.end_char
                if best is None or gap < best[0]:
                    best = (gap, concept_id)
        return best[1] if best else None

    def _refine_id(self, ent: Span, entity_id: str) -> str:
        options = self._descriptors.refine.get(entity_id)
        if not options:
            return entity_id
        window = self._clause_window(ent).text
        for concept_id, pattern in options:
            if pattern.search(window):
                return concept_id
        return entity_id

    @staticmethod
    def _closest(ent: Span, mods: list) -> object | None:
        if not mods:
            return None

        def distance(mod) -> int:
            start, end = mod.modifier_span
            return start - ent.end if start >= ent.end else ent.start - end

        return min(mods, key=distance)

    def _mention(self, ent: Span, spans: list[tuple[str, int, int]], bodies: list[tuple[str, int, int]],
                 index: _FamilyIndex) -> dict | None:
        """One mention dict (None for a descriptor without anatomy); ``spans``/``bodies``: section spans
        with/without their headers."""
        rule = ent._.target_rule
        meta = (rule.metadata or {}) if rule else {}
        if ent.label_ == _DESCRIPTOR:
            entity_id = self._compose_id(ent, index.compose.get(meta.get("descriptor", ""), ()))
            if entity_id is None:
                return None
        else:
            candidates = tuple(meta.get("candidates", (ent.label_,)))
            entity_id = self._refine_id(ent, self._resolve_id(ent, candidates))
        concept = self.ontology.concepts[entity_id]
        by_cat: dict[str, list] = {}
        for mod in ent._.modifiers:
            by_cat.setdefault(mod.category, []).append(mod)
        negated = by_cat.get("NEGATED_EXISTENCE", [])
        if by_cat.get("POSSIBLE_EXISTENCE"):
            assertion = "uncertain"
        elif negated:
            assertion = "absent"
        else:
            assertion = "present"
        if by_cat.get("HYPOTHETICAL"):
            temporality = "hypothetical"
        elif by_cat.get("HISTORICAL"):
            temporality = "historical"
        else:
            temporality = "current"
        change = "none"
        closest_change = self._closest(ent, by_cat.get("CHANGE", []))
        if closest_change is not None:
            change = closest_change.rule.metadata["value"]
        resolved = [m for m in negated if (m.rule.metadata or {}).get("change") == "resolved"]
        if resolved and assertion == "absent":
            change = "resolved"
        lat = self._closest(ent, by_cat.get("LATERALITY", []))
        sev = self._closest(ent, by_cat.get("SEVERITY", []))
        if concept.category == "anatomy":
            anatomy_id: str | None = concept.id
        else:
            anatomy_id = concept.anatomy_id
        return {
            "entity_id": entity_id,
            "category": concept.category,
            "span_start": ent.start_char,
            "span_end": ent.end_char,
            "text": ent.text,
            "section": section_at(spans, ent.start_char),
            "sentence": self._sentence_text(ent, bodies),
            "assertion": assertion,
            "temporality": temporality,
            "change": change,
            "laterality": lat.rule.metadata["value"] if lat is not None else None,
            "severity": sev.rule.metadata["value"] if sev is not None else None,
            "anatomy_id": anatomy_id,
        }

    @staticmethod
    def _sentence_text(ent: Span, spans: list[tuple[str, int, int]]) -> str:
        """The sentence of ``ent`` without a section header that starts it (``"IMPRESSION: ..."``)."""
        sent = ent.sent
        start = sent.start_char
        for _, body_start, _ in spans:
            if start < body_start <= ent.start_char:
                start = body_start
        return ent.doc.text[start:sent.end_char].strip()

    def _run(self, doc: Doc, family: str) -> list[dict]:
        index = self._family(family)
        with warnings.catch_warnings():
            # medspaCy matchers built from phrase rules only hold an empty token Matcher: spaCy W036 each call
            warnings.filterwarnings("ignore", message=r"\[W036\]")
            doc = index.matcher(doc)
            doc = self._context(doc)
        spans, bodies = section_spans(doc.text), section_body_spans(doc.text)
        mentions = (self._mention(ent, spans, bodies, index) for ent in doc.ents)
        return [m for m in mentions if m is not None]

    def extract(self, text: str, family: str) -> list[dict]:
        """Mentions of the family's ontology concepts in one report.

        Parameters
        ----------
        text : str
            De-identified report text.
        family : str
            Modality family (``2D-CXR``, ``3D-CT``, ``3D-Brain-MRI``, ``2D-Ultrasound``); only its concepts
            are matched.

        Returns
        -------
        list of dict
            One dict per mention, in text order: ``entity_id`` (``F029``), ``category``
            (anatomy|finding|condition), ``span_start``/``span_end`` (character offsets in ``text``),
            ``text``, ``section`` (see :func:`entity_extraction.sections.section_spans`), ``sentence``,
            ``assertion`` (present|absent|uncertain), ``temporality`` (current|historical|hypothetical),
            ``change`` (new|increased|decreased|unchanged|resolved|improved|worsened|none), ``laterality``
            (left|right|bilateral|None), ``severity`` (mild|moderate|severe|small|large|trace|None),
            ``anatomy_id`` (the anatomy concept a finding lies in; the concept itself for anatomy;
            None for conditions). A synonym shared by several concepts of the family resolves to the
            concept whose anatomy is named in the sentence, else the first in ontology order.

        Raises
        ------
        ExtractorConfigError
            ``unknown_family``.
        """
        self._family(family)
        return self._run(self._nlp(text), family)

    def extract_many(self, texts: Iterable[str], family: str, batch_size: int = 64) -> list[list[dict]]:
        """:meth:`extract` over many reports of one family (``nlp.pipe`` batching); one list per text."""
        self._family(family)
        return [self._run(doc, family) for doc in self._nlp.pipe(texts, batch_size=batch_size)]


_STATE_RANK = {"present": 3, "uncertain": 2, "absent": 1}


def study_labels(mentions: list[dict], family: str, ontology: Ontology | None = None) -> list[dict]:
    """Per-study entity states from a report's mentions (targets for entity-conditioned retrieval).

    Parameters
    ----------
    mentions : list of dict
        Output of :meth:`EntityExtractor.extract` for one report.
    family : str
        Modality family of the study; one row per concept of the family.
    ontology : Ontology, optional
        Default :func:`schemas.ontology.load_ontology`.

    Returns
    -------
    list of dict
        ``{entity_id, state, change}`` per family concept in ontology order. Only current or historical
        mentions in IMPRESSION, FINDINGS or unsectioned text count (indication/comparison/technique
        describe the request or the prior; hypothetical mentions assert nothing). If the IMPRESSION
        mentions the entity, only IMPRESSION mentions decide; otherwise FINDINGS and unsectioned text.
        Within the deciding group present beats uncertain beats absent. ``change`` is the first stated
        change (text order) among mentions with the winning state, ``resolved`` when an absent state
        comes from a resolution, ``none`` otherwise. Unmentioned concepts: ``not_mentioned``/``none``.

    Raises
    ------
    ExtractorConfigError
        ``unknown_family``.
    """
    onto = ontology or load_ontology()
    if family not in onto.families:
        raise ExtractorConfigError("unknown_family", f"family {family!r} not in {tuple(onto.families)}")
    by_entity: dict[str, list[dict]] = {}
    for m in sorted(mentions, key=lambda m: m["span_start"]):
        if m["temporality"] == "hypothetical":
            continue
        by_entity.setdefault(m["entity_id"], []).append(m)
    rows = []
    for concept in onto.family_concepts(family):
        state, change = "not_mentioned", "none"
        found = by_entity.get(concept.id, [])
        for group in LABEL_SECTIONS:
            deciding = [m for m in found if m["section"] in group]
            if not deciding:
                continue
            state = max((m["assertion"] for m in deciding), key=_STATE_RANK.__getitem__)
            winners = [m for m in deciding if m["assertion"] == state]
            stated = [m["change"] for m in winners if m["change"] != "none"]
            change = stated[0] if stated else "none"
            break
        rows.append({"entity_id": concept.id, "state": state, "change": change})
    return rows
