"""Result builder, core nodes at scale: the cap order computed over a prefix (selected, scored and the first
``cap + OMITTED_LIST_CAP`` others in the snapshot's static order) equals the cap order of every admissible core
node, checked against a plain-Python sort of the whole set (recall-spec departure 5)."""

from __future__ import annotations

import numpy as np
import pytest
from e2e_helpers import graph, make_settings, node, owner, scored_state, snapshot

from memory_recall.model.graph import MemoryScope, StoryTime
from memory_recall.pipeline._admission import admissible
from memory_recall.pipeline.owners import scene_context
from memory_recall.pipeline.result import OMITTED_LIST_CAP, build_result
from memory_recall.pipeline.state import ContextInfo

CORE_TYPES = ("event", "thread", "rule")


def big_graph(n: int = 260, seed: int = 3):
    """Core nodes with many ties in seq and importance, some future-tense (suppressed), some archived, an owner who
    sees only part of them, and a few non-core nodes."""
    rng = np.random.default_rng(seed)
    nodes = []
    visible = {}
    for k in range(n):
        nid = f"c{int(rng.integers(0, 10**6)):06d}-{k}"
        type_ = CORE_TYPES[k % 3]
        story = StoryTime(label="later", tense="future") if k % 17 == 0 else None
        nodes.append(node(nid, type_, seq=int(rng.integers(0, 40)), importance=float(rng.integers(1, 4)),
                          archived=k % 23 == 0, story_time=story, scope=MemoryScope(region_primary="Hall"),
                          title=f"T{k}"))
        if k % 3:
            visible[nid] = 0.9
    nodes += [node(f"char-{k}", "character", seq=k, name=f"C{k}") for k in range(5)]
    return graph(nodes, owners=[owner("Erin", visibility=visible)])


def reference_core(state, settings, selected):
    """Every admissible core node sorted by the full cap key in Python: selection position, weighted score desc,
    recency desc, importance desc, node id bytes."""
    snap = state.snapshot
    idx = np.flatnonzero(snap.core_mask)
    ok = admissible(state, idx, context=settings.context, scoring=settings.scoring, require_active=False,
                    owner_context=state.context)
    rows = {int(i): r for r, i in enumerate(state.scored.index.tolist())}
    sel_pos = {i: p for p, i in enumerate(selected)}

    def key(i):
        r = rows.get(i)
        score = float(state.scored.weighted_score[r]) if r is not None else -np.inf
        end = snap.seq_end[i]
        recency = float(snap.seq[i]) if np.isnan(end) else float(end)
        return (sel_pos.get(i, len(selected)), -score, -recency, -float(snap.importance[i]), snap.ids[i].encode())

    return sorted((int(i) for i in idx[ok]), key=key)


@pytest.mark.parametrize("cap", [0, 1, 7, 40, 500])
@pytest.mark.parametrize("owners", [(), ("character:erin",)])
@pytest.mark.parametrize("worst", [None, -np.inf])
def test_core_prefix_equals_full_cap_order(cap, owners, worst):
    """``worst``: one more scored row with that score (−inf sorts among the unscored nodes, by recency)."""
    snap = snapshot(big_graph())
    core_ids = [snap.ids[i] for i in np.flatnonzero(snap.core_mask)]
    scored = [(nid, 0.9 - 0.1 * k) for k, nid in enumerate(core_ids[5:12])] + [(core_ids[40], 0.9)]
    if worst is not None:
        scored.append((core_ids[50], worst))
    chosen = [core_ids[30], core_ids[12], "char-1", core_ids[7]]
    ctx = ContextInfo(owner_keys=owners, owner_scores=tuple(1.0 for _ in owners),
                      owner_mode="request" if owners else "unresolved", active_region="Hall")
    state = scored_state(snap, scored, selection=chosen, context=ctx)
    state = state.evolve(final_owner_keys=owners, final_owner_scores=tuple(1.0 for _ in owners),
                         final_owner_mode=ctx.owner_mode, meta=state.with_meta(ownerPovAugmented=[]))
    settings = make_settings(injector={"core_cap": cap}, selection={"max_recall_nodes": 4})
    result = build_result(state, settings)

    selected = [snap.index[nid] for nid in result.selected_node_ids]
    ranked = reference_core(state, settings, selected)
    assert len(ranked) > 60  # the prefix is a real cut
    assert sorted(result.core_node_ids) == sorted(snap.ids[i] for i in ranked[:cap])
    assert [o.node_id for o in result.omitted if o.reason == "core-cap"] == [
        snap.ids[i] for i in ranked[cap:cap + OMITTED_LIST_CAP]
    ]
    assert result.stats["coreOmittedCount"] == max(0, len(ranked) - cap)


def test_scene_context_keeps_the_admission_verdict():
    """The late stages admit with :func:`scene_context` (shared per scene); the verdict must be the one of the full
    context: the fields it drops (owner candidates, scores, sources, labels) must not change any node's verdict."""
    snap = snapshot(big_graph(seed=5))
    idx = np.arange(snap.n)
    settings = make_settings()
    for cue in ("none", "future", "flashback"):
        full = ContextInfo(
            owner_catalog=("character:erin",), owner_keys=("character:erin",), owner_scores=(0.7,),
            owner_mode="heuristic", active_region="Hall", active_region_source="runtime",
            adjacent_regions=("Yard",), story_segment_label="Day 2", story_source="runtime", cue_mode=cue,
        )
        state = scored_state(snap, [], context=full)
        # A context object the verdict cache has never seen (its key is the context by value).
        unique = ContextInfo(**{**full.__dict__, "story_segment_label": f"fresh-{cue}-{id(state)}"})
        expected = admissible(state, idx, context=settings.context, scoring=settings.scoring,
                              require_active=False, owner_context=unique)
        got = admissible(state, idx, context=settings.context, scoring=settings.scoring, require_active=False,
                         owner_context=scene_context(full))
        assert got.tolist() == expected.tolist()
        assert 0 < int(got.sum()) < snap.n  # the owner, the tense and archiving all cut something
