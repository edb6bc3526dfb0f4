"""Ontology entity extraction from radiology reports with medspaCy (TargetMatcher + ConText).

Pipeline (built once per :class:`EntityExtractor`): a blank spaCy tokenizer (plus a prefix rule that
splits glued list numbers, ``"1.No"`` -> ``"1."``, ``"No"``), spaCy's rule-based ``sentencizer``
(PyRuSH is about 10x slower), a component that also starts a sentence at every section header and
numbered list item, one medspaCy ``TargetMatcher`` per modality family whose rules are the ontology
synonyms, and one medspaCy ``ConText`` (Harkema H. et al., J Biomed Inform 2009;42(5):839-851) with
our own rule set (``context_rules.json``): negation, uncertainty (a high-likelihood hedge such as "probable"
asserts), history, hypothetical, and the custom categories CHANGE, LATERALITY, SEVERITY, CLAUSE_BREAK.
medspaCy's default rules are *not* used: its ``": no"`` rule outranks ``"no"`` so
``"FINDINGS: No pleural effusion"`` would not be negated.
scispaCy's AbbreviationDetector (Schwartz & Hearst 2003) runs on reports with a parenthesised group: a short
form defined in the text ("airspace disease (ASD)") is a target wherever it is used later.

Languages are data: ``synonyms_<lang>.json``, ``context_rules_<lang>.json`` and optionally
``section_rules_<lang>.json`` / ``descriptor_rules_<lang>.json`` on the language search path
(:func:`schemas.ontology.language_search_path`; English is packaged).

Speed (``benchmarks/bench_reports.py``): ConText rules are phrase rules only (a spaCy token pattern makes the
Matcher build a Python token per document token), target spans go into ``doc.ents`` in one assignment, and
sentences and ``Doc.text`` are read once per document, not per mention.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import spacy
from loguru import logger
from spacy.attrs import IDX, IS_SPACE, ORTH
from spacy.language import Language
from spacy.pipeline import Sentencizer
from spacy.tokens import Doc, Span
from spacy.util import compile_prefix_regex

from entity_extraction.sections import historical_spans, section_at, section_body_spans, section_spans
from schemas.errors import ReasonCodedError
from schemas.ontology import (
    FAMILIES,
    Ontology,
    OntologyError,
    find_language_file,
    language_search_path,
    load_ontology,
)

logger.disable("PyRuSH")  # PyRuSH logs every token at DEBUG when medspaCy imports it

from medspacy.context import ConText, ConTextRule  # noqa: E402
from medspacy.target_matcher import TargetMatcher, TargetRule  # noqa: E402
from scispacy.abbreviation import AbbreviationDetector  # noqa: E402

from entity_extraction.sentence_context import SentenceScopedConText  # noqa: E402
from entity_extraction.trigger_lexicons import load_field_lexicons, merge_rules  # noqa: E402

#: packaged language files: ``context_rules_<lang>.json`` (required), ``section_rules_<lang>.json`` and
#: ``descriptor_rules_<lang>.json`` (optional); other folders come first on the search path
#: (:func:`schemas.ontology.language_search_path`).
RULES_DIR = Path(__file__).parent
CONTEXT_RULES_FILE = RULES_DIR / "context_rules_en.json"
#: anatomy + descriptor rules (English); see the file's description and :class:`EntityExtractor`.
DESCRIPTOR_RULES_FILE = RULES_DIR / "descriptor_rules_en.json"
_DESCRIPTOR = "DESCRIPTOR"
ASSERTIONS = ("present", "absent", "uncertain")
TEMPORALITIES = ("current", "historical", "hypothetical")
CHANGES = ("new", "increased", "decreased", "unchanged", "resolved", "improved", "worsened", "none")
LATERALITIES = ("left", "right", "bilateral")
SEVERITIES = ("mild", "moderate", "severe", "small", "large", "trace")
#: sections whose mentions describe the current study (used by :func:`study_labels`), by priority group.
LABEL_SECTIONS = (("impression",), ("findings", "unsectioned"))
#: a parenthesised group that may define an abbreviation ("right lower lobe (RLL)", "RLL (right lower lobe)"):
#: scispaCy's AbbreviationDetector only runs on texts that have one.
_PARENTHESISED = re.compile(r"\([^()\n]*[A-Za-z][^()\n]*\)")
_LIST_ITEM = re.compile(r"^(?:\d{1,2}[.)]|[-*\u2022])$")
_SECTION_SENTS = "medreco_section_sentences"
#: a soft line wrap: a line break (not a blank line) before a line that goes on in lower case ("no pericardial
#: \neffusion"); it becomes a space before tokenizing, so phrases run across it (same length: offsets hold).
_SOFT_WRAP = re.compile(r"(?<=[^\s])[ \t]*\n(?=[ \t]*[a-z])")


def _unwrap(text: str) -> str:
    """``text`` with soft line wraps as spaces (character offsets unchanged)."""
    if "\n" not in text:
        return text
    return _SOFT_WRAP.sub(lambda m: " " * len(m.group()), text)


class ExtractorConfigError(ReasonCodedError, ValueError):
    """The extractor cannot be built (``reason``: ``unknown_family``, ``unsupported_language``,
    ``invalid_context_rules``)."""


#: ``Doc.user_data`` key of the document text, stored by :func:`_section_sentences`
_TEXT_KEY = "medreco_text"


def _section_sentences(doc: Doc, rules_path: str | None = None) -> Doc:
    """Start a sentence at every section header, blank line and numbered/bulleted list item; a question mark followed
    by a lower-case word ("opacity, ? pneumonia") does not end one (the uncertainty rule "?" then reaches the word).

    Only the few candidate tokens are visited: header starts (bisected in the token offsets) and the
    tokens after whitespace tokens holding a newline (spaCy keeps at most one trailing space on a token,
    so a line break always stands in a whitespace token of its own).
    """
    n = len(doc)
    if n < 2:
        return doc
    arr = doc.to_array([IDX, IS_SPACE])
    idx = arr[:, 0].tolist()
    starts = set()
    text = doc.user_data[_TEXT_KEY] = doc.text  # Doc.text joins every token: read once, kept for _Sentences
    for _, start, _ in section_spans(text, rules_path):
        i = bisect_left(idx, start)
        if 0 < i < n and idx[i] == start:
            starts.add(i)
    for k in arr[1:-1, 1].nonzero()[0].tolist():  # whitespace tokens after the first and before the last
        ws = doc[k + 1].text
        if "\n" in ws and ("\n\n" in ws or _LIST_ITEM.match(doc[k + 2].text)):
            starts.add(k + 2)
    for i in starts:
        doc[i].is_sent_start = True
    at = text.find("?")
    while at >= 0:  # "opacity, ? pneumonia": a question mark before a lower-case word is a hedge, not a sentence end
        i = bisect_left(idx, at)
        if i + 1 < n and idx[i] == at and doc[i + 1].text[:1].islower() and i + 1 not in starts:
            doc[i + 1].is_sent_start = False
        at = text.find("?", at + 1)
    return doc


if not Language.has_factory(_SECTION_SENTS):

    @Language.factory(_SECTION_SENTS, default_config={"rules_path": None})
    def _make_section_sentences(nlp, name, rules_path):  # untyped: spaCy validates real annotations only
        """Pipeline factory of :func:`_section_sentences` with the report language's section rules."""
        return functools.partial(_section_sentences, rules_path=rules_path)


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


def _set_ents(doc: Doc, spans: list[Span]) -> None:
    """Add the matcher's spans to ``doc.ents`` in one assignment, skipping any span that overlaps an entity
    already kept (what medspaCy's TargetMatcher does span by span, with ``doc.ents += (span,)``, which
    rebuilds the entity tuple from every token at each span)."""
    taken = bytearray(len(doc))
    kept = list(doc.ents)
    for ent in kept:
        taken[ent.start : ent.end] = b"\x01" * (ent.end - ent.start)
    for span in spans:
        if any(taken[span.start : span.end]):
            warnings.warn(
                f'The result ""{span}"" conflicts with a pre-existing entity in doc.ents. This result has '
                "been skipped.",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        taken[span.start : span.end] = b"\x01" * (span.end - span.start)
        kept.append(span)
    doc.ents = kept


class _Sentences:
    """Sentence lookup for one doc: ``of(span)`` equals ``span.sent`` (spaCy walks the tokens from the span
    to the sentence boundaries at every call; this bisects boundaries read once)."""

    def __init__(self, doc: Doc) -> None:
        self.doc = doc
        # Doc.text joins every token: read once (by the section-sentence component when it ran)
        self.text = doc.user_data.get(_TEXT_KEY) or doc.text
        starts = doc.to_array("SENT_START").tolist() if len(doc) else []
        self.starts = [0] + [i for i, v in enumerate(starts) if v == 1 and i > 0]

    def of(self, span: Span) -> Span:
        starts = self.starts
        i = bisect_right(starts, span.start)  # as spaCy: the sentence of the span's first token
        end = starts[i] if i < len(starts) else len(self.doc)
        start = starts[i - 1]
        return self.doc[start:end]


@dataclass(frozen=True)
class _FamilyIndex:
    matcher: TargetMatcher
    candidates: dict[str, tuple[str, ...]]
    #: descriptor surface -> ((concept id, anatomy pattern, normal statement?), ...) for the family's concepts
    compose: dict[str, tuple[tuple[str, re.Pattern[str], bool], ...]]
    #: descriptor surface -> (the family's concepts a negation without a site makes absent, site pattern)
    any_site: dict[str, tuple[tuple[str, ...], re.Pattern[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class _DescriptorRules:
    max_distance: int
    clause_breaks: frozenset[str]
    #: (concept, anatomy phrases, descriptors, normal statement: the descriptor says the anatomy is normal, so the
    #: concept is absent)
    compose: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...]
    refine: dict[str, tuple[tuple[str, re.Pattern[str]], ...]]  # from id -> ((concept, descriptor pattern), ...)
    #: (concepts, descriptors, other site words and ``not_with`` words): a descriptor negated with none of them nor
    #: an anatomy phrase of the concepts' compose rules in its sentence names every concept absent
    any_site: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = ()


def _same_term(term: str) -> set[str]:
    """No inflection rule (languages other than English list their inflected forms as synonyms)."""
    return {term}


def _phrase_regex(phrases: Iterable[str], variants_of=_plural_variants) -> re.Pattern[str]:
    """Case-insensitive whole-word alternation of the phrases and their ``variants_of`` (plural/singular)."""
    variants = {v for p in phrases for v in variants_of(" ".join(p.lower().split()))}
    return re.compile(
        r"(?<![\w-])(?:" + "|".join(re.escape(v) for v in sorted(variants, key=len, reverse=True)) + r")(?![\w-])",
        re.IGNORECASE,
    )


@dataclass(frozen=True)
class _LexicalVariants:
    """``lexical_variants_<lang>.json``: extra target phrases per concept, and spelling/hyphenation variants of
    every target phrase of ``families``."""

    families: frozenset[str] = frozenset()
    spelling: dict[str, str] | None = None
    hyphenation: tuple[tuple[str, str], ...] = ()
    concepts: dict[str, tuple[str, ...]] | None = None

    def phrases(self, concept_id: str, synonyms: Iterable[str], family: str) -> list[str]:
        """The concept's target phrases: its synonyms, its variants, and (in ``families``) their spelling and
        hyphenation variants (lower case, single-spaced)."""
        out = [" ".join(p.lower().split()) for p in (*synonyms, *((self.concepts or {}).get(concept_id, ())))]
        if family not in self.families:
            return out
        spelled = []
        for phrase in out:
            words = phrase.split(" ")
            spelled.append(" ".join((self.spelling or {}).get(w, w) for w in words))
        out += spelled
        for a, b in self.hyphenation:
            forms = (f"{a} {b}", f"{a}-{b}", f"{a}{b}")
            out += [phrase.replace(f, g) for phrase in list(out) for f in forms if f in phrase for g in forms if g != f]
        return list(dict.fromkeys(out))


def _load_lexical_variants(path: Path | None) -> _LexicalVariants:
    if path is None:
        return _LexicalVariants()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        spelling = {}
        for a, b in data.get("spelling", ()):
            spelling[a.lower()], spelling[b.lower()] = b.lower(), a.lower()
        return _LexicalVariants(
            frozenset(data.get("families", ())),
            spelling,
            tuple((a.lower(), b.lower()) for a, b in data.get("hyphenation", ())),
            {cid: tuple(e["variants"]) for cid, e in data.get("concepts", {}).items()},
        )
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ExtractorConfigError("invalid_lexical_variants", f"{path.name}: {exc}") from exc


def _load_descriptor_rules(path: Path | None, variants_of=_plural_variants) -> _DescriptorRules:
    if path is None:
        return _DescriptorRules(0, frozenset(), (), {})
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        compose = tuple(
            (r["concept"], tuple(r["anatomy"]), tuple(r["descriptors"]), bool(r.get("normal", False)))
            for r in data.get("compose", ())
        )
        refine: dict[str, list] = {}
        for r in data.get("refine", ()):
            for src in r["from"]:
                refine.setdefault(src, []).append((r["concept"], _phrase_regex(r["descriptors"], variants_of)))
        any_site = tuple(
            (
                tuple(r["concepts"]),
                tuple(r["descriptors"]),
                tuple(r.get("other_sites", ())) + tuple(r.get("not_with", ())),
            )
            for r in data.get("any_site", ())
        )
        return _DescriptorRules(
            int(data["max_distance"]),
            frozenset(t.lower() for t in data.get("clause_breaks", ())),
            compose,
            {k: tuple(v) for k, v in refine.items()},
            any_site,
        )
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ExtractorConfigError("invalid_descriptor_rules", f"{path.name}: {exc}") from exc


class EntityExtractor:
    """Rule-based extractor of MedReCo ontology mentions with assertion, temporality and change.

    Build once (about a second: tokenizer, four target matchers, ConText) and reuse for every report.

    Parameters
    ----------
    ontology : Ontology, optional
        Vocabulary (default :func:`schemas.ontology.load_ontology` over ``search_path``). Target phrases are
        ``concept.synonyms[language]``, for English plus the plural/singular of their last word (another
        language lists its inflected forms as synonyms).
    language : str, default "en"
        Report language (a code such as ``de``): selects synonyms and the language files below. Adding a
        language is data only: ``synonyms_<lang>.json`` and ``context_rules_<lang>.json`` (plus, optionally,
        ``section_rules_<lang>.json`` and ``descriptor_rules_<lang>.json``) in one folder of the search path.
        spaCy's tokenizer for the language is used when spaCy has one, else its multi-language ``xx``.
    context_rules_path : str or Path, optional
        ConText rules JSON (default: ``context_rules_<language>.json`` on the search path; English is
        packaged).
    descriptor_rules_path : str or Path, optional
        Anatomy + descriptor rules JSON (default: ``descriptor_rules_<language>.json`` on the search path,
        none if absent; English is packaged). A descriptor word ("tortuous", "enlarged") names a concept only
        when one of its rule's anatomy phrases stands in the same clause within ``max_distance`` tokens
        (nearest anatomy wins); ``refine`` rules turn a mention into a more specific concept when a
        descriptor is near (``old healed rib fractures`` -> healing changes); a rule with ``"normal": true``
        is a normal statement ("heart size is normal"): its concept is absent in any word order.
    Lexical variants: ``lexical_variants_<language>.json`` on the search path (optional; English is packaged: the
        brain MRI and ultrasound vocabulary reviewed against RadLex) adds target phrases per concept and spelling
        ("haemorrhage") and hyphenation ("gall bladder") variants of every target phrase of its families.
    section_rules_path : str or Path, optional
        Section header rules (default: ``section_rules_<language>.json`` on the search path, else the
        English ones).
    search_path : path or sequence of paths, optional
        Folders searched first for language files, before ``MEDRECO_LEXICON_PATH`` and the packaged ones
        (:func:`schemas.ontology.language_search_path`).

    Raises
    ------
    ExtractorConfigError
        ``unsupported_language`` (no synonyms, or no ConText rules, for ``language``; or not a language code);
        ``invalid_context_rules``, ``invalid_descriptor_rules``, ``invalid_lexical_variants`` (malformed rules
        file). Descriptor rules naming concepts the ontology lacks are ignored.
    """

    def __init__(
        self,
        ontology: Ontology | None = None,
        language: str = "en",
        context_rules_path: str | Path | None = None,
        descriptor_rules_path: str | Path | None = None,
        section_rules_path: str | Path | None = None,
        search_path: str | Path | list | tuple | None = None,
    ) -> None:
        dirs = language_search_path(search_path, packaged=RULES_DIR)
        try:
            context_rules_path = context_rules_path or find_language_file("context_rules", language, dirs)
        except OntologyError as exc:
            raise ExtractorConfigError("unsupported_language", str(exc)) from None
        if context_rules_path is None:
            raise ExtractorConfigError(
                "unsupported_language", f"no context_rules_{language}.json in " + ", ".join(map(str, dirs))
            )
        self.ontology = ontology or load_ontology(search_path=search_path)
        self.language = language
        if not any(c.synonyms.get(language) for c in self.ontology.concepts.values()):
            raise ExtractorConfigError("unsupported_language", f"ontology has no {language!r} synonyms")
        section_rules = section_rules_path or find_language_file("section_rules", language, dirs)
        #: section rules file for :func:`entity_extraction.sections.section_spans` (None: the English default)
        self.section_rules_path = str(section_rules) if section_rules else None
        try:
            nlp = spacy.blank(language)
        except ImportError:  # no spaCy language class: multi-language tokenizer
            nlp = spacy.blank("xx")
        # abbreviations with dots ("V.a.", "Z.n.", "izq.") stay one token, so their dot ends no sentence
        abbreviations = find_language_file("tokenizer_exceptions", language, dirs)
        if abbreviations is not None:
            for form in json.loads(abbreviations.read_text(encoding="utf-8"))["abbreviations"]:
                for variant in {form, form.lower(), form.capitalize(), form.upper()}:
                    nlp.tokenizer.add_special_case(variant, [{ORTH: variant}])
        prefixes = [r"\d{1,2}\.(?=[A-Za-z])", *nlp.Defaults.prefixes]
        nlp.tokenizer.prefix_search = compile_prefix_regex(prefixes).search
        # ".." and "..." end a sentence too ("... or pleural effusion.. Right basilar granuloma"): spaCy keeps them
        # as one token, which the sentencizer's default punctuation set does not hold
        nlp.add_pipe("sentencizer", config={"punct_chars": [*Sentencizer.default_punct_chars, "..", "..."]})
        nlp.add_pipe(_SECTION_SENTS, config={"rules_path": self.section_rules_path})
        self._nlp = nlp
        self._variants = _plural_variants if language == "en" else _same_term
        descriptor_rules_path = descriptor_rules_path or find_language_file("descriptor_rules", language, dirs)
        self._descriptors = _load_descriptor_rules(
            Path(descriptor_rules_path) if descriptor_rules_path else None, self._variants
        )
        # rules naming concepts this ontology lacks (a custom vocabulary) are left out
        refine = {
            src: tuple(o for o in opts if o[0] in self.ontology.concepts)
            for src, opts in self._descriptors.refine.items()
            if src in self.ontology.concepts
        }
        self._descriptors = _DescriptorRules(
            self._descriptors.max_distance,
            self._descriptors.clause_breaks,
            tuple(r for r in self._descriptors.compose if r[0] in self.ontology.concepts),
            {k: v for k, v in refine.items() if v},
            self._descriptors.any_site,
        )
        self._lexical = _load_lexical_variants(find_language_file("lexical_variants", language, dirs))
        self._families = {f: self._build_family(nlp, f) for f in FAMILIES if f in self.ontology.families}
        self._abbreviations = AbbreviationDetector(nlp)
        self._context = self._build_context(nlp, Path(context_rules_path))
        anatomy = [c for c in self.ontology.concepts.values() if c.category == "anatomy"]
        self._anatomy_re = {
            c.id: re.compile(
                r"\b(?:"
                + "|".join(re.escape(s) for s in sorted(c.synonyms.get(language, ()), key=len, reverse=True))
                + r")\b",
                re.IGNORECASE,
            )
            for c in anatomy
            if c.synonyms.get(language)
        }

    def _build_family(self, nlp: Language, family: str) -> _FamilyIndex:
        surface: dict[str, list[str]] = {}
        for concept in self.ontology.family_concepts(family):
            for syn in self._lexical.phrases(concept.id, concept.synonyms.get(self.language, ()), family):
                for variant in self._variants(syn):
                    ids = surface.setdefault(variant, [])
                    if concept.id not in ids:
                        ids.append(concept.id)
        fam_ids = set(self.ontology.families[family]["finding"]) | set(self.ontology.families[family]["condition"])
        compose: dict[str, list[tuple[str, re.Pattern[str], bool]]] = {}
        for concept_id, anatomy, descriptors, normal in self._descriptors.compose:
            if concept_id not in fam_ids:
                continue
            pattern = _phrase_regex(anatomy, self._variants)
            for desc in descriptors:
                for variant in self._variants(" ".join(desc.lower().split())):
                    if variant not in surface:  # an ontology synonym outranks a descriptor
                        compose.setdefault(variant, []).append((concept_id, pattern, normal))
        any_site: dict[str, tuple[tuple[str, ...], re.Pattern[str]]] = {}
        for concepts, descriptors, other_sites in self._descriptors.any_site:
            every_site = tuple(c for c in concepts if c in fam_ids)
            if not every_site:
                continue
            # the sites the rule's own concepts are composed with (rib, spine, sternum), and the others
            own = {a for cid, anatomy, _, _ in self._descriptors.compose if cid in concepts for a in anatomy}
            sites = _phrase_regex(sorted(own | set(other_sites)), self._variants)
            for desc in descriptors:
                for variant in self._variants(" ".join(desc.lower().split())):
                    if variant in compose:  # only descriptors the rules above make targets
                        any_site[variant] = (every_site, sites)
        matcher = TargetMatcher(nlp, name=f"targets_{family}", result_type=None, prune=True)
        rules = [
            TargetRule(literal=term, category=ids[0], metadata={"candidates": tuple(ids)})
            for term, ids in sorted(surface.items())
        ] + [TargetRule(literal=term, category=_DESCRIPTOR, metadata={"descriptor": term}) for term in sorted(compose)]
        matcher.add(rules)
        return _FamilyIndex(
            matcher, {t: tuple(i) for t, i in surface.items()}, {t: tuple(v) for t, v in compose.items()}, any_site
        )

    @staticmethod
    def _build_context(nlp: Language, path: Path) -> ConText:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            terminated_by = {k.upper(): {v.upper() for v in vals} for k, vals in data.get("terminated_by", {}).items()}
            data_rules = data["rules"]
            if data.get("field_lexicons"):  # the field's trigger lexicons under our rules (trigger_lexicons.py)
                field, _ = load_field_lexicons(path.parent / data["field_lexicons"])
                data_rules = merge_rules(data_rules, field)
            rules, variants = [], []
            for r in data_rules:
                category = r["category"].upper()
                metadata = {k: r[k] for k in ("value", "change", "assertion", "between_targets") if k in r}
                # phrases x following token: one rule, its phrase variants matched by spaCy's PhraseMatcher
                # (a token pattern would evaluate Python set predicates at every token)
                literals = [f"{p} {f}" for p in r["phrases"] for f in r["followed_by"]] if "phrases" in r else []
                rules.append(
                    ConTextRule(
                        literal=literals[0] if literals else r["literal"],
                        category=category,
                        pattern=r.get("pattern"),
                        direction=r.get("direction", "BIDIRECTIONAL"),
                        max_scope=r.get("max_scope"),
                        terminated_by=set(terminated_by.get(category, ())),
                        metadata=metadata or None,
                    )
                )
                variants.append(literals[1:])
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ExtractorConfigError("invalid_context_rules", f"{path.name}: {exc}") from exc
        context = SentenceScopedConText(
            nlp,
            name="medreco_context",
            rules=None,
            span_attrs=None,
            prune_on_modifier_overlap=True,
            prune_on_target_overlap=False,
            # "No old rib fracture.": "old" names the finding, it does not end the scope of "No"
            ignore_modifiers_in_targets=True,
            keep_modifiers_in_labels=frozenset({_DESCRIPTOR}),  # "large", "borderline": see _own_modifiers
        )
        context.add(rules)
        # The variants join their rule's PhraseMatcher key (the rule id medspaCy gave it), so one data rule stays one
        # ConText rule and the ids of all other rules, hence the order of equal-span matches, do not move.
        phrase_matcher = context._ConText__matcher._MedspacyMatcher__phrase_matcher
        for rule, literals in zip(rules, variants):
            if literals:
                phrase_matcher.add(rule._rule_id, [nlp.make_doc(lit.lower()) for lit in literals])
        return context

    # ------------------------------------------------------------------ extraction
    def _family(self, family: str) -> _FamilyIndex:
        try:
            return self._families[family]
        except KeyError:
            raise ExtractorConfigError("unknown_family", f"family {family!r} not in {tuple(self._families)}") from None

    def _resolve_id(self, ent: Span, sent: Span, candidates: tuple[str, ...]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        sentence = sent.text
        for cid in candidates:
            anatomy_id = self.ontology.concepts[cid].anatomy_id
            pattern = self._anatomy_re.get(anatomy_id or "")
            if pattern is not None and pattern.search(sentence):
                return cid
        return candidates[0]

    def _clause_window(self, ent: Span, sent: Span) -> Span:
        """Tokens around ``ent`` within ``max_distance``, its sentence ``sent``, and no clause break."""
        dist, breaks = self._descriptors.max_distance, self._descriptors.clause_breaks
        doc = ent.doc
        start = ent.start
        while start > max(sent.start, ent.start - dist) and doc[start - 1].lower_ not in breaks:
            start -= 1
        end = ent.end
        while end < min(sent.end, ent.end + dist) and doc[end].lower_ not in breaks:
            end += 1
        return doc[start:end]

    def _compose_id(
        self, ent: Span, sent: Span, options: tuple[tuple[str, re.Pattern[str], bool], ...]
    ) -> tuple[str, bool] | None:
        """Concept of a descriptor mention (the rule whose anatomy phrase is nearest in the clause window, the
        longer phrase at equal distance) and whether the rule is a normal statement.

        An anatomy phrase with no comma between it and the descriptor outranks a nearer one behind a comma: a
        descriptor modifies its own comma-separated phrase ("Heart size moderately enlarged, stable mediastinal
        contours": the heart is enlarged, not the mediastinal nodes); across a comma it still names the anatomy
        when that is the only one ("Enlarged, tortuous aorta")."""
        window = self._clause_window(ent, sent)
        text, base = window.text, window.start_char
        a, b = ent.start_char - base, ent.end_char - base  # the descriptor inside the window's text
        best: tuple[bool, int, int, str, bool] | None = None
        for concept_id, pattern, normal in options:
            for m in pattern.finditer(text):
                s, e = base + m.start(), base + m.end()
                if s < ent.end_char and e > ent.start_char:
                    continue  # the descriptor itself
                gap = ent.start_char - e if e <= ent.start_char else s - ent.end_char
                comma = "," in (text[m.end() : a] if e <= ent.start_char else text[b : m.start()])
                # same phrase first; then nearest; at equal distance the longer phrase ("coronary arteries")
                if best is None or (comma, gap, s - e) < best[:3]:
                    best = (comma, gap, s - e, concept_id, normal)
        return (best[3], best[4]) if best else None

    def _refine_id(self, ent: Span, sent: Span, entity_id: str) -> str:
        options = self._descriptors.refine.get(entity_id)
        if not options:
            return entity_id
        window = self._clause_window(ent, sent).text
        for concept_id, pattern in options:
            if pattern.search(window):
                return concept_id
        return entity_id

    def _add_abbreviations(self, doc: Doc, targets: list[Span]) -> list[Span]:
        """``targets`` plus a target span on every later use of an abbreviation defined in the text.

        scispaCy's AbbreviationDetector (Schwartz A.S., Hearst M.A., "A simple algorithm for identifying
        abbreviation definitions in biomedical text", Pac Symp Biocomput 2003:451-462) pairs a short form with
        its long form ("right lower lobe (RLL)" or "RLL (right lower lobe)") and finds every occurrence of the
        short form. When the long form holds an ontology target (the longest one, else the last), each
        occurrence of the short form outside the definition's parentheses that no target covers becomes a
        target with the same rule. Descriptor targets are not carried over (they need their anatomy nearby).
        """
        doc = self._abbreviations(doc)
        found = doc._.abbreviations
        if not found:
            return targets
        taken = bytearray(len(doc))
        for t in targets:
            taken[t.start : t.end] = b"\x01" * (t.end - t.start)
        added: list[Span] = []
        for short in found:
            long = short._.long_form
            inside = [t for t in targets if long.start <= t.start and t.end <= long.end and t.label_ != _DESCRIPTOR]
            if not inside:
                continue
            source = max(inside, key=lambda t: (t.end - t.start, t.start))
            # the definition itself: only an opening parenthesis (and the head of the parenthesised long
            # form) between the two forms
            between = [t.text for t in doc[min(short.end, long.end) : max(short.start, long.start)]]
            if ("(" in between and ")" not in between) or any(taken[short.start : short.end]):
                continue
            span = Span(doc, short.start, short.end, label=source.label_)
            span._.target_rule = source._.target_rule
            taken[short.start : short.end] = b"\x01" * (short.end - short.start)
            added.append(span)
        return sorted(targets + added, key=lambda t: t.start) if added else targets

    @staticmethod
    def _own_modifiers(doc: Doc) -> None:
        """Give each descriptor target the ConText modifiers that lie wholly inside it: the descriptor is such a
        word itself ("Heart size is borderline": the uncertainty of "borderline"; "mildly enlarged": the severity of
        "mildly"), and medspaCy never lets a modifier modify a target it overlaps (``ConTextModifier.modifies``).
        Scope-ending and pseudo-modifiers modify nothing. The modifiers keep modifying the other targets in their
        scope ("Large effusion": the effusion is large)."""
        graph = getattr(doc._, "context_graph", None)
        if graph is None:
            return
        inside = [m for m in graph.modifiers if m.direction.upper() not in ("TERMINATE", "PSEUDO")]
        for ent in doc.ents:
            if ent.label_ != _DESCRIPTOR:
                continue
            own = tuple(m for m in inside if ent.start <= m.modifier_span[0] and m.modifier_span[1] <= ent.end)
            if own:
                ent._.modifiers += own

    def _between_targets(self, doc: Doc) -> None:
        """Drop each ``between_targets`` modifier ("or") from a target unless another finding target (not an anatomy
        concept; a descriptor counts) lies wholly inside the modifier's scope on the other side of the modifier:
        "atelectasis or pneumonia" hedges both, "trace or small effusion", "5 or 6 mm nodule" and "fifth or sixth rib"
        hedge nothing (the CheXpert labeler's post-negation pattern for "A or B" joins two mentions, conj:or)."""
        ents = doc.ents
        concepts = self.ontology.concepts

        def finding(span: Span) -> bool:
            concept = concepts.get(span.label_)
            return span.label_ == _DESCRIPTOR or (concept is not None and concept.category != "anatomy")

        for ent in ents:
            mods = ent._.modifiers
            if not any((m.rule.metadata or {}).get("between_targets") for m in mods):
                continue
            kept = []
            for m in mods:
                if (m.rule.metadata or {}).get("between_targets"):
                    start, end = m.modifier_span
                    scope_start, scope_end = m.scope_span
                    if ent.start >= end:  # the target follows the modifier: a finding must precede it
                        lo, hi = scope_start, start
                    else:
                        lo, hi = end, scope_end
                    if not any(o is not ent and lo <= o.start and o.end <= hi and finding(o) for o in ents):
                        continue
                kept.append(m)
            ent._.modifiers = tuple(kept)

    @staticmethod
    def _closest(ent: Span, mods: list) -> object | None:
        if not mods:
            return None

        def distance(mod) -> int:
            start, end = mod.modifier_span
            return start - ent.end if start >= ent.end else ent.start - end

        return min(mods, key=distance)

    @staticmethod
    def _hedges(ent: Span, by_cat: dict[str, list], assertion: str) -> tuple[str, ...]:
        """Literals (lower case, sorted, distinct) of the rules that make an ``uncertain`` assertion; () otherwise.

        The uncertainty cues (``POSSIBLE_EXISTENCE``, a rule carrying ``assertion: uncertain``, else ``NP_HEDGE``) are
        what a label convention other than the product's reads (e.g. NLM's Open-i indexing codes "A versus B"):
        ``entity_extraction/openi_assertion_map.yaml``.
        """
        if assertion != "uncertain":
            return ()
        mods = [
            m
            for m in ent._.modifiers
            if m.category == "POSSIBLE_EXISTENCE" or (m.rule.metadata or {}).get("assertion") == "uncertain"
        ] or by_cat.get("NP_HEDGE", [])
        return tuple(sorted({m.rule.literal.lower() for m in mods}))

    @staticmethod
    def _assertion(ent: Span) -> tuple[dict[str, list], str, str]:
        """ConText modifiers of ``ent`` by category, its assertion and its temporality."""
        by_cat: dict[str, list] = {}
        for mod in ent._.modifiers:
            by_cat.setdefault(mod.category, []).append(mod)
        # PROBABLE_EXISTENCE ('likely', 'suggestive of') asserts the finding: only POSSIBLE_EXISTENCE makes it
        # uncertain (the assertion convention: docs/reports.md). A rule of another category may carry the assertion a
        # field lexicon gives its trigger ("rule out": hypothetical and uncertain; trigger_lexicons.merge_rules).
        carried = {(m.rule.metadata or {}).get("assertion") for m in ent._.modifiers}
        if by_cat.get("POSSIBLE_EXISTENCE") or "uncertain" in carried:
            assertion = "uncertain"
        elif by_cat.get("NEGATED_EXISTENCE") or "absent" in carried:
            assertion = "absent"
        elif by_cat.get("NP_HEDGE"):  # an adjective hedge of the noun phrase ("suspicious opacity"): below negation
            assertion = "uncertain"
        else:
            assertion = "present"
        if by_cat.get("HYPOTHETICAL"):
            temporality = "hypothetical"
        elif by_cat.get("HISTORICAL"):
            temporality = "historical"
        else:
            temporality = "current"
        return by_cat, assertion, temporality

    def _mention(
        self,
        ent: Span,
        sents: _Sentences,
        spans: list[tuple[str, int, int]],
        bodies: list[tuple[str, int, int]],
        index: _FamilyIndex,
        past: list[tuple[int, int]] | None = None,
    ) -> list[dict]:
        """The mention dicts of one target: one, or none for a descriptor without anatomy, or one per concept of an
        ``any_site`` rule for a descriptor negated with no site named in its sentence ("no acute fracture": each
        fracture concept of the family absent); ``spans``/``bodies``: section spans with/without their headers;
        ``past``: bodies under historical headers (PAST MEDICAL HISTORY)."""
        sent = sents.of(ent)
        rule = ent._.target_rule
        meta = (rule.metadata or {}) if rule else {}
        normal = False
        if ent.label_ == _DESCRIPTOR:
            descriptor = meta.get("descriptor", "")
            composed = self._compose_id(ent, sent, index.compose.get(descriptor, ()))
            if composed is None:
                return self._any_site(ent, sent, sents, spans, bodies, past, index.any_site.get(descriptor))
            entity_id, normal = composed
        else:
            candidates = tuple(meta.get("candidates", (ent.label_,)))
            entity_id = self._refine_id(ent, sent, self._resolve_id(ent, sent, candidates))
        return [self._mention_of(ent, entity_id, normal, sent, sents, spans, bodies, past)]

    def _any_site(
        self,
        ent: Span,
        sent: Span,
        sents: _Sentences,
        spans: list[tuple[str, int, int]],
        bodies: list[tuple[str, int, int]],
        past: list[tuple[int, int]] | None,
        rule: tuple[tuple[str, ...], re.Pattern[str]] | None,
    ) -> list[dict]:
        """A descriptor no anatomy phrase names (``descriptor_rules_en.json`` ``any_site``): when its sentence names no
        site either (the rule's own anatomy phrases, its ``other_sites`` and ``not_with`` words) and it is negated,
        one absent mention per concept of the rule; otherwise none (a fracture present at an unknown site names no
        concept)."""
        if rule is None:
            return []
        ids, sites = rule
        if sites.search(sent.text):
            return []
        if self._assertion(ent)[1] != "absent":
            return []
        return [self._mention_of(ent, cid, False, sent, sents, spans, bodies, past) for cid in ids]

    def _mention_of(
        self,
        ent: Span,
        entity_id: str,
        normal: bool,
        sent: Span,
        sents: _Sentences,
        spans: list[tuple[str, int, int]],
        bodies: list[tuple[str, int, int]],
        past: list[tuple[int, int]] | None,
    ) -> dict:
        """The mention dict of target ``ent`` read as concept ``entity_id`` (``normal``: a normal statement)."""
        concept = self.ontology.concepts[entity_id]
        by_cat, assertion, temporality = self._assertion(ent)
        if temporality == "current" and any(a <= ent.start_char < b for a, b in past or ()):
            temporality = "historical"
        if normal and assertion != "uncertain":
            # a normal statement about the anatomy ("heart size is normal", "normal cardiac silhouette"): the
            # finding is absent whatever the word order (a negation rule such as "is normal" may or may not match)
            assertion = "absent"
        negated = by_cat.get("NEGATED_EXISTENCE", [])
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
            "sentence": self._sentence_text(ent, sent, sents.text, bodies),
            "assertion": assertion,
            "hedges": list(self._hedges(ent, by_cat, assertion)),
            "temporality": temporality,
            "change": change,
            "laterality": lat.rule.metadata["value"] if lat is not None else None,
            "severity": sev.rule.metadata["value"] if sev is not None else None,
            "anatomy_id": anatomy_id,
        }

    @staticmethod
    def _sentence_text(ent: Span, sent: Span, text: str, spans: list[tuple[str, int, int]]) -> str:
        """The sentence ``sent`` of ``ent`` without a section header that starts it (``"IMPRESSION: ..."``)."""
        start = sent.start_char
        for _, body_start, _ in spans:
            if start < body_start <= ent.start_char:
                start = body_start
        return text[start : sent.end_char].strip()

    def _run(self, doc: Doc, family: str) -> list[dict]:
        index = self._family(family)
        with warnings.catch_warnings():
            # medspaCy matchers built from phrase rules only hold an empty token Matcher: spaCy W036 each call
            warnings.filterwarnings("ignore", message=r"\[W036\]")
            targets = index.matcher(doc)
            if targets and _PARENTHESISED.search(doc.user_data.get(_TEXT_KEY) or doc.text):
                targets = self._add_abbreviations(doc, targets)
            _set_ents(doc, targets)
            doc = self._context(doc)
            self._own_modifiers(doc)
            self._between_targets(doc)
        sents = _Sentences(doc)
        spans = section_spans(sents.text, self.section_rules_path)
        bodies = section_body_spans(sents.text, self.section_rules_path)
        past = historical_spans(sents.text, self.section_rules_path)
        return [m for ent in doc.ents for m in self._mention(ent, sents, spans, bodies, index, past)]

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
            ``text`` (a soft line wrap inside a mention reads as a space), ``section`` (see
            :func:`entity_extraction.sections.section_spans`; mentions under a historical header such as PAST
            MEDICAL HISTORY are ``historical``), ``sentence``,
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
        return self._run(self._nlp(_unwrap(text)), family)

    def assert_target(self, text: str, start: int, end: int) -> dict:
        """Assertion and temporality of one given target span, whatever its words (no ontology lookup).

        The text goes through the same tokenizer, sentence rules and ConText rules as :meth:`extract`; the
        characters ``text[start:end]`` (widened to whole tokens) are the only target. Used to score the
        ConText rules on sentence sets whose targets are not ontology concepts (the NegEx test kit).

        Parameters
        ----------
        text : str
            A sentence or report.
        start, end : int
            Character offsets of the target in ``text``.

        Returns
        -------
        dict
            ``{"assertion": present|absent|uncertain, "temporality": current|historical|hypothetical}``.

        Raises
        ------
        ValueError
            If ``start:end`` holds no token of ``text``.
        """
        doc = self._nlp(_unwrap(text))
        span = doc.char_span(start, end, label="TARGET", alignment_mode="expand")
        if span is None or not len(span):
            raise ValueError(f"no token at characters {start}:{end}")
        doc.ents = [span]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"\[W036\]")
            doc = self._context(doc)
        _, assertion, temporality = self._assertion(doc.ents[0])
        return {"assertion": assertion, "temporality": temporality}

    def extract_many(self, texts: Iterable[str], family: str, batch_size: int = 64) -> list[list[dict]]:
        """:meth:`extract` over many reports of one family (``nlp.pipe`` batching); one list per text."""
        self._family(family)
        return [self._run(doc, family) for doc in self._nlp.pipe(map(_unwrap, texts), batch_size=batch_size)]


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
