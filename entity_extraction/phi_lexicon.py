"""The word lists of the English report scrubber under their first name; the code is in
:mod:`entity_extraction.deid.lexicon` and :mod:`entity_extraction.deid.name_rules`."""

from entity_extraction.deid.lexicon import (
    AMBIG,
    SAFE,
    Lexicon,
    PhiLexiconError,
    load_lexicon,
    protected_spans,
)
from entity_extraction.deid.name_rules import lexical_hits

__all__ = ["AMBIG", "SAFE", "Lexicon", "PhiLexiconError", "lexical_hits", "load_lexicon", "protected_spans"]
