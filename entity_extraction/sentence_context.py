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

One option departs from medspaCy on purpose: ``ignore_modifiers_in_targets``. A modifier phrase that lies wholly
inside a target ("old" in the target "old rib fracture", "chronic" in "chronic small vessel ischemic changes") is
part of the finding's name, not a cue of the sentence. medspaCy never lets it modify the target it lies in, but it
still limits the scope of the sentence's other modifiers, so in "No old rib fracture." the HISTORICAL "old" ends the
scope of "No" and the fracture reads present; and it modifies the sentence's other targets ("No old fracture or
pleural effusion": the effusion historical). medspaCy's ``prune_on_target_overlap`` drops such modifiers only after
the scopes are limited (``ConText.__call__`` runs ``update_scopes`` before ``apply_modifiers``), so it does not help.
With the option, such modifiers are dropped before anything else: they neither limit a scope nor modify a target.
A modifier that only partly overlaps a target is kept (medspaCy's rule applies: it does not modify that target).
Targets whose label is in ``keep_modifiers_in_labels`` are exempt: the modifiers inside them are kept and work as
in medspaCy (the extractor's descriptor targets, "large" or "borderline", are modifier words themselves: "Large
effusion on the right" must keep the severity of "large").
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from medspacy.context import ConText
from medspacy.context.context_graph import ConTextGraph
from medspacy.context.context_modifier import ConTextModifier
from spacy.tokens import Doc


class SentenceScopedConText(ConText):
    """:class:`medspacy.context.ConText` with per-sentence modifier bookkeeping (module docstring).

    Constructed and configured exactly like ``ConText``, plus ``ignore_modifiers_in_targets`` (default False;
    module docstring). Without it ``__call__(doc)`` returns the same ``doc`` with the same ``ent._.modifiers`` (and
    span attributes) as ``ConText.__call__``; with it, the same as ``ConText.__call__`` on the matches that do not
    lie wholly inside a target.
    """

    def __init__(
        self,
        *args,
        ignore_modifiers_in_targets: bool = False,
        keep_modifiers_in_labels: frozenset[str] = frozenset(),
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.ignore_modifiers_in_targets = ignore_modifiers_in_targets
        self.keep_modifiers_in_labels = frozenset(keep_modifiers_in_labels)

    def __call__(self, doc: Doc, targets: str | None = None) -> Doc:
        """Apply ConText to ``doc.ents`` (the sentences of ``doc`` must be set).

        Raises
        ------
        ValueError
            As ``ConText``: if sentence boundaries are not set. Also if ``ignore_modifiers_in_targets`` is set
            together with ``targets``, span groups, a ConText-wide ``max_scope`` or ``prune_on_target_overlap``
            (medspaCy's own algorithm would run, without the option).
        """
        if targets or self.input_span_type != "ents" or self.max_scope or self.prune_on_target_overlap:
            if self.ignore_modifiers_in_targets:
                raise ValueError(
                    "ignore_modifiers_in_targets works on doc.ents with sentence scopes only "
                    "(no targets argument, span groups, ConText-wide max_scope or prune_on_target_overlap)"
                )
            return super().__call__(doc, targets)
        ents = doc.ents
        matcher = self._ConText__matcher  # type: ignore[attr-defined]  # medspaCy keeps its matcher private
        matches = matcher(doc)
        if not matches or not ents:  # nothing to modify, or no modifier: no edge
            matches = []
        if matches and self.ignore_modifiers_in_targets:
            matches = _outside_targets(matches, [t for t in ents if t.label_ not in self.keep_modifiers_in_labels])
        sent_of, bounds = _sentence_index(doc) if matches else ([], [])
        if any(sent_of[start] != sent_of[end - 1] for _, start, end in matches):
            # a modifier phrase across a sentence boundary: medspaCy's whole-document way
            if not self.ignore_modifiers_in_targets:
                return super().__call__(doc, targets)
            whole = ConTextGraph(prune_on_modifier_overlap=self.prune_on_target_overlap)
            whole.targets = ents
            whole.modifiers = [
                ConTextModifier(matcher.rule_map[self.nlp.vocab[m].text], s, e, doc, max_scope=self.max_scope)
                for m, s, e in matches
            ]
            whole.update_scopes()
            whole.apply_modifiers()
            return self._link(doc, whole)
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
        return self._link(doc, graph)

    def _link(self, doc: Doc, graph: ConTextGraph) -> Doc:
        """Attach the graph's edges to their targets and set the span attributes (the end of ``ConText.__call__``)."""
        for target, modifier in graph.edges:
            target._.modifiers += (modifier,)
        if self.context_attributes_mapping:
            self.set_context_attributes(graph.edges)
        doc._.context_graph = graph
        return doc


def _outside_targets(matches: list[tuple[int, int, int]], ents) -> list[tuple[int, int, int]]:
    """The modifier matches ``(match_id, start, end)`` (token offsets) that do not lie wholly inside a target of
    ``ents`` (``doc.ents`` or a part of them: sorted, never overlapping): a match with ``target.start <= start`` and
    ``end <= target.end`` is dropped. Order kept."""
    starts = [t.start for t in ents]
    kept = []
    for match in matches:
        _, start, end = match
        i = bisect_right(starts, start) - 1  # the one target that can hold the match: the last starting at or before
        if i < 0 or end > ents[i].end:
            kept.append(match)
    return kept


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
