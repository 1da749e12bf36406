"""Dedup stage (recall-spec "Dedup before rerank"): exact-text and ≥ 80 % range-overlap duplicates collapse to
the best-ranked row, only inside the window DPP and rerank can see."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from score_helpers import (
    assert_same,
    freeze,
    ids_of,
    make_graph,
    make_node,
    make_snapshot,
    make_state,
    pov_scope,
    run_scoring,
    settings,
)

from memory_recall.model.graph import Node
from memory_recall.pipeline import dedup
from memory_recall.pipeline.dedup import RANGE_TYPES, DedupStage, dedup_text_key
from memory_recall.pipeline.state import ScoredTable
from memory_recall.settings import DiversitySettings, SelectionSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache, build_snapshot


def _scored(nodes, message: str = "zzz"):
    """Snapshot + state scored by the real stage; importance decides the ranking (higher first)."""
    snap = make_snapshot(make_graph(nodes))
    return snap, run_scoring(make_state(snap, message)).state


def _run(state, stage: DedupStage | None = None):
    return (stage or DedupStage()).run(state)


class TestExactText:
    def test_same_text_collapses_to_the_best_ranked(self) -> None:
        snap, state = _scored(
            [
                make_node(
                    "e1", "event", importance=3, title="Dragon attack", summary="The dragon burned the mill"
                ),
                make_node(
                    "e2", "event", importance=9, title="Dragon  ATTACK", summary="The dragon burned the mill "
                ),
                make_node("e3", "event", importance=5, title="Feast", summary="A feast in the hall"),
            ]
        )
        res = _run(state)
        assert ids_of(snap, res.state.scored.index) == ["e2", "e3"]
        assert res.state.meta["dedupCollapsed"] == {"e2": ["e1"]}
        assert res.state.meta["dedupReasons"] == {"e1": "exact-text"}
        assert res.trace.notes["exact_text"] == 1 and res.trace.count_out == 2
        # The text keys are kept as numbers; neither scoring nor dedup keeps a parsed node for them.
        assert dict(snap._nodes) == {}

    def test_text_duplicates_of_different_types_collapse(self) -> None:
        snap, state = _scored(
            [
                make_node("ev", "event", importance=8, summary="Alice left the city"),
                make_node("th", "thread", importance=2, summary="alice left the city"),
            ]
        )
        assert ids_of(snap, _run(state).state.scored.index) == ["ev"]

    def test_different_pov_owners_are_kept_apart(self) -> None:
        snap, state = _scored(
            [
                make_node(
                    "pa", "pov_memory", importance=8, summary="I saw the dragon", scope=pov_scope("Alice")
                ),
                make_node(
                    "pb", "pov_memory", importance=7, summary="I saw the dragon", scope=pov_scope("Bob")
                ),
                make_node(
                    "pa2", "pov_memory", importance=6, summary="I saw the dragon", scope=pov_scope("alice")
                ),
            ]
        )
        res = _run(state)
        assert res.state.meta["dedupCollapsed"] == {"pa": ["pa2"]}  # owner keys compare case-insensitively
        assert ids_of(snap, res.state.scored.index) == ["pa", "pb"]

    def test_bare_names_never_collapse(self) -> None:
        """Two character nodes that only carry the name "Alice" are the ``#nodeId`` case of reference §1.5."""
        snap, state = _scored([make_node("c1", name="Alice"), make_node("c2", name="Alice")])
        res = _run(state)
        assert len(res.state.scored) == 2 and res.state.meta["dedupCollapsed"] == {}

    def test_text_key(self) -> None:
        node = make_node("x", "event", title="A  B", summary="C\r\nD", name="N")
        assert dedup_text_key(node) == "c d | a b | n"
        assert dedup_text_key(make_node("y", name="Only")) == ""


class TestRangeOverlap:
    def test_overlap_of_80_percent_collapses(self) -> None:
        snap, state = _scored(
            [
                make_node(
                    "big", "synopsis", importance=9, seq=10, seq_range=(10, 19), title="Battle", summary="x"
                ),
                make_node(
                    "over", "synopsis", importance=5, seq=12, seq_range=(12, 21), title="War", summary="y"
                ),
                make_node(
                    "less", "synopsis", importance=4, seq=17, seq_range=(17, 26), title="Peace", summary="z"
                ),
            ]
        )
        res = _run(state)
        # over: floors 12..19 shared = 8 of 10 → collapse; less: 17..19 = 3 of 10 → kept
        assert ids_of(snap, res.state.scored.index) == ["big", "less"]
        assert res.state.meta["dedupReasons"] == {"over": "range-overlap"}

    def test_contained_range_collapses_by_the_shorter_length(self) -> None:
        snap, state = _scored(
            [
                make_node("short", "synopsis", importance=9, seq=5, seq_range=(5, 6), title="A", summary="a"),
                make_node("long", "synopsis", importance=5, seq=1, seq_range=(1, 20), title="B", summary="b"),
            ]
        )
        assert _run(state).state.meta["dedupCollapsed"] == {"short": ["long"]}

    def test_one_floor_nodes_of_one_floor_do_not_collapse_by_range(self) -> None:
        """Several events extracted from one message share its floor; only equal text collapses them."""
        snap, state = _scored(
            [
                make_node("e1", "event", importance=9, seq=7, title="Alice draws her sword", summary="a"),
                make_node("e2", "event", importance=5, seq=7, title="Bob runs away", summary="b"),
            ]
        )
        assert len(_run(state).state.scored) == 2

    def test_different_types_never_collapse_by_range(self) -> None:
        snap, state = _scored(
            [
                make_node("msg", "message", importance=9, seq=15, summary="hello there"),
                make_node("ev", "event", importance=5, seq=10, seq_range=(10, 20), title="E", summary="e"),
            ]
        )
        assert len(_run(state).state.scored) == 2

    def test_provenance_range_types_never_collapse(self) -> None:
        snap, state = _scored(
            [
                make_node("alice", "character", importance=9, seq=3, name="Alice", state="angry"),
                make_node("bob", "character", importance=5, seq=3, name="Bob", state="calm"),
            ]
        )
        assert len(_run(state).state.scored) == 2

    def test_events_of_one_extraction_batch_do_not_collapse_by_range(self) -> None:
        """ST-BME extracts several events per batch and each carries the batch's range: the range is provenance,
        not content, so distinct events of one batch stay apart (only summaries and messages collapse by range)."""
        snap, state = _scored(
            [
                make_node("will", "event", importance=9, seq=12, seq_range=(10, 19), title="Will", summary="w"),
                make_node("alibi", "event", importance=5, seq=12, seq_range=(10, 19), title="Alibi", summary="a"),
                make_node("t1", "thread", importance=4, seq=12, seq_range=(10, 19), title="Locket", summary="l"),
                make_node("t2", "thread", importance=3, seq=12, seq_range=(10, 19), title="Grudge", summary="g"),
            ]
        )
        res = _run(state)
        assert ids_of(snap, res.state.scored.index) == ["will", "alibi", "t1", "t2"]
        assert res.state.meta["dedupCollapsed"] == {}

    def test_transitive_chain_compares_with_kept_rows_only(self) -> None:
        snap, state = _scored(
            [
                make_node("a", "synopsis", importance=9, seq=0, seq_range=(0, 9), title="a", summary="a"),
                make_node("b", "synopsis", importance=8, seq=2, seq_range=(2, 11), title="b", summary="b"),
                make_node("c", "synopsis", importance=7, seq=4, seq_range=(4, 13), title="c", summary="c"),
            ]
        )
        # b ~ a (8/10) collapses; c ~ a is 6/10 (kept) even though c ~ b is 8/10 (b is gone)
        assert ids_of(snap, _run(state).state.scored.index) == ["a", "c"]

    def test_custom_ratio(self) -> None:
        snap, state = _scored(
            [
                make_node("a", "synopsis", importance=9, seq=0, seq_range=(0, 9), title="a", summary="a"),
                make_node("c", "synopsis", importance=7, seq=4, seq_range=(4, 13), title="c", summary="c"),
            ]
        )
        assert len(_run(state, DedupStage(overlap_ratio=0.6)).state.scored) == 1
        with pytest.raises(ValueError, match="overlap_ratio"):
            _run(state, DedupStage(overlap_ratio=0.0))


class TestWindow:
    def test_rows_below_the_window_are_untouched(self) -> None:
        nodes = [
            make_node(f"n{i}", "event", importance=9 - i * 0.1, title=f"T{i}", summary=f"S{i}")
            for i in range(5)
        ]
        nodes.append(make_node("dup", "event", importance=0, title="T0", summary="S0"))  # ranks last
        snap, state = _scored(nodes)
        small = DedupStage(
            SelectionSettings(top_k=1, max_recall_nodes=1, llm_candidate_pool=1),
            DiversitySettings(candidate_multiplier=3),
        )
        assert small.window() == 3
        assert len(_run(state, small).state.scored) == 6
        assert _run(state).state.meta["dedupCollapsed"] == {"n0": ["dup"]}

    def test_default_window(self) -> None:
        assert DedupStage().window() == 90  # max(max(12, 30), 20) × 3
        cfg = settings(selection={"top_k": 50})
        assert DedupStage(cfg.selection, cfg.diversity).window() == 150


class TestContract:
    def test_columns_stay_aligned(self) -> None:
        snap, state = _scored(
            [
                make_node("a", "event", importance=9, title="x", summary="same"),
                make_node("b", "event", importance=5, title="y", summary="other"),
                make_node("c", "event", importance=1, title="x", summary="same"),
            ]
        )
        before = state.scored
        after = _run(state).state.scored
        for field in ("final_score", "weighted_score", "knowledge_weight", "temporal_weight", "decay"):
            np.testing.assert_array_equal(getattr(after, field), getattr(before, field)[[0, 1]])
        assert after.parts.shape == (2, 4) and after.scope_bucket == before.scope_bucket[:2]

    def test_empty_input_skips(self) -> None:
        snap, state = _scored([make_node("a")])
        state = state.evolve(scored=ScoredTable())
        res = _run(state)
        assert res.state is state and res.trace.skipped and res.trace.skip_reason == "no-candidates"

    def test_nothing_to_collapse_keeps_the_table(self) -> None:
        snap, state = _scored([make_node("a", "event", title="a", summary="a")])
        res = _run(state)
        assert res.state.scored is state.scored and not res.trace.skipped
        assert res.state.meta["dedupCollapsed"] == {}

    def test_input_not_mutated_and_deterministic(self) -> None:
        snap, state = _scored(
            [
                make_node("a", "event", importance=9, title="x", summary="same"),
                make_node("c", "event", importance=1, title="x", summary="same"),
            ]
        )
        before = freeze(state)
        a = _run(state)
        b = _run(state)
        assert_same(before, freeze(state))
        assert_same(a.state.scored, b.state.scored)
        assert a.state.meta == b.state.meta
        assert a.trace.score_kind == "weighted_score" and a.trace.score_direction == "higher_is_better"


def _pairwise_reference(snap, index, window: int, ratio: float = 0.8) -> tuple[list[int], dict, dict]:
    """The module docstring's rules, pair by pair in plain Python: (kept node indices, collapsed, reasons)."""
    rows = [int(i) for i in index[:window]]

    def text(i: int) -> tuple[str, str] | None:
        key = dedup_text_key(snap.node(i))
        return (str(snap.scope_owner_key[i]), key) if key else None

    def same_range(i: int, j: int) -> bool:
        s1, e1, s2, e2 = (float(v) for v in (snap.seq_start[i], snap.seq_end[i], snap.seq_start[j], snap.seq_end[j]))
        if any(np.isnan(v) for v in (s1, e1, s2, e2)) or snap.node(i).type != snap.node(j).type:
            return False
        if snap.node(i).type not in ("synopsis", "message") or snap.scope_owner_key[i] != snap.scope_owner_key[j]:
            return False
        shorter = min(e1 - s1 + 1, e2 - s2 + 1)
        return (e1 > s1 or e2 > s2) and shorter > 0 and (min(e1, e2) - max(s1, s2) + 1) / shorter >= ratio

    kept: list[int] = []
    collapsed: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    for i in rows:
        for j in kept:  # kept rows in ranking order: the first duplicate is the best-ranked one
            exact = text(i) is not None and text(i) == text(j)
            if exact or same_range(i, j):
                collapsed.setdefault(snap.ids[j], []).append(snap.ids[i])
                reasons[snap.ids[i]] = "exact-text" if exact else "range-overlap"
                break
        else:
            kept.append(i)
    order = {snap.ids[i]: r for r, i in enumerate(rows)}
    collapsed = dict(sorted(collapsed.items(), key=lambda kv: order[kv[0]]))
    reasons = dict(sorted(reasons.items(), key=lambda kv: order[kv[0]]))
    return kept + [int(i) for i in index[window:]], collapsed, reasons


class TestAgainstPairwiseRules:
    def test_random_tables_match_the_pairwise_rules(self) -> None:
        """Random mixes of repeated texts, overlapping summary/message ranges and two POV owners, including
        chains (a row whose best duplicate was itself dropped) and rows below the window."""
        rng = np.random.default_rng(7)
        small = DedupStage(
            SelectionSettings(top_k=4, max_recall_nodes=4, llm_candidate_pool=4),
            DiversitySettings(candidate_multiplier=3),
        )
        collapsing = 0
        for case in range(30):
            nodes = []
            for k in range(int(rng.integers(2, 18))):
                type_ = str(rng.choice(["synopsis", "message", "event"]))
                first = int(rng.integers(0, 8))
                last = first + (0 if type_ == "message" else int(rng.integers(0, 5)))
                scope = pov_scope(str(rng.choice(["Alice", "Bob"]))) if rng.random() < 0.4 else None
                nodes.append(
                    make_node(
                        f"c{case}n{k}", type_, importance=float(rng.uniform(0, 10)), seq=first,
                        seq_range=(first, last), scope=scope, summary=f"text {int(rng.integers(0, 4))}",
                        title=str(rng.choice(["", "T"])),
                    )
                )
            snap, state = _scored(nodes)
            for stage in (DedupStage(), small):
                res = _run(state, stage)
                kept, collapsed, reasons = _pairwise_reference(snap, state.scored.index, stage.window())
                assert ids_of(snap, res.state.scored.index) == ids_of(snap, kept)
                assert res.state.meta["dedupCollapsed"] == collapsed
                assert list(res.state.meta["dedupCollapsed"]) == list(collapsed)
                assert res.state.meta["dedupReasons"] == reasons
                assert list(res.state.meta["dedupReasons"]) == list(reasons)
                collapsing += bool(reasons)
        assert collapsing > 20  # the cases do exercise collapsing


# --- the per-structure keys after a real append (update path) -----------------------------------------------

_CHAT, _NOW = "dd", 1_700_000_000_000


def _node(i: int, prev: str | None, summary: str | None = None) -> Node:
    kind = ("synopsis", "message", "event")[i % 3]
    return Node(id=f"n{i:03d}", type=kind, seq=i, importance=1.0, prev_id=prev,
                fields={"summary": summary or f"the same text {i % 4}", "title": f"scene {i % 2}"},
                seq_range=(i, i + 1 + i % 3) if i % 5 else None)


def _store(path: Path) -> Store:
    store = Store(path)
    with store.write(_CHAT) as w:
        w.upsert_nodes([_node(i, f"n{i - 1:03d}" if i else None) for i in range(15)])
    return store


def _fresh(store: Store) -> GraphSnapshot:
    return build_snapshot(store.snapshot_source(_CHAT, ""), now_ms=_NOW)


def _partition(ids: np.ndarray) -> list[list[int]]:
    """The nodes grouped by text-key number (−1: no key, alone), in node order: numbers compare only by equality."""
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(ids.tolist()):
        groups.setdefault(k if k >= 0 else -1 - i, []).append(i)
    return list(groups.values())


def _examined(snap: GraphSnapshot) -> tuple[dedup._SnapshotKeys, tuple[np.ndarray, np.ndarray]]:
    keys = dedup._snapshot_keys(snap)
    masks = dedup._range_rows(snap, keys, RANGE_TYPES)
    dedup._text_ids(snap, keys, np.arange(snap.n, dtype=np.int64))
    return keys, masks


class TestAfterAppend:
    def test_keys_and_range_masks_updated_equal_built(self, tmp_path: Path) -> None:
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _CHAT, "", now_ms=_NOW)
            parent, _ = _examined(first)
            with store.write(_CHAT) as w:
                w.upsert_nodes([_node(15, "n014")])
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            assert snap.structure.parent is first.structure and snap.structure.change.appended_only
            keys = dedup._snapshot_keys(snap)
            assert keys.numbers is parent.numbers and keys.lock is parent.lock  # shared, not copied
            assert keys.text_id[: first.n].tolist() == parent.text_id.tolist() and keys.text_id[-1] == -2
            fresh = _fresh(store)
            built, built_masks = _examined(fresh)
            masks = dedup._range_rows(snap, keys, RANGE_TYPES)  # carried from the parent's, not built
            assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes()
                       for a, b in zip(masks, built_masks, strict=True))
            _examined(snap)
            assert _partition(keys.text_id) == _partition(built.text_id)

    def test_a_rewritten_node_is_numbered_again(self, tmp_path: Path) -> None:
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _CHAT, "", now_ms=_NOW)
            _examined(first)
            with store.write(_CHAT) as w:  # the text of node 0 now equals node 6's (not 4's); node 2 loses its range
                w.upsert_nodes([_node(0, None, summary="the same text 2"),
                                _node(2, "n001").model_copy(update={"seq_range": None})])
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            keys = dedup._snapshot_keys(snap)
            rewritten = snap.structure.change.rewritten.tolist()
            assert set(rewritten) == {0, 2} and (keys.text_id[rewritten] == -2).all()
            built, built_masks = _examined(_fresh(store))
            masks = dedup._range_rows(snap, keys, RANGE_TYPES)
            assert all(a.tobytes() == b.tobytes() for a, b in zip(masks, built_masks, strict=True))
            _examined(snap)
            assert _partition(keys.text_id) == _partition(built.text_id)
            assert keys.text_id[0] == keys.text_id[6] != keys.text_id[4]

    def test_the_shared_key_table_starts_over_past_its_bound(self, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
        """Each edited text adds a key to the table a chain of deltas shares; past the bound the next structure
        numbers its keys in a table of its own, and the partition still equals a fresh build's."""
        monkeypatch.setattr(dedup, "MIN_KEYS_KEPT", 0)
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            keys, _ = _examined(snap)
            sizes = [len(keys.numbers)]
            for edit in range(30):  # node 1's text rewritten again and again: one new key each time
                with store.write(_CHAT) as w:
                    w.upsert_nodes([_node(1, "n000", summary=f"edited text {edit}")])
                parent_numbers, parent_size = keys.numbers, len(keys.numbers)
                snap = cache.get(store, _CHAT, "", now_ms=_NOW)
                keys, _ = _examined(snap)
                assert (keys.numbers is parent_numbers) is (parent_size <= 2 * snap.n)
                sizes.append(len(keys.numbers))
                assert _partition(keys.text_id) == _partition(_examined(_fresh(store))[0].text_id)
            # Four distinct texts at first (summary i % 4 decides the title too); one more key per edit up to
            # 2 n + 1 = 31 (edit 27); then a fresh table: the four texts and edit 27's, plus edits 28 and 29.
            assert sizes[0] == 4 and max(sizes) == 2 * snap.n + 1 and sizes[-1] == 7
