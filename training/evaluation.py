"""The paper's evaluation cells: retrieval per modality family x entity category, VQA per question type and family.

Retrieval (:func:`retrieval_cells`): for every query (study, entity) of a split, the gallery is that split's
studies of the query's modality family; the query itself and every study of the query's patient are never ranked
(one vectorised mask from integer patient codes). Per cell (family x category of the entity: anatomy, finding,
condition) the mean over queries of Recall@k (at least one relevant study in the top k) and NDCG@k with the
graded relevance as gain (:func:`training.encoder.ndcg_at_k`). ``cells_mean`` averages the cells that have
queries (each cell weighs the same, as the paper's table reports them side by side).

VQA (:func:`vqa_cells`): multiple-choice accuracy per question type, per modality family of the current image
(chest radiograph ``2D-CXR``, CT ``3D-CT``, ...), and per family x type; the longitudinal ``change`` items
separately per family.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

from schemas.ontology import CATEGORIES, FAMILIES
from training.encoder import ndcg_at_k

_PREFIX_CATEGORY = {"A": "anatomy", "F": "finding", "C": "condition"}
#: question types of longitudinal change (reported separately)
CHANGE_TYPES = ("change",)


def entity_categories(entity_ids: list[str]) -> dict[str, str]:
    """Entity id -> ``anatomy`` | ``finding`` | ``condition`` from the ontology (ids the ontology lacks: by their
    prefix letter A/F/C, else ``other``)."""
    from schemas.ontology import load_ontology

    concepts = load_ontology().concepts
    return {e: concepts[e].category if e in concepts else _PREFIX_CATEGORY.get(e[:1], "other") for e in entity_ids}


def retrieval_cells(
    emb: torch.Tensor,
    gallery: list[str],
    entity_ids: list[str],
    family: dict[str, str],
    patient: dict[str, str],
    queries: list[tuple[str, str]],
    relevance: Callable[[str, str], dict[str, float]],
    ks: list[int],
    ndcg_k: int,
    category: dict[str, str],
) -> dict:
    """Retrieval metrics of one split, per cell and overall.

    Parameters
    ----------
    emb : torch.Tensor
        ``(G, n_entities, E)`` float32 L2-normalised embeddings of ``gallery`` for every entity.
    gallery : list of str
        the split's studies (row order of ``emb``).
    entity_ids : list of str
        column order of ``emb``'s entity axis.
    family, patient : dict
        study -> modality family / patient key.
    queries : list of (study, entity)
        the split's queries (studies in ``gallery``).
    relevance : callable
        ``relevance(study, entity)`` -> ``{relevant study: relevance > 0}``.
    ks : list of int
        Recall@k cut-offs.
    ndcg_k : int
    category : dict
        entity -> category.

    Returns
    -------
    dict
        ``n_queries``, ``gallery``, ``micro`` (Recall@k and NDCG over all queries), ``cells``
        (``"<family>|<category>"`` -> ``n_queries``, ``gallery``, ``R@k``, ``NDCG@k``; the four modality families
        of the ontology (and any other family of the split) crossed with anatomy / finding / condition, metrics None
        for cells without queries) and ``cells_mean``.
    """
    pos = {s: i for i, s in enumerate(gallery)}
    pcode = {p: i for i, p in enumerate(sorted(set(patient[s] for s in gallery)))}
    gpat = torch.tensor([pcode[patient[s]] for s in gallery], dtype=torch.long)
    by_fam: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(gallery):
        by_fam[family[s]].append(i)
    names = [f"R@{k}" for k in ks] + [f"NDCG@{ndcg_k}"]
    scores: dict[str, list[torch.Tensor]] = defaultdict(list)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s, e in queries:
        if relevance(s, e):
            groups[(family[s], e)].append(s)
    for (fam, e), qs in sorted(groups.items()):
        g_idx = torch.tensor(by_fam[fam])
        col = {int(g): j for j, g in enumerate(g_idx)}
        ei = entity_ids.index(e)
        q_idx = torch.tensor([pos[s] for s in qs])
        sim = emb[q_idx, ei] @ emb[g_idx, ei].T
        gain = torch.zeros(sim.shape)
        for r, s in enumerate(qs):
            for t, v in relevance(s, e).items():
                if t in pos and pos[t] in col:
                    gain[r, col[pos[t]]] = v
        exclude = gpat[q_idx][:, None] == gpat[g_idx][None, :]  # the query and its patient's other studies
        gain = gain.masked_fill(exclude, 0.0)
        order = sim.masked_fill(exclude, float("-inf")).argsort(dim=1, descending=True)
        hits = (gain > 0).gather(1, order) & ~exclude.gather(1, order)
        per = [hits[:, : min(k, sim.shape[1])].any(1).float() for k in ks] + [ndcg_at_k(sim, gain, ndcg_k, exclude)]
        keep = (gain > 0).any(1)  # queries whose relevant studies are all the patient's own: nothing to find
        scores[f"{fam}|{category.get(e, 'other')}"].append(torch.stack(per, 1)[keep])
    cells = {}
    families = list(FAMILIES) + sorted(set(by_fam) - set(FAMILIES))  # the paper's 4 x 3 = 12 cells, always
    for fam in families:
        for cat in CATEGORIES:
            key = f"{fam}|{cat}"
            got = torch.cat(scores[key]) if scores.get(key) else torch.zeros((0, len(names)))
            cells[key] = {
                "n_queries": int(got.shape[0]),
                "gallery": len(by_fam[fam]),
                **{n: (float(got[:, i].mean()) if got.shape[0] else None) for i, n in enumerate(names)},
            }
    for key in sorted(set(scores) - set(cells)):  # categories outside the ontology's three
        got = torch.cat(scores[key])
        cells[key] = {
            "n_queries": int(got.shape[0]),
            "gallery": len(by_fam[key.split("|")[0]]),
            **{n: float(got[:, i].mean()) for i, n in enumerate(names)},
        }
    every = torch.cat([t for v in scores.values() for t in v]) if scores else torch.zeros((0, len(names)))
    filled = [c for c in cells.values() if c["n_queries"]]
    return {
        "n_queries": int(every.shape[0]),
        "gallery": len(gallery),
        "micro": {n: float(every[:, i].mean()) if every.shape[0] else None for i, n in enumerate(names)},
        "cells": cells,
        "cells_mean": {n: sum(c[n] for c in filled) / len(filled) if filled else None for n in names},
    }


def vqa_cells(rows: list[dict]) -> dict:
    """VQA accuracy cells from per-item rows ``{question_type, family, mc_correct}`` (``mc_correct`` None for
    open-ended items, which are left out).

    Returns
    -------
    dict
        ``by_family`` (family -> ``n_mc``, ``mc_accuracy``), ``by_family_and_type`` (``"<family>|<type>"`` -> the
        same) and ``longitudinal_change`` (family -> the same, change items only).
    """

    def acc(rs: list[dict]) -> dict:
        mc = [r["mc_correct"] for r in rs if r["mc_correct"] is not None]
        return {"n_mc": len(mc), "mc_accuracy": sum(mc) / len(mc) if mc else None}

    fams = sorted({r["family"] for r in rows})
    return {
        "by_family": {f: acc([r for r in rows if r["family"] == f]) for f in fams},
        "by_family_and_type": {
            f"{f}|{t}": acc([r for r in rows if r["family"] == f and r["question_type"] == t])
            for f in fams
            for t in sorted({r["question_type"] for r in rows})
            if any(r["family"] == f and r["question_type"] == t for r in rows)
        },
        "longitudinal_change": {
            f: acc([r for r in rows if r["family"] == f and r["question_type"] in CHANGE_TYPES]) for f in fams
        },
    }


def metric_at(evaluation: dict, dotted: str) -> float | None:
    """The value at a dotted path of an evaluation dict (``val.cells_mean.NDCG@10``); None when absent or null.
    Keys may contain dots only as path separators; ``@`` and ``|`` are ordinary characters."""
    cur = evaluation
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return float(cur) if isinstance(cur, int | float) else None
