"""medspaCy ConText with its modifier bookkeeping done per sentence: the same result, less work.

ConText (Harkema et al., J Biomed Inform 2009;42(5):839-851; medspaCy's ``ConText`` component) finds every
modifier phrase ("no", "increased", "left") of a document, limits each modifier's scope by every other modifier
(``ConTextGraph.update_scopes``: all pairs of the document) and tests every modifier against every target
(``ConTextGraph.apply_modifiers``). Without a ConText-wide ``max_scope`` a modifier's scope is its own sentence,
cut by its rule's ``max_scope``. So

* a modifier in a sentence that holds no target modifies nothing;
* two modifiers of different sentences never limit each other's scope (their scopes lie in disjoint token
  ranges; an empty scope at the boundary between them does not move either: checked case by case against
  ``ConTextModifier.limit_scope``);
* a target can only be modified from the sentence of its first or of its last token
  (``ConTextModifier.modifies`` needs the scope to hold the target's first or end token).

:class:`SentenceScopedConText` therefore builds modifiers only in sentences with a target, limits scopes within
each sentence and tests each target against the modifiers of its sentences, in the order medspaCy uses, so every
target gets the same modifiers in the same order. A modifier phrase that crosses a sentence boundary (its start
and last token in different sentences), a ConText-wide ``max_scope`` (windows instead of sentences) or pruning on
target overlap fall back to medspaCy's own algorithm for that document. ``doc._.context_graph`` holds only the
modifiers of sentences with a target. The equivalence is tested on real reports
(``tests/entity_extraction/test_sentence_context.py``).
"""

from __future__ import annotations

from collections import defaultdict

from medspacy.context import ConText
from medspacy.context.context_graph import ConTextGraph
from medspacy.context.context_modifier import ConTextModifier
from spacy.tokens import Doc


class SentenceScopedConText(ConText):
    """:class:`medspacy.context.ConText` with per-sentence modifier bookkeeping (module docstring).

    Constructed and configured exactly like ``ConText``; ``__call__(doc)`` returns the same ``doc`` with the same
    ``ent._.modifiers`` (and span attributes) as ``ConText.__call__``.
    """

    def __call__(self, doc: Doc, targets: str | None = None) -> Doc:
        """Apply ConText to ``doc.ents`` (the sentences of ``doc`` must be set).

        Raises
        ------
        ValueError
            As ``ConText``: if sentence boundaries are not set.
        """
        if targets or self.input_span_type != "ents" or self.max_scope or self.prune_on_target_overlap:
            return super().__call__(doc, targets)
        ents = doc.ents
        matcher = self._ConText__matcher  # type: ignore[attr-defined]  # medspaCy keeps its matcher private
        matches = matcher(doc)
        if not matches or not ents:  # nothing to modify, or no modifier: no edge
            matches = []
        sent_of, bounds = _sentence_index(doc) if matches else ([], [])
        if any(sent_of[start] != sent_of[end - 1] for _, start, end in matches):
            return super().__call__(doc, targets)  # a modifier phrase across a sentence boundary: medspaCy's way
        target_sents = {sent_of[i] for t in ents for i in (t.start, t.end - 1)} if matches else set()
        vocab = self.nlp.vocab
        modifiers: list[ConTextModifier] = []
        by_sent: dict[int, list[ConTextModifier]] = defaultdict(list)
        for match_id, start, end in matches:
            sent = sent_of[start]
            if sent in target_sents:
                rule = matcher.rule_map[vocab[match_id].text]
                scope_start, scope_end = _scope(rule, start, end, *bounds[sent])
                modifier = ConTextModifier(rule, start, end, doc, scope_start, scope_end, max_scope=self.max_scope)
                modifiers.append(modifier)
                by_sent[sent].append(modifier)

        for group in by_sent.values():  # ConTextGraph.update_scopes, within each sentence
            for i in range(len(group) - 1):
                first = group[i]
                for second in group[i + 1 :]:
                    first.limit_scope(second)
                    second.limit_scope(first)
        for target in (
            ents if matches else ()
        ):  # ConTextGraph.apply_modifiers (no pruning on modifier overlap: see __call__)
            s0, s1 = sent_of[target.start], sent_of[target.end - 1]
            candidates = (
                by_sent.get(s0, []) if s0 == s1 else [m for m in modifiers if sent_of[m.modifier_span[0]] in (s0, s1)]
            )
            for modifier in candidates:
                if modifier.modifies(target):
                    modifier.modify(target)
        edges = []
        for modifier in modifiers:
            modifier.reduce_targets()
            edges.extend((target, modifier) for target in modifier._targets)

        graph = ConTextGraph(prune_on_modifier_overlap=self.prune_on_target_overlap)
        graph.targets, graph.modifiers, graph.edges = ents, modifiers, edges
        for target, modifier in edges:
            target._.modifiers += (modifier,)
        if self.context_attributes_mapping:
            self.set_context_attributes(edges)
        doc._.context_graph = graph
        return doc


def _sentence_index(doc: Doc) -> tuple[list[int], list[tuple[int, int]]]:
    """Sentence number of every token of ``doc`` and (start, end) token bounds of every sentence (``doc.sents``
    order), read once from the SENT_START array (``Token.sent`` walks the tokens at every call).

    Raises
    ------
    ValueError
        If sentence boundaries are not set (the error ConText raises).
    """
    if len(doc) > 1 and not doc.has_annotation("SENT_START"):
        raise ValueError("ConText failed because sentence boundaries have not been set: add a sentencizer first.")
    flags = doc.to_array("SENT_START").tolist()
    starts = [0] + [i for i, v in enumerate(flags) if v == 1 and i > 0]
    bounds = list(zip(starts, starts[1:] + [len(doc)]))
    index = [0] * len(doc)
    for k, (a, b) in enumerate(bounds):
        index[a:b] = [k] * (b - a)
    return index, bounds


def _scope(rule, start: int, end: int, sent_start: int, sent_end: int) -> tuple[int, int]:
    """A modifier's scope in its sentence, cut by its rule's ``max_scope`` (tokens): the scope
    ``ConTextModifier`` sets itself from ``doc[start].sent`` when ConText has no ``max_scope`` (medspaCy 1.3
    ``ConTextModifier.__set_scope``; forward: after the phrase, backward: before it, any other direction: both)."""
    max_scope = rule.max_scope
    direction = rule.direction.lower()
    if direction == "forward":
        scope_start, scope_end = end, sent_end
        if max_scope is not None and scope_end - scope_start > max_scope:
            scope_end = end + max_scope
    elif direction == "backward":
        scope_start, scope_end = sent_start, start
        if max_scope is not None and scope_end - scope_start > max_scope:
            scope_start = start - max_scope
    else:
        scope_start, scope_end = sent_start, sent_end
        if max_scope is not None and start - scope_start > max_scope:
            scope_start = start - max_scope
        if max_scope is not None and scope_end - end > max_scope:
            scope_end = end + max_scope
    return scope_start, scope_end
