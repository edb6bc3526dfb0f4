"""Clinical terms after the modality code "MR" in DICOM header text, kept from the report scrubber's title rule.

The report scrubber (:mod:`entity_extraction.deid`) reads "MR" as the title Mister and takes the word after it for a
surname. In a DICOM header (CodeMeaning, Study/Series Description, procedure descriptions) "MR" written in capitals
is the modality: "MR Lever" (Dutch: liver) is a procedure, not a person. :func:`clean_header_text` keeps each run of
the modality code and the clinical words that follow it (``schemas/deid/coded_terms.yaml``, the anatomy synonyms of
``schemas/ontology/synonyms_*.json`` and the words of ``schemas/ontology/body_part_keywords.yaml``) and scrubs the
text around it as before. A word that is part of the patient's own name is never kept; any word that is not a
listed clinical term is scrubbed, so "MR Vintersby" still loses the name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Set
from functools import lru_cache
from pathlib import Path

import yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
TERMS_FILE = SCHEMAS / "deid" / "coded_terms.yaml"
_WORD = re.compile(r"[^\W\d_]+")
#: the next word after a kept one: separated by spaces, commas, slashes, plus or hyphens
_NEXT_WORD = re.compile(r"[ \t,/+-]+([^\W\d_]+)")


@lru_cache(maxsize=1)
def _lexicon() -> tuple[frozenset[str], frozenset[str]]:
    """(modality codes, clinical words), lower case."""
    data = yaml.safe_load(TERMS_FILE.read_text(encoding="utf-8"))
    words = {w.lower() for terms in data["terms"].values() for w in terms}
    for path in sorted((SCHEMAS / "ontology").glob("synonyms_*.json")):
        for concept, synonyms in json.loads(path.read_text(encoding="utf-8")).items():
            if concept.startswith("A"):  # anatomy concepts
                words.update(w for s in synonyms for w in _WORD.findall(s.lower()))
    keywords = yaml.safe_load((SCHEMAS / "ontology" / "body_part_keywords.yaml").read_text(encoding="utf-8"))
    words.update(str(w).lower() for ws in keywords.values() for w in ws)
    return frozenset(data["modality_codes"]), frozenset(words)


def kept_spans(text: str, known_parts: Set[str] = frozenset()) -> list[tuple[int, int]]:
    """Character spans of ``text`` to keep: a modality code written in capitals (``MR``) and the run of listed
    clinical words right after it (separated by spaces, commas, slashes or hyphens), ending at the first word that
    is not one or that is a part of the patient's name (``known_parts``, lower case)."""
    codes, words = _lexicon()
    spans = []
    for m in re.finditer(r"\b(" + "|".join(map(re.escape, sorted(codes))) + r")\b(?!\.)", text):
        end = m.end()
        while (w := _NEXT_WORD.match(text, end)) and (word := w.group(1).lower()) in words:
            if word in known_parts:
                break
            end = w.end()
        if end > m.end():
            spans.append((m.start(), end))
    return spans


def clean_header_text(text: str, scrub: Callable[[str], str], known_parts: Set[str] = frozenset()) -> str:
    """``text`` scrubbed by ``scrub`` except for the spans of :func:`kept_spans`, which are kept verbatim; the text
    between them is scrubbed piece by piece."""
    spans = kept_spans(text, known_parts)
    if not spans:
        return scrub(text)
    out, at = [], 0
    for start, end in spans:
        if text[at:start].strip():
            out.append(scrub(text[at:start]))
        else:
            out.append(text[at:start])
        out.append(text[start:end])
        at = end
    if text[at:].strip():
        out.append(scrub(text[at:]))
    else:
        out.append(text[at:])
    return "".join(out)
