"""Scoring stage (reference §3.12): lexical, hybrid, scope buckets, story time, knowledge gate, weights,
ranking and meta; conformance scenarios 6, 10, 19, 20, 21, 22, 23, 32, 36 and the departures 2, 4, 8, 10."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from score_helpers import (
    DAY_MS,
    NOW,
    assert_same,
    candidates_for,
    freeze,
    ids_of,
    make_graph,
    make_node,
    make_snapshot,
    make_state,
    owner,
    pov_scope,
    region_scope,
    run_scoring,
    settings,
    story,
)
from snapshot_equality import exactly_equal

from memory_recall import bench
from memory_recall.heap import memory_owner
from memory_recall.model.graph import MemoryScope, Node, StoryTimeSpan
from memory_recall.model.state import KnowledgeOwner, KnowledgeState
from memory_recall.pipeline import scoring
from memory_recall.pipeline.context import detect_cue_mode
from memory_recall.pipeline.kernels.lexical import PackedFieldTable, prepare_sources
from memory_recall.pipeline.result import json_dumps
from memory_recall.pipeline.retrieve import retrieve
from memory_recall.pipeline.scoring import (
    SCOPE_BUCKETS,
    ScoringStage,
    explain_row,
    knowledge_gate,
    neighbour_carry_values,
    rank_fusion_values,
    resolve_owner_rows,
    scope_buckets,
    temporal_director,
)
from memory_recall.pipeline.state import Candidates, ContextInfo, Providers, RecallQuery
from memory_recall.settings import ContextSettings, RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache, build_snapshot

# ------------------------------------------------------------------------------------------------------------
# Lexical (scenario 6) and hybrid score (scenario 10), through the stage
# ------------------------------------------------------------------------------------------------------------


class TestScenario6Lexical:
    @pytest.mark.parametrize(
        ("type_", "fields", "message", "expected"),
        [
            ("character", {"name": "Alice"}, "alice", 1.0),
            ("character", {"name": "Alice", "summary": "常驻角色"}, "Alice 现在怎么样了", 0.92),
            ("character", {"name": "Bob"}, "Alice 现在怎么样了", 0.0),
            ("character", {"name": "A"}, "A", 1.0),
            ("event", {"summary": "hello world"}, "Hello   World", 0.6724),
            ("event", {"title": "red dragon attack"}, "the dragon attack was fierce", 0.288),
            ("event", {"summary": "艾琳觉得钟楼入口非常可疑"}, "钟楼里到底有什么", 0.0533),
        ],
    )
    def test_scenario_6_lexical_scores(self, type_: str, fields: dict, message: str, expected: float) -> None:
        snap = make_snapshot(make_graph([make_node("n", type_, **fields)]))
        out = run_scoring(make_state(snap, message, multi_intent=False)).state.scored
        assert out.lexical_score[0] == pytest.approx(expected, abs=1e-4)

    def test_bm25_score_feeds_the_lexical_score_as_a_max(self) -> None:
        snap = make_snapshot(make_graph([make_node("a", name="Alice"), make_node("b", name="Bob")]))
        cands = candidates_for(snap, bm25={"a": 0.5, "b": 0.95})
        out = run_scoring(make_state(snap, "alice", candidates=cands)).state.scored
        lex = dict(zip(ids_of(snap, out.index), out.lexical_score, strict=True))
        assert lex == {"a": 1.0, "b": 0.95}  # field match 1.0 beats BM25 0.5; BM25 0.95 beats field match 0

    def test_bm25_ignored_when_the_channel_is_off(self) -> None:
        snap = make_snapshot(make_graph([make_node("b", name="Bob")]))
        cands = candidates_for(snap, bm25={"b": 0.95})
        out = run_scoring(
            make_state(snap, "alice", candidates=cands), settings(lexical={"enable_bm25": False})
        )
        assert out.state.scored.lexical_score.tolist() == [0.0]

    def test_lexical_boost_off_gives_zero_lexical_and_zero_weight(self) -> None:
        snap = make_snapshot(make_graph([make_node("a", name="Alice", importance=5)]))
        out = run_scoring(make_state(snap, "alice"), settings(lexical={"enable_lexical_boost": False}))
        table = out.state.scored
        assert table.lexical_score.tolist() == [0.0]
        assert table.final_score[0] == pytest.approx(0.1 * 0.5 / 1.0, abs=1e-15)  # δ = 0: weight sum 1.0


class TestLexicalFieldCache:
    """The stage keeps each candidate's prepared lexical fields with the snapshot; the scores must be exactly
    what the kernel computes from the node's fields on every call."""

    def _graph(self):
        return make_graph(
            [
                make_node("alice", name="Alice", summary="常驻角色，住在钟楼"),
                make_node("tower", "location", name="Bell Tower", summary="The old tower by the harbour"),
                make_node("ev", "event", title="Ａlice rang the bell", participants=["Alice", "Bram"]),
                make_node("cafe", "event", summary="café at the Old Market", status="open"),
                make_node("blank", "event"),  # no lexical field at all
                make_node("lic", "event", summary="lic"),  # inside "alice": containment, no shared unit
            ]
        )

    def _plain_scores(self, snap, message: str) -> dict[str, float]:
        from memory_recall.model.graph import PRIMARY_LEXICAL_FIELDS, SECONDARY_LEXICAL_FIELDS
        from memory_recall.pipeline.kernels import lexical_score

        sources = make_state(snap, message).plan.lexical_sources
        out = {}
        for i, node_id in enumerate(snap.ids):
            node = snap.node(i)
            primary = [t for key in PRIMARY_LEXICAL_FIELDS for t in node.field_text(key)]
            secondary = [t for key in SECONDARY_LEXICAL_FIELDS for t in node.field_text(key)]
            out[node_id] = lexical_score(primary, secondary, sources) if primary or secondary else 0.0
        return out

    @pytest.mark.parametrize("message", ["Alice at the bell tower?", "钟楼 alice", "Café, old market", "zzz"])
    def test_cold_and_warm_cache_give_the_uncached_scores(self, message: str) -> None:
        from memory_recall.pipeline._graph_cache import cached

        snap = make_snapshot(self._graph())
        cold = run_scoring(make_state(snap, message)).state
        table, was_cached = cached(snap, ("lexical-fields",), lambda: None)
        assert was_cached and sorted(table.keys()) == list(range(snap.n))  # filled for every candidate scored
        assert len(table.vocab) > 0  # the snapshot's unit vocabulary numbers the packed fields' units
        assert table.field_texts(snap.ids.index("blank")) == ()  # packed without fields: scores 0
        assert table.field_texts(snap.ids.index("lic")) == ("lic", "lic")  # the summary, then the joined text
        warm = run_scoring(make_state(snap, message)).state
        assert_same(cold.scored, warm.scored)
        assert cold.meta == warm.meta
        lexical = dict(zip(ids_of(snap, cold.scored.index), cold.scored.lexical_score.tolist(), strict=True))
        plain = self._plain_scores(snap, message)
        assert lexical == {k: plain[k] for k in lexical}
        assert any(v > 0 for v in lexical.values()) == (message != "zzz")

    def test_only_candidates_are_prepared(self) -> None:
        from memory_recall.pipeline._graph_cache import cached

        snap = make_snapshot(self._graph())
        run_scoring(make_state(snap, "alice", candidates=candidates_for(snap, ["tower", "ev"])))
        table, _ = cached(snap, ("lexical-fields",), lambda: None)
        assert sorted(table.keys()) == sorted(snap.ids.index(x) for x in ("tower", "ev"))
        assert table.field_texts(snap.ids.index("alice")) is None

    def test_preparing_a_node_keeps_no_parsed_node(self) -> None:
        """The field table keeps a node's prepared fields; the snapshot does not also keep the parsed node (the
        preparation is the same as from a kept parse)."""
        import memory_recall.pipeline.scoring as scoring_module

        snap = make_snapshot(self._graph())
        prepared = [scoring_module._prepared_node(snap, i) for i in range(snap.n)]
        assert dict(snap._nodes) == {}
        assert prepared == [scoring_module._prepared_node(make_snapshot(self._graph()), i) for i in range(snap.n)]
        kept = make_snapshot(self._graph())
        for i in range(kept.n):
            kept.node(i)
        assert [scoring_module._prepared_node(kept, i) for i in range(kept.n)] == prepared
        assert sum(p is not None for p in prepared) == snap.n - 1  # "blank" has no lexical text

    def test_emptied_table_gives_the_same_scores(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import memory_recall.pipeline.scoring as scoring_module
        from memory_recall.pipeline._graph_cache import cached

        message = "Alice at the bell tower?"
        snap = make_snapshot(self._graph())
        expected = run_scoring(make_state(snap, message)).state.scored
        fresh = make_snapshot(self._graph())
        monkeypatch.setattr(scoring_module, "MAX_PREPARED_NODES", 2)
        pairs = [["tower", "ev"], ["alice", "lic"], ["alice", "cafe"]]
        for pair in pairs:  # 2 + 2 passes the bound: the table starts over with the second pair
            run_scoring(make_state(fresh, message, candidates=candidates_for(fresh, pair)))
        table = cached(fresh, ("lexical-fields",), lambda: None)[0]
        assert sorted(table.keys()) == sorted(fresh.ids.index(x) for x in ("alice", "cafe"))
        # A batch larger than the bound is packed whole (the table starts over with just that batch).
        got = run_scoring(make_state(fresh, message)).state.scored
        assert sorted(table.keys()) == list(range(fresh.n))
        assert_same(expected, got)

    def test_a_new_snapshot_sees_changed_fields(self) -> None:
        snap = make_snapshot(make_graph([make_node("n", name="Alice")]))
        assert run_scoring(make_state(snap, "alice")).state.scored.lexical_score.tolist() == [1.0]
        changed = make_snapshot(make_graph([make_node("n", name="Bob")]))
        assert run_scoring(make_state(changed, "alice")).state.scored.lexical_score.tolist() == [0.0]


class TestScenario10Hybrid:
    def _final(self, cfg=None, **cols) -> float:
        snap = make_snapshot(make_graph([make_node("n", importance=cols.pop("importance"))]))
        cands = candidates_for(snap, **{k: {"n": v} for k, v in cols.items()})
        return float(run_scoring(make_state(snap, "zzz", candidates=cands), cfg).state.scored.final_score[0])

    def test_scenario_10_vector_only(self) -> None:
        assert self._final(vector=0.9, importance=5) == pytest.approx(0.2711864406779661, abs=1e-15)

    def test_scenario_10_all_parts(self) -> None:
        got = self._final(graph=1.0, vector=0.8, bm25=0.5, importance=8)
        assert got == pytest.approx(0.6016949152542372, abs=1e-15)

    def test_scenario_10_lexical_weight_zero(self) -> None:
        cfg = settings(lexical={"lexical_weight": 0.0})
        assert self._final(cfg, graph=1.0, vector=0.8, bm25=0.5, importance=8) == pytest.approx(
            0.62, abs=1e-15
        )

    def test_scenario_10_time_decay(self) -> None:
        days = [1, 7, 30, 365]
        nodes = [make_node(f"d{d}", created_time=NOW - d * DAY_MS) for d in days]
        snap = make_snapshot(make_graph(nodes))
        table = run_scoring(make_state(snap, "zzz")).state.scored
        decay = dict(zip(ids_of(snap, table.index), table.decay, strict=True))
        expected = [0.918123, 0.864947, 0.845106, 0.828974]
        for d, e in zip(days, expected, strict=True):
            assert decay[f"d{d}"] == pytest.approx(e, abs=1e-6)

    def test_cooccurrence_boost_is_not_added_twice(self) -> None:
        """The co-occurrence stage already adds its boost to ``graph_score`` (reference §3.11)."""
        snap = make_snapshot(make_graph([make_node("n")]))
        cands = candidates_for(snap, graph={"n": 0.77726}, boost={"n": 0.27726})
        table = run_scoring(make_state(snap, "zzz", candidates=cands)).state.scored
        assert table.graph_score[0] == 0.77726


# ------------------------------------------------------------------------------------------------------------
# Scope buckets (scenario 19) and the scenario 36 ranking
# ------------------------------------------------------------------------------------------------------------


def _scope_graph():
    nodes = [
        make_node("o-cur", "location", name="A", scope=region_scope("钟楼")),
        make_node("o-adj", "location", name="B", scope=region_scope("旧城区")),
        make_node("o-sec", "location", name="C", scope=region_scope("王都", "旧城区")),
        make_node("o-glob", "location", name="D", scope=region_scope("王都")),
        make_node("p-erin", "pov_memory", summary="x", scope=pov_scope("艾琳")),
        make_node("p-lucia", "pov_memory", summary="y", scope=pov_scope("露西亚")),
        make_node("p-user", "pov_memory", summary="z", scope=pov_scope("玩家", "user")),
    ]
    return make_snapshot(make_graph(nodes))


_SCENE = ContextInfo(
    owner_keys=("character:艾琳",),
    owner_mode="heuristic",
    active_user_pov_owner="玩家",
    active_region="钟楼",
    adjacent_regions=("旧城区",),
)


def _buckets(snap, context, **kw) -> dict[str, str]:
    idx = np.arange(snap.n)
    return dict(zip(snap.ids, scope_buckets(snap, idx, context, **kw).tolist(), strict=True))


class TestScenario19ScopeBuckets:
    def test_scenario_19_buckets(self) -> None:
        assert _buckets(_scope_graph(), _SCENE) == {
            "o-cur": "objectiveCurrentRegion",
            "o-adj": "objectiveAdjacentRegion",
            "o-sec": "objectiveAdjacentRegion",
            "o-glob": "objectiveGlobal",
            "p-erin": "characterPov",
            "p-lucia": "otherPov",
            "p-user": "userPov",
        }

    def test_scenario_19_no_active_region_is_global(self) -> None:
        ctx = ContextInfo(owner_keys=_SCENE.owner_keys, active_user_pov_owner="玩家")
        got = _buckets(_scope_graph(), ctx)
        assert {got[k] for k in ("o-cur", "o-adj", "o-sec", "o-glob")} == {"objectiveGlobal"}

    def test_scenario_19_pov_memory_off_makes_every_pov_other(self) -> None:
        got = _buckets(
            _scope_graph(), _SCENE, settings=settings(context={"enable_pov_memory": False}).context
        )
        assert {got[k] for k in ("p-erin", "p-lucia", "p-user")} == {"otherPov"}

    def test_scoped_memory_off_makes_everything_global(self) -> None:
        got = _buckets(
            _scope_graph(), _SCENE, settings=settings(context={"enable_scoped_memory": False}).context
        )
        assert set(got.values()) == {"objectiveGlobal"}

    def test_owner_key_with_node_id_matches_departure_2(self) -> None:
        """Departure 2 (§7 item 4): ``character:艾琳#n-erin`` names the same owner as ``character:艾琳``."""
        ctx = ContextInfo(owner_keys=("character:艾琳#n-erin",), owner_mode="request")
        assert _buckets(_scope_graph(), ctx)["p-erin"] == "characterPov"

    def test_owner_comparison_is_case_insensitive(self) -> None:
        snap = make_snapshot(make_graph([make_node("p", "pov_memory", summary="x", scope=pov_scope("Erin"))]))
        assert _buckets(snap, ContextInfo(owner_keys=("character:erin",)))["p"] == "characterPov"

    def test_user_pov_without_user_owner_is_user_bucket(self) -> None:
        assert _buckets(_scope_graph(), ContextInfo())["p-user"] == "userPov"
        assert _buckets(_scope_graph(), ContextInfo(active_user_pov_owner="someone"))["p-user"] == "otherPov"

    def test_legacy_owner_counts_unless_the_request_named_the_owners(self) -> None:
        heuristic = ContextInfo(owner_mode="heuristic", active_character_pov_owner="露西亚")
        request = ContextInfo(
            owner_keys=("character:艾琳",), owner_mode="request", active_character_pov_owner="露西亚"
        )
        assert _buckets(_scope_graph(), heuristic)["p-lucia"] == "characterPov"
        assert _buckets(_scope_graph(), request)["p-lucia"] == "otherPov"


    def test_scenes_on_one_snapshot_keep_their_own_buckets(self) -> None:
        """The scene codes are kept per snapshot and scene: alternating scenes (and the region setting) on one
        snapshot gives each scene its own buckets, never the previous scene's."""
        snap = _scope_graph()
        lucia = ContextInfo(owner_keys=("character:露西亚",), owner_mode="request", active_region="旧城区")
        no_region = settings(context={"enable_region_scoped_objective": False}).context
        for _ in range(2):
            got = _buckets(snap, _SCENE)
            assert (got["p-erin"], got["p-lucia"], got["o-cur"], got["o-adj"]) == (
                "characterPov", "otherPov", "objectiveCurrentRegion", "objectiveAdjacentRegion")
            got = _buckets(snap, lucia)
            assert (got["p-erin"], got["p-lucia"], got["o-cur"], got["o-adj"], got["o-sec"]) == (
                "otherPov", "characterPov", "objectiveGlobal", "objectiveCurrentRegion", "objectiveAdjacentRegion")
            got = _buckets(snap, lucia, settings=no_region)
            assert (got["p-lucia"], got["o-adj"], got["o-sec"]) == ("characterPov", "objectiveGlobal",
                                                                    "objectiveGlobal")


def _scenario_36():
    nodes = [
        make_node("obj-global", "event", importance=8, title="事件", scope=region_scope("旧城区")),
        make_node("char-pov", "pov_memory", importance=4, summary="回忆", scope=pov_scope("艾琳")),
    ]
    return make_snapshot(make_graph(nodes))


class TestScenario36Ranking:
    def test_scenario_36_inferred_owners_rank_objective_first(self) -> None:
        """Reference §3.1: ``activeCharacterPovOwner 艾琳`` only becomes an owner through a unique
        knowledge-owner catalog match; there are no knowledge owners, so the context stage infers no scene
        owner (owner keys ``()``, legacy owner ``""``). Departure 2: those inferred owners are what scoring
        uses, so char-pov is ``otherPov`` (priority 0) and obj-global (旧城区 ≠ active 钟楼 → global) ranks
        first."""
        snap = _scenario_36()
        ctx = ContextInfo(active_region="钟楼", owner_mode="unresolved")
        res = run_scoring(make_state(snap, "hello", context=ctx))
        assert ids_of(snap, res.state.scored.index) == ["obj-global", "char-pov"]
        assert res.state.meta["scopeBuckets"] == {"objectiveGlobal": ["obj-global"], "otherPov": ["char-pov"]}

    def test_scenario_36_request_owner_ranks_the_pov_in_its_real_bucket(self) -> None:
        """Departure 2: when the request names 艾琳 as the scene owner, the POV is ranked as ``characterPov``
        before scoring (the reference only learns the owner after ranking, §7 item 5). The owner has no
        knowledge entry: the gate is ``no-owner-state`` (visible, weight 0.55)."""
        snap = _scenario_36()
        ctx = ContextInfo(owner_keys=("character:艾琳",), owner_mode="request", active_region="钟楼")
        res = run_scoring(make_state(snap, "hello", context=ctx))
        assert ids_of(snap, res.state.scored.index) == ["char-pov", "obj-global"]
        assert res.state.scored.knowledge_mode == ("no-owner-state", "no-owner-state")
        assert res.state.scored.knowledge_weight.tolist() == [0.55, 0.55]


class TestOrdering:
    def test_bucket_dominates_relevance(self) -> None:
        nodes = [
            make_node("global-strong", "location", importance=10, name="X", scope=region_scope("王都")),
            make_node("current-weak", "location", importance=0, name="Y", scope=region_scope("钟楼")),
        ]
        snap = make_snapshot(make_graph(nodes))
        cands = candidates_for(snap, graph={"global-strong": 2.0}, vector={"global-strong": 1.0})
        res = run_scoring(
            make_state(snap, "zzz", candidates=cands, context=ContextInfo(active_region="钟楼"))
        )
        assert ids_of(snap, res.state.scored.index) == ["current-weak", "global-strong"]

    def test_ties_break_by_node_id_byte_order_departure_10(self) -> None:
        """Departure 10: equal scores order by node id (byte order), not by score-map insertion order."""
        snap = make_snapshot(make_graph([make_node("b"), make_node("a"), make_node("B")]))
        res = run_scoring(make_state(snap, "zzz"))
        assert ids_of(snap, res.state.scored.index) == ["B", "a", "b"]

    def test_weighted_then_final_score(self) -> None:
        snap = make_snapshot(make_graph([make_node("lo", importance=1), make_node("hi", importance=9)]))
        table = run_scoring(make_state(snap, "zzz")).state.scored
        assert ids_of(snap, table.index) == ["hi", "lo"]
        assert np.all(np.diff(table.weighted_score) <= 0)


# ------------------------------------------------------------------------------------------------------------
# Knowledge gate (scenarios 20, 21, 22 and departures 2, 4)
# ------------------------------------------------------------------------------------------------------------


def _gate(snap, node_id, keys, *, raw=0.0, graph=0.0, lexical=0.0, bucket="objectiveGlobal", low=False):
    idx = np.array([snap.index[node_id]])
    return knowledge_gate(
        snap,
        idx,
        resolve_owner_rows(snap, keys),
        np.array([raw]),
        np.array([graph]),
        np.array([lexical]),
        np.array([bucket], dtype=object),
        inject_low_confidence=low,
    )


class TestScenario20KnowledgeGate:
    def _snap(self, *, mistaken: bool):
        a = owner("A", known=["E"], visibility={"E": 1.0}, mistaken=["E"] if mistaken else [])
        lucia = owner("露西亚", known=["E"])
        return make_snapshot(make_graph([make_node("E", "event", title="事件")], owners=[a, lucia]))

    def test_scenario_20_known_event_is_anchored(self) -> None:
        g = _gate(self._snap(mistaken=False), "E", ["character:a"])
        assert g.visible.tolist() == [True] and g.anchored.tolist() == [True]
        assert g.mode.tolist() == ["anchored"] and g.visibility.tolist() == [1.0]

    def test_scenario_20_mistaken_override_hides_it(self) -> None:
        g = _gate(self._snap(mistaken=True), "E", ["character:a"])
        assert g.visible.tolist() == [False]
        assert g.reason.tolist() == ["mistaken-objective"] and g.mode.tolist() == ["mistaken-objective"]

    def test_scenario_20_second_owner_keeps_it_visible(self) -> None:
        snap = self._snap(mistaken=True)
        g = _gate(snap, "E", ["character:a", "character:露西亚"])
        assert g.visible.tolist() == [True] and g.mode.tolist() == ["anchored"]
        assert g.owner_visible[:, 0].tolist() == [False, True]
        assert g.coverage.tolist() == [0.5]
        ctx = ContextInfo(owner_keys=("character:a", "character:露西亚"), owner_mode="request")
        meta = run_scoring(make_state(snap, "zzz", context=ctx)).state.meta
        assert meta["knowledgeVisibleOwnersByNode"] == {"E": ["character:露西亚"]}
        assert meta["knowledgeSuppressedOwnersByNode"] == {"E": ["character:a"]}

    def test_multi_owner_full_coverage_gets_the_bonus(self) -> None:
        a = owner("A", known=["E"])
        b = owner("B", known=["E"])
        snap = make_snapshot(make_graph([make_node("E", "event", title="e")], owners=[a, b]))
        ctx = ContextInfo(owner_keys=("character:a", "character:b"), owner_mode="request")
        table = run_scoring(make_state(snap, "zzz", context=ctx)).state.scored
        assert table.owner_coverage.tolist() == [1.0]
        assert table.owner_coverage_weight[0] == pytest.approx(1 + 0.5 * 0.08)


class TestScenario21GateThresholds:
    @pytest.fixture()
    def snap(self):
        erin = owner("Erin", node_id="erin")  # an owner entry with a nodeId and no scores for "obj"
        nodes = [make_node("erin", name="Erin"), make_node("obj", "location", name="Somewhere")]
        return make_snapshot(make_graph(nodes, owners=[erin]))

    @pytest.mark.parametrize(
        ("bucket", "kw", "visible", "mode", "threshold", "visibility"),
        [
            ("objectiveGlobal", {}, False, "suppressed", 0.56, 0.0),
            ("objectiveAdjacentRegion", {}, False, "suppressed", 0.42, 0.0),
            # ``raw`` is the calibrated cosine u (departure 4 as amended; NaN: no vector evidence).
            ("objectiveGlobal", {"raw": 0.82}, True, "rescued", 0.56, 0.68),
            ("objectiveGlobal", {"raw": 0.81}, False, "suppressed", 0.56, 0.0),
            ("objectiveGlobal", {"lexical": 0.85, "raw": 0.6}, True, "rescued", 0.56, 0.68),
            ("objectiveGlobal", {"lexical": 0.85, "raw": math.nan}, True, "rescued", 0.56, 0.68),
            ("objectiveGlobal", {"lexical": 0.85, "raw": 0.59}, False, "suppressed", 0.56, 0.0),
            ("objectiveGlobal", {"graph": 1.1, "raw": 0.6}, True, "rescued", 0.56, 0.68),
            ("objectiveGlobal", {"graph": 1.1, "raw": math.nan}, False, "suppressed", 0.56, 0.0),
            ("objectiveGlobal", {"graph": 1.1, "raw": 0.59}, False, "suppressed", 0.56, 0.0),
            ("objectiveCurrentRegion", {"raw": 0.6}, True, "rescued", 0.34, 0.68),
            ("objectiveCurrentRegion", {"raw": 0.59}, False, "suppressed", 0.34, 0.0),
            ("objectiveCurrentRegion", {"graph": 0.82, "raw": 0.6}, True, "rescued", 0.34, 0.68),
            ("objectiveCurrentRegion", {"graph": 0.82, "raw": math.nan}, False, "suppressed", 0.34, 0.0),
            ("objectiveAdjacentRegion", {"raw": 0.6}, False, "suppressed", 0.42, 0.0),
            ("objectiveGlobal", {"low": True}, True, "soft-visible", 0.0, 0.0),
        ],
    )
    def test_scenario_21_thresholds_and_rescue(self, snap, bucket, kw, visible, mode, threshold, visibility):
        g = _gate(snap, "obj", ["character:erin"], bucket=bucket, **kw)
        assert g.visible.tolist() == [visible]
        assert g.mode.tolist() == [mode]
        assert g.threshold[0] == pytest.approx(threshold)
        assert g.visibility[0] == pytest.approx(visibility)
        assert g.reason.tolist() == ["" if visible else "low-visibility"]

    def test_scenario_21_rescue_never_reads_the_score_map_cosine_departure_4(self, snap) -> None:
        """Departure 4 (§7 item 7, amended): neither the blend-weighted score nor the raw cosine of the score map
        rescues: a raw 0.9 (what multilingual-e5-small gives almost any pair) is no evidence without the query
        vectors to calibrate it (tests/pipeline/test_knowledge_gate_calibration.py runs the calibrated rule). The
        weighted score still drives the ranking of what the gate lets through."""
        ctx = ContextInfo(owner_keys=("character:erin",), owner_mode="request")
        for vector, raw in ((0.63, 0.9), (0.9, 0.63), (0.99, 0.99)):
            cands = candidates_for(snap, ["obj"], vector={"obj": vector}, raw={"obj": raw})
            res = run_scoring(make_state(snap, "zzz", candidates=cands, context=ctx))
            assert len(res.state.scored) == 0 and res.state.meta["knowledgeSuppressedNodes"] == ["obj"]
            assert res.state.meta["knowledgeRescuedNodes"] == []

    def test_missing_owner_entry_is_no_owner_state(self, snap) -> None:
        g = _gate(snap, "obj", ["character:nobody"])
        assert g.visible.tolist() == [True] and g.mode.tolist() == ["no-owner-state"]

    def test_manual_hidden_and_manual_known(self) -> None:
        a = owner("A", manual_known=["k"], hidden=["h"], known=["h"])
        nodes = [make_node("k", "location", name="K"), make_node("h", "location", name="H")]
        snap = make_snapshot(make_graph(nodes, owners=[a]))
        assert _gate(snap, "k", ["character:a"]).mode.tolist() == ["manual-known"]
        hidden = _gate(snap, "h", ["character:a"], raw=0.99)
        assert hidden.visible.tolist() == [False] and hidden.reason.tolist() == ["manual-hidden"]


def _scenario_22():
    nodes = [
        make_node("erin", "character", seq=1, name="Erin"),
        make_node("L1", "location", seq=2, name="Crypt"),
        make_node("L2", "location", seq=3, name="Market"),
        make_node("L3", "location", seq=4, name="Secret room"),
    ]
    erin = owner("Erin", node_id="erin", known=["L3"], visibility={"L2": 0.6})
    return make_snapshot(make_graph(nodes, owners=[erin]))


class TestScenario22GateEndToEnd:
    def test_scenario_22_scored_table(self) -> None:
        """Reference: selected ``[erin, L3, L2]``, suppressed ``[L1]``, anchored ``[erin, L3]``, L2
        soft-visible 0.6. erin and L3 have identical scores (both anchored, weight 1.18, global, undated,
        importance 5): the reference keeps score-map insertion order (erin first); departure 10 breaks the tie
        by node id byte order and ``"L3" < "erin"``, so the scored table reads ``[L3, erin, L2]``. Meta id
        lists keep score-map order."""
        snap = _scenario_22()
        ctx = ContextInfo(owner_keys=("character:erin",), owner_mode="request")
        res = run_scoring(make_state(snap, "where to go", context=ctx))
        table, meta = res.state.scored, res.state.meta
        assert ids_of(snap, table.index) == ["L3", "erin", "L2"]
        assert table.weighted_score[0] == table.weighted_score[1]
        assert table.final_score[0] == table.final_score[1]
        assert meta["knowledgeSuppressedNodes"] == ["L1"]
        assert meta["knowledgeAnchoredNodes"] == ["erin", "L3"]
        assert meta["visibilitySuppressedReasons"] == {"L1": "low-visibility"}
        assert meta["gate_suppressed"] == ["L1"]
        assert table.knowledge_mode == ("anchored", "anchored", "soft-visible")
        assert table.knowledge_visibility[2] == 0.6
        assert table.knowledge_weight.tolist() == pytest.approx([1.18, 1.18, 0.55 + 0.6 * 0.6])
        assert meta["knowledgeGateMode"] == "anchored-soft-visibility"


class TestOwnPovDeparture2:
    def test_own_pov_is_anchored_with_a_node_id_entry(self) -> None:
        """Departure 2 (§7 item 4): the owner entry has a nodeId, so the reference compares
        ``character:erin#erin`` with the POV's ``character:erin`` and never anchors it (suppressed at 0.18);
        here the owner's own POV is anchored. Another character's POV is suppressed and recorded."""
        nodes = [
            make_node("erin", name="Erin"),
            make_node("pov-own", "pov_memory", summary="mine", scope=pov_scope("Erin")),
            make_node("pov-other", "pov_memory", summary="theirs", scope=pov_scope("Lucia")),
        ]
        snap = make_snapshot(make_graph(nodes, owners=[owner("Erin", node_id="erin")]))
        ctx = ContextInfo(owner_keys=("character:erin#erin",), owner_mode="request")
        res = run_scoring(make_state(snap, "zzz", context=ctx))
        table = res.state.scored
        rows = dict(zip(ids_of(snap, table.index), table.knowledge_mode, strict=True))
        assert rows == {"pov-own": "anchored", "erin": "anchored"}
        assert ids_of(snap, table.index)[0] == "pov-own"  # characterPov ranks first
        assert res.state.meta["gate_suppressed"] == ["pov-other"]


class TestGateIsFinal:
    def test_hidden_and_previously_suppressed_nodes_are_dropped(self) -> None:
        snap = make_snapshot(make_graph([make_node("a"), make_node("b"), make_node("c")]))
        hidden = np.zeros(snap.n, dtype=bool)
        hidden[snap.index["b"]] = True
        state = make_state(snap, "zzz", meta={"visibility_hidden_mask": hidden, "gate_suppressed": ["c"]})
        res = run_scoring(state)
        assert ids_of(snap, res.state.scored.index) == ["a"]
        assert res.state.meta["gate_suppressed"] == ["b", "c"]
        assert res.state.meta["visibilitySuppressedReasons"] == {
            "b": "visibility-filter",
            "c": "gate-suppressed",
        }

    def test_inactive_and_archived_candidates_are_dropped_but_not_suppressed(self) -> None:
        snap = make_snapshot(make_graph([make_node("a"), make_node("b"), make_node("z", archived=True)]))
        state = make_state(snap, "zzz")
        active = state.active.copy()
        active[snap.index["b"]] = False
        res = run_scoring(state.evolve(active=active))
        assert ids_of(snap, res.state.scored.index) == ["a"]
        assert res.state.meta["gate_suppressed"] == []
        assert res.trace.notes["dropped_inactive"] == 2

    def test_cognitive_memory_off_disables_the_gate(self) -> None:
        snap = _scenario_22()
        ctx = ContextInfo(owner_keys=("character:erin",), owner_mode="request")
        res = run_scoring(
            make_state(snap, "zzz", context=ctx), settings(context={"enable_cognitive_memory": False})
        )
        assert len(res.state.scored) == 4
        assert res.state.meta["knowledgeGateMode"] == "disabled"
        assert set(res.state.scored.knowledge_mode) == {"disabled"}
        assert res.state.scored.knowledge_weight.tolist() == [1.0] * 4


# ------------------------------------------------------------------------------------------------------------
# Story time (scenario 23)
# ------------------------------------------------------------------------------------------------------------


def _scenario_23():
    nodes = [
        make_node("cur", seq=1, name="Cur", story_time=story("now")),
        make_node("adj", seq=2, name="Adj", story_time=story("prev")),
        make_node("old", seq=3, name="Old", story_time=story("old")),
        make_node("fut", seq=4, name="Fut", story_time=story("later")),
        make_node("hyp", seq=5, name="Hyp", story_time=story("", label="someday", tense="future")),
        make_node("und", seq=6, name="Und"),
    ]
    return make_snapshot(make_graph(nodes, segments=[("old", 1), ("prev", 4), ("now", 5), ("later", 6)]))


class TestScenario23StoryTime:
    def _run(self, message: str, **ctx_kw):
        snap = _scenario_23()
        ctx = ContextInfo(story_segment_id="now", cue_mode=detect_cue_mode([message]), **ctx_kw)
        res = run_scoring(make_state(snap, message, context=ctx))
        table = res.state.scored
        rows = {
            i: (b, round(float(w), 6))
            for i, b, w in zip(
                ids_of(snap, table.index), table.temporal_bucket, table.temporal_weight, strict=True
            )
        }
        return ids_of(snap, table.index), rows, res.state.meta

    def test_scenario_23_no_cue(self) -> None:
        order, rows, meta = self._run("现场怎么样")
        assert order == ["cur", "adj", "und", "old"]
        assert rows == {
            "cur": ("current", 1.15),
            "adj": ("adjacentPast", 1.0),
            "und": ("undated", 0.88),
            "old": ("distantPast", 0.64),
        }
        assert meta["temporalSuppressedNodes"] == ["fut", "hyp"]
        assert meta["temporalBuckets"]["future"] == [
            "fut",
            "hyp",
        ]  # suppressed nodes stay in the temporal map
        assert "fut" not in sum(meta["scopeBuckets"].values(), [])

    def test_scenario_23_flashback_cue(self) -> None:
        order, rows, meta = self._run("以前发生过什么")
        assert order == ["cur", "und", "adj", "old"]
        assert rows["adj"] == ("flashback", 1.02) and rows["old"] == ("flashback", 1.02)
        assert meta["temporalRescuedNodes"] == ["adj", "old"]
        assert meta["temporalSuppressedNodes"] == ["fut", "hyp"]

    def test_scenario_23_future_cue(self) -> None:
        order, rows, meta = self._run("明天打算做什么")
        assert order == ["cur", "adj", "und", "old", "fut", "hyp"]
        assert rows["fut"] == ("future", 0.74) and rows["hyp"] == ("future", 0.72)
        assert meta["temporalSuppressedNodes"] == []

    def test_segment_order_given_by_the_context_wins(self) -> None:
        order, rows, meta = self._run("现场怎么样", story_segment_order=4)  # the segment "prev" is active
        assert order[0] == "adj" and rows["adj"] == ("current", 1.15)
        assert meta["temporalSuppressedNodes"] == ["cur", "fut", "hyp"]  # "now" lies after "prev"

    def test_soft_directing_off_keeps_buckets_but_not_weights(self) -> None:
        snap = _scenario_23()
        ctx = ContextInfo(story_segment_id="now")
        res = run_scoring(
            make_state(snap, "x", context=ctx), settings(context={"story_time_soft_directing": False})
        )
        table = res.state.scored
        assert len(table) == 6 and set(table.temporal_weight.tolist()) == {1.0}
        assert ids_of(snap, table.index)[0] == "cur"

    def test_timeline_off_is_undated_weight_1(self) -> None:
        res = run_scoring(
            make_state(_scenario_23(), "x", context=ContextInfo(story_segment_id="now")),
            settings(context={"enable_story_timeline": False}),
        )
        assert set(res.state.scored.temporal_bucket) == {"undated"}
        assert set(res.state.scored.temporal_weight.tolist()) == {1.0}

    def test_span_and_flashback_tense(self) -> None:
        nodes = [
            make_node("span", story_time_span=StoryTimeSpan(start_segment_id="prev", end_segment_id="later")),
            make_node("fb", story_time=story("old", tense="flashback")),
            make_node("lbl", story_time=story("", label="sometime")),
        ]
        snap = make_snapshot(make_graph(nodes, segments=[("old", 1), ("prev", 4), ("now", 5), ("later", 6)]))
        tr = temporal_director(snap, np.arange(3), ContextInfo(story_segment_id="now"))
        assert tr.bucket.tolist() == ["current", "flashback", "undated"]
        assert tr.weight.tolist() == [1.15, 0.72, 0.9]
        no_active = temporal_director(snap, np.arange(3), ContextInfo())
        assert no_active.bucket.tolist() == ["undated"] * 3 and no_active.weight.tolist() == [0.92] * 3


# ------------------------------------------------------------------------------------------------------------
# Meta (scenario 32) and the contract
# ------------------------------------------------------------------------------------------------------------


class TestScenario32LexicalOnly:
    def test_scenario_32_lexical_top_hit(self) -> None:
        nodes = [
            make_node("char-1", name="Alice", summary="常驻角色", importance=1),
            make_node("char-2", name="Bob", summary="常驻角色", importance=5),
        ]
        snap = make_snapshot(make_graph(nodes))
        res = run_scoring(make_state(snap, "Alice 现在怎么样了"))
        meta = res.state.meta
        assert ids_of(snap, res.state.scored.index)[0] == "char-1"
        assert meta["lexicalBoostedNodes"] == 1
        top = meta["lexicalTopHits"][0]
        assert (top["nodeId"], top["lexicalScore"]) == ("char-1", 0.92)
        assert top["label"] == "Alice" and top["type"] == "character"
        assert meta["scoredCandidates"] == 2


class TestExplanation:
    def test_explain_row_parts_add_up(self) -> None:
        snap = _scenario_22()
        cands = candidates_for(snap, graph={"L2": 1.3}, vector={"L2": 0.4}, bm25={"L3": 0.3})
        ctx = ContextInfo(owner_keys=("character:erin",), owner_mode="request")
        cfg = settings()
        table = run_scoring(make_state(snap, "market", candidates=cands, context=ctx), cfg).state.scored
        for row in range(len(table)):
            exp = explain_row(snap, table, row, cfg.scoring, cfg.lexical)
            assert exp.total() == table.weighted_score[row]
            for part in exp.parts:
                assert part.value * part.weight == pytest.approx(part.contribution, rel=1e-12, abs=1e-15)

    @hyp_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def test_parts_sum_to_weighted_score_for_random_inputs(self, data) -> None:
        n = data.draw(st.integers(1, 10))
        names = ["Ann", "Bo", "Cy"]
        regions = ["钟楼", "旧城区", "王都", ""]
        segs = ["s1", "s2", "s3", ""]
        nodes = []
        for i in range(n):
            kind = data.draw(st.sampled_from(["character", "location", "event", "pov_memory"]))
            scope = (
                pov_scope(
                    data.draw(st.sampled_from(names)), data.draw(st.sampled_from(["character", "user"]))
                )
                if kind == "pov_memory"
                else region_scope(data.draw(st.sampled_from(regions)), data.draw(st.sampled_from(regions)))
            )
            nodes.append(
                make_node(
                    f"n{i}",
                    kind,
                    importance=data.draw(st.floats(0, 10)),
                    created_time=NOW - data.draw(st.integers(0, 400 * DAY_MS)),
                    scope=scope,
                    story_time=story(
                        data.draw(st.sampled_from(segs)),
                        tense=data.draw(st.sampled_from(["unknown", "flashback", "future"])),
                    ),
                    name=data.draw(st.sampled_from(["Alice", "Bob", "钟楼守卫", ""])),
                )
            )
        ids = [f"n{i}" for i in range(n)]
        owners = [
            owner(
                nm,
                known=data.draw(st.lists(st.sampled_from(ids), max_size=3)),
                visibility=data.draw(st.dictionaries(st.sampled_from(ids), st.floats(0, 1), max_size=3)),
                mistaken=data.draw(st.lists(st.sampled_from(ids), max_size=2)),
            )
            for nm in names
        ]
        snap = make_snapshot(make_graph(nodes, owners=owners, segments=[("s1", 1), ("s2", 3), ("s3", 4)]))
        unit = st.floats(0, 1)
        cands = Candidates(
            index=np.arange(n, dtype=np.int64),
            graph_score=np.array(data.draw(st.lists(st.floats(0, 2), min_size=n, max_size=n))),
            vector_score=np.array(data.draw(st.lists(unit, min_size=n, max_size=n))),
            vector_raw=np.array(data.draw(st.lists(unit, min_size=n, max_size=n))),
            bm25_score=np.array(data.draw(st.lists(unit, min_size=n, max_size=n))),
            cooccurrence_boost=np.zeros(n),
        )
        keys = tuple(
            f"character:{x.lower()}" for x in data.draw(st.lists(st.sampled_from(names), max_size=3))
        )
        ctx = ContextInfo(
            owner_keys=keys,
            owner_mode="request",
            active_region=data.draw(st.sampled_from(regions)),
            adjacent_regions=("旧城区",),
            story_segment_id=data.draw(st.sampled_from(segs)),
            cue_mode=data.draw(st.sampled_from(["none", "flashback", "future"])),
        )
        cfg = settings(scoring={"inject_low_confidence_objective_memory": data.draw(st.booleans())})
        res = run_scoring(make_state(snap, "Alice 钟楼", candidates=cands, context=ctx), cfg)
        table = res.state.scored
        assert np.all(np.abs(table.parts.sum(axis=1) - table.weighted_score) <= 1e-12)
        mult = (
            table.scope_weight * table.knowledge_weight * table.owner_coverage_weight * table.temporal_weight
        )
        np.testing.assert_allclose(table.weighted_score, table.final_score * mult, rtol=1e-12, atol=1e-15)
        assert (
            len(table)
            + len(res.state.meta["knowledgeSuppressedNodes"])
            + len(res.state.meta["temporalSuppressedNodes"])
            == n
        )
        assert not set(ids_of(snap, table.index)) & set(res.state.meta["gate_suppressed"])
        lengths = {
            len(getattr(table, f))
            for f in (
                "final_score",
                "scope_bucket",
                "knowledge_mode",
                "temporal_bucket",
                "owner_coverage",
                "decay",
            )
        }
        assert lengths == {len(table)}


class TestFusionAndNeighbourCarry:
    """``ScoringSettings.fusion = "rrf"`` and ``neighbour_carry`` (off by default; the transcript profile sets
    the carry)."""

    @staticmethod
    def _chain():
        nodes = [
            make_node(f"t{i}", "event", seq=i + 1, summary=f"turn {i}").model_copy(
                update={"prev_id": f"t{i - 1}" if i > 0 else None, "next_id": f"t{i + 1}" if i < 3 else None}
            )
            for i in range(4)
        ]
        return make_snapshot(make_graph(nodes))

    def test_rank_fusion_values(self) -> None:
        got = rank_fusion_values(np.array([0.2, 0.9, 0.0, 0.5, np.nan]), np.arange(5))
        np.testing.assert_allclose(got, [61 / 63, 1.0, 0.0, 61 / 62, 0.0])
        tie = rank_fusion_values(np.array([0.5, 0.5]), np.array([1, 0]))
        np.testing.assert_allclose(tie, [61 / 62, 1.0])

    def test_neighbour_carry_values(self) -> None:
        prev = np.array([-1, 0, 1, 2])
        nxt = np.array([1, 2, 3, -1])
        got = neighbour_carry_values(np.array([0.0, 1.0, 0.1]), np.array([0, 1, 3]), prev, nxt, 0.5)
        np.testing.assert_allclose(got, [0.5, 1.0, 0.1])  # t2 (the neighbour of t3) is no candidate

    def test_defaults_are_the_reference(self) -> None:
        cfg = settings()
        assert cfg.scoring.fusion == "hybrid" and cfg.scoring.neighbour_carry == 0.0

    def test_default_profile_sets_the_carry_of_message_nodes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from memory_recall.settings import load_settings

        for name in ("MEMORY_RECALL_SCORING__NEIGHBOUR_CARRY", "MEMORY_RECALL_SCORING__MESSAGE_NEIGHBOUR_CARRY",
                     "MEMORY_RECALL_CONFIG", "MEMORY_RECALL_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        for profile in ("default", "transcript", None):
            cfg = load_settings(profile=profile)
            assert (cfg.scoring.message_weights, cfg.scoring.message_neighbour_carry) == (True, 0.7)
            assert cfg.scoring.neighbour_carry == 0.0 and cfg.scoring.fusion == "hybrid"  # extracted: the reference

    def test_carry_lifts_the_reply_turn_and_parts_add_up(self) -> None:
        snap = self._chain()
        cands = candidates_for(snap, vector={"t1": 0.8}, bm25={"t1": 1.0})
        state = make_state(snap, "zzz", candidates=cands)
        plain = run_scoring(state).state.scored
        cfg = settings(scoring={"neighbour_carry": 0.5})
        table = run_scoring(state, cfg).state.scored
        assert ids_of(snap, plain.index)[0] == "t1"
        order = ids_of(snap, table.index)
        assert order[0] == "t1" and set(order[1:3]) == {"t0", "t2"}
        row = order.index("t2")
        assert table.vector_score[row] == pytest.approx(0.4) and table.lexical_score[row] == pytest.approx(0.5)
        for r in range(len(table)):
            exp = explain_row(snap, table, r, cfg.scoring, cfg.lexical)
            assert exp.total() == table.weighted_score[r]
            for part in exp.parts:
                assert part.value * part.weight == pytest.approx(part.contribution, rel=1e-12, abs=1e-15)

    @pytest.mark.parametrize("carry", [0.0, 0.75])
    def test_rrf_fusion_parts_add_up(self, carry: float) -> None:
        snap = self._chain()
        cands = candidates_for(
            snap, graph={"t3": 0.4}, vector={"t0": 0.9, "t1": 0.3}, bm25={"t1": 0.2, "t3": 1.0}
        )
        cfg = settings(scoring={"fusion": "rrf", "neighbour_carry": carry})
        table = run_scoring(make_state(snap, "zzz", candidates=cands), cfg).state.scored
        assert np.all(np.abs(table.parts.sum(axis=1) - table.weighted_score) <= 1e-12)
        assert table.vector_score.max() == 1.0 and table.lexical_score.max() == 1.0
        for r in range(len(table)):
            exp = explain_row(snap, table, r, cfg.scoring, cfg.lexical)
            assert exp.total() == table.weighted_score[r]
            for part in exp.parts:
                assert part.value * part.weight == pytest.approx(part.contribution, rel=1e-12, abs=1e-15)


class TestStageContract:
    def test_empty_candidates_skip(self) -> None:
        snap = _scenario_22()
        state = make_state(snap, "x", candidates=Candidates())
        res = run_scoring(state)
        assert res.state is state
        assert res.trace.skipped and res.trace.skip_reason == "no-candidates"
        assert res.trace.score_kind == "weighted_score" and res.trace.score_direction == "higher_is_better"

    def test_input_not_mutated(self) -> None:
        snap = _scenario_22()
        ctx = ContextInfo(owner_keys=("character:erin",), owner_mode="request")
        state = make_state(snap, "market", context=ctx, meta={"gate_suppressed": ["nope"]})
        before = freeze(state)
        run_scoring(state)
        assert_same(before, freeze(state))

    def test_deterministic(self) -> None:
        snap = _scenario_23()
        ctx = ContextInfo(story_segment_id="now")
        a = run_scoring(make_state(snap, "Cur", context=ctx))
        b = run_scoring(make_state(snap, "Cur", context=ctx))
        assert_same(a.state.scored, b.state.scored)
        assert_same(a.state.meta, b.state.meta)

    def test_trace(self) -> None:
        res = run_scoring(make_state(_scenario_22(), "x"))
        assert res.trace.name == "scoring" and res.trace.count_in == 4 and res.trace.count_out == 4
        assert res.trace.elapsed_ms >= 0 and not res.trace.skipped

    def test_stage_stores_its_arguments(self) -> None:
        cfg = settings()
        stage = ScoringStage(cfg.scoring, cfg.lexical, cfg.context)
        assert stage.settings is cfg.scoring and stage.lexical is cfg.lexical and stage.context is cfg.context


class TestScale:
    def test_gate_is_linear_in_owners_times_candidates(self) -> None:
        """§7 item 22: the reference gate re-normalises the whole knowledge state per call (O(owners² × N));
        here 8 owners × 300 candidates on a 3,000-node graph is a handful of array operations."""
        n = 3000
        nodes = [
            make_node(f"n{i:05d}", "location", name=f"Place {i}", scope=region_scope(f"R{i % 7}"))
            for i in range(n)
        ]
        owners = [
            owner(
                f"O{o}",
                known=[f"n{i:05d}" for i in range(o, n, 9)],
                visibility={f"n{i:05d}": 0.5 for i in range(o, n, 5)},
            )
            for o in range(8)
        ]
        snap = make_snapshot(make_graph(nodes, owners=owners))
        ids = [f"n{i:05d}" for i in range(0, n, 10)]
        cands = candidates_for(snap, ids, vector={i: 0.5 for i in ids})
        ctx = ContextInfo(
            owner_keys=tuple(f"character:o{o}" for o in range(8)),
            owner_mode="request",
            active_region="R1",
            adjacent_regions=("R2",),
        )
        state = make_state(snap, "place 42", candidates=cands, context=ctx)
        run_scoring(state)  # warm the per-snapshot caches
        start = time.perf_counter()
        res = run_scoring(state)
        elapsed = time.perf_counter() - start
        assert len(res.state.scored) > 0
        assert elapsed < 1.0, elapsed
        assert math.isfinite(float(res.state.scored.weighted_score.sum()))


# --- first-match codes (the scope-bucket and story-time verdicts read their values from tables by them) -------


@hyp_settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=6).flatmap(
        lambda k: st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=k, max_size=k)
    )
)
def test_first_match_codes_pick_what_np_select_picks(conditions: list[list[bool]]) -> None:
    from memory_recall.pipeline.scoring import _first_match

    conds = [np.array(c, dtype=bool) for c in conditions]
    names = np.array([f"rule{j}" for j in range(len(conds))] + ["default"], dtype=object)
    expected = np.select(conds, list(names[:-1]), default="default") if conds else np.full(5, "default")
    assert names[_first_match(conds, 5)].tolist() == expected.tolist()
    # A condition the same for every element may be given as a plain bool.
    plain = [bool(c[0]) if len(set(c.tolist())) == 1 else c for c in conds]
    assert names[_first_match(plain, 5)].tolist() == expected.tolist()


# --- the vectorised knowledge gate and story-time director against plain per-node transliterations ----------

_OWNER_NAMES = ("A", "B", "C")
_NODE_IDS = ("n0", "n1", "n2", "n3", "n4", "n5")


def _reference_gate(snap, idx, rows, raw, graph, lexical, buckets, low):
    """Reference §1.5 per owner and node (departures 2 and 4), then the multi-owner merge, in plain Python."""
    know = snap.knowledge
    thresholds = {"objectiveCurrentRegion": 0.34, "objectiveAdjacentRegion": 0.42,
                  "objectiveGlobal": 0.0 if low else 0.56}
    out = []
    for c, i in enumerate(idx):
        pov = bool(snap.is_pov[i])
        threshold = 0.18 if pov else thresholds.get(buckets[c], 0.4)
        current = buckets[c] == "objectiveCurrentRegion"
        u = raw[c]  # the calibrated cosine (departure 4 as amended); NaN = no vector evidence
        support = not math.isnan(u) and u >= 0.6
        strong = (u >= 0.82 or (current and u >= 0.6) or (lexical[c] >= 0.85 and (support or math.isnan(u)))
                  or (graph[c] >= 1.1 and support) or (current and graph[c] >= 0.82 and support))
        per = []  # (mode, visible, visibility, threshold, anchored, rescued)
        for r in rows:
            if not 0 <= r < know.known.shape[0]:
                per.append(("no-owner-state", True, 0.0, 0.0, False, False))
            elif know.hidden[r, i]:
                per.append(("manual-hidden", False, 0.0, 0.0, False, False))
            elif know.mistaken[r, i] and not pov:
                per.append(("mistaken-objective", False, 0.0, 0.0, False, False))
            else:
                anchored = bool(know.known[r, i] or know.own_pov[r, i])
                base = max(float(np.round(float(know.visibility[r, i]), 7)), 1.0 if anchored else 0.0)
                rescued = not anchored and not pov and strong
                vis = max(base, 0.68) if rescued else base
                visible = anchored or vis >= threshold or rescued
                mode = ("manual-known" if know.manual_known[r, i] else "anchored" if anchored else
                        "rescued" if rescued else "soft-visible" if visible else "suppressed")
                per.append((mode, visible, vis, threshold, anchored, rescued))
        seen = [p for p in per if p[1]]
        mode = (seen or per)[0][0]
        if any(p[0] == "manual-known" for p in seen):
            mode = "manual-known"
        elif any(p[0] == "anchored" for p in seen):
            mode = "anchored"
        reasons = {"manual-hidden": "manual-hidden", "mistaken-objective": "mistaken-objective",
                   "suppressed": "low-visibility"}
        out.append({
            "visible": bool(seen), "mode": mode, "reason": "" if seen else reasons.get(mode, ""),
            "anchored": any(p[4] for p in seen), "rescued": any(p[5] for p in seen),
            "visibility": max(p[2] for p in per), "threshold": max(p[3] for p in per),
            "coverage": len(seen) / len(per), "owner_visible": [p[1] for p in per],
        })
    return out


_subsets = st.lists(st.sampled_from(_NODE_IDS), max_size=6, unique=True)


@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(["objective", "pov-A", "pov-B", "pov-user"]), min_size=6, max_size=6),
    owners=st.lists(
        st.tuples(_subsets, _subsets, _subsets, _subsets,
                  st.dictionaries(st.sampled_from(_NODE_IDS), st.sampled_from([0.1, 0.2, 0.35, 0.4, 0.6, 0.9]))),
        min_size=0, max_size=3,
    ),
    keys=st.lists(st.sampled_from(["character:a", "character:b", "character:c", "user:me", "character:zed"]),
                  max_size=4),
    scores=st.lists(st.tuples(st.sampled_from([math.nan, 0.0, 0.59, 0.6, 0.81, 0.82, 0.9]),
                              st.sampled_from([0.0, 0.81, 0.82, 1.09, 1.1]),
                              st.sampled_from([0.0, 0.84, 0.85, 1.0])), min_size=6, max_size=6),
    buckets=st.lists(st.sampled_from([*SCOPE_BUCKETS, "elsewhere"]), min_size=6, max_size=6),
    low=st.booleans(),
)
def test_knowledge_gate_equals_the_per_node_reference(kinds, owners, keys, scores, buckets, low) -> None:
    scopes = {"objective": None, "pov-A": pov_scope("A"), "pov-B": pov_scope("B"),
              "pov-user": pov_scope("me", "user")}
    nodes = [make_node(nid, "event", scope=scopes[kind]) for nid, kind in zip(_NODE_IDS, kinds, strict=True)]
    entries = [
        owner(name, known=known, mistaken=mistaken, manual_known=manual, hidden=hidden, visibility=vis)
        for name, (known, mistaken, manual, hidden, vis) in zip(_OWNER_NAMES, owners, strict=False)
    ]
    snap = make_snapshot(make_graph(nodes, owners=entries))
    idx = np.arange(snap.n)
    rows = resolve_owner_rows(snap, keys)
    raw, graph, lexical = (np.array(col) for col in zip(*scores, strict=True))
    got = knowledge_gate(snap, idx, rows, raw, graph, lexical, np.array(buckets, dtype=object),
                         inject_low_confidence=low)
    if not keys:  # no owner: everything visible, no-owner-state
        assert got.visible.all() and set(got.mode.tolist()) == {"no-owner-state"}
        return
    expected = _reference_gate(snap, idx, rows.tolist(), raw, graph, lexical, buckets, low)
    for c, exp in enumerate(expected):
        assert bool(got.visible[c]) == exp["visible"]
        assert got.mode[c] == exp["mode"] and got.reason[c] == exp["reason"]
        assert bool(got.anchored[c]) == exp["anchored"] and bool(got.rescued[c]) == exp["rescued"]
        assert float(got.visibility[c]) == exp["visibility"] and float(got.threshold[c]) == exp["threshold"]
        assert float(got.coverage[c]) == exp["coverage"]
        assert got.owner_visible[:, c].tolist() == exp["owner_visible"]


def _reference_temporal(node, order, active, cue):
    """Reference ``classifyStoryTemporalBucket`` for one node: (bucket, weight, suppressed, rescued, reason)."""
    point, span = node.story_time, node.story_time_span
    if not (point.segment_id or point.label or span.start_segment_id or span.end_segment_id or span.start_label
            or span.end_label):
        return ("undated", 0.88, False, False, "no-story-time")
    if point.tense in ("future", "hypothetical"):
        return ("future", 0.72 if cue == "future" else 0.2, cue != "future", False, "point-future-tense")
    if active is None:
        return ("undated", 0.92, False, False, "no-active-segment")
    start = order.get(span.start_segment_id, order.get(point.segment_id))
    end = order.get(span.end_segment_id, order.get(point.segment_id))
    if start is None or end is None:
        return ("undated", 0.9, False, False, "unknown-segment")
    if start <= active <= end:
        return ("current", 1.15, False, False, "in-active-segment")
    if end < active:
        if point.tense == "flashback" or cue == "flashback":
            cued = cue == "flashback"
            return ("flashback", 1.02 if cued else 0.72, False, cued, "flashback-cue" if cued else "flashback-tense")
        if active - end <= 2:
            return ("adjacentPast", 1.0, False, False, "recent-past")
        return ("distantPast", 0.64, False, False, "distant-past")
    return ("future", 0.74 if cue == "future" else 0.22, cue != "future", False, "after-active-segment")


_SEGMENTS = (("s1", 1), ("s2", 2), ("s4", 4), ("s5", 5), ("s9", 9))
_SEGMENT_IDS = ["", "s1", "s2", "s4", "s5", "s9", "nowhere"]


@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    times=st.lists(
        st.tuples(st.sampled_from(_SEGMENT_IDS), st.sampled_from(["", "sometime"]),
                  st.sampled_from(["unknown", "past", "future", "hypothetical", "flashback"]),
                  st.sampled_from(_SEGMENT_IDS), st.sampled_from(_SEGMENT_IDS)),
        min_size=1, max_size=6,
    ),
    active=st.sampled_from(["", "s1", "s4", "s5", "s9", "nowhere"]),
    cue=st.sampled_from(["", "flashback", "future"]),
)
def test_temporal_director_equals_the_per_node_reference(times, active, cue) -> None:
    nodes = [
        make_node(f"t{j}", "event", story_time=story(seg, label, tense),
                  story_time_span=StoryTimeSpan(start_segment_id=start, end_segment_id=end))
        for j, (seg, label, tense, start, end) in enumerate(times)
    ]
    snap = make_snapshot(make_graph(nodes, segments=_SEGMENTS))
    order = dict(_SEGMENTS)
    ctx = ContextInfo(story_segment_id=active, cue_mode=cue)
    temporal_director(snap, np.arange(snap.n)[::-2], ctx)  # some nodes first: later calls reuse their verdicts
    got = temporal_director(snap, np.arange(snap.n), ctx)
    for j, node in enumerate(nodes):
        exp = _reference_temporal(node, order, order.get(active), cue)
        assert (got.bucket[j], float(got.weight[j]), bool(got.suppressed[j]), bool(got.rescued[j]),
                got.reason[j]) == exp


@pytest.mark.parametrize("columns", [8, 0])
def test_region_tokens_as_matrix_or_ragged_give_the_same_buckets(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    import memory_recall.pipeline.scoring as scoring_module

    monkeypatch.setattr(scoring_module, "MAX_TOKEN_COLUMNS", columns)  # 0: every graph uses the ragged form
    nodes = [
        make_node("cur", "location", scope=MemoryScope(region_primary="钟楼")),
        make_node("via-path", "event", scope=MemoryScope(region_primary="王都", region_path=("旧城区", "王都"))),
        make_node("via-secondary", "event", scope=MemoryScope(region_primary="港口", region_secondary=("钟楼",))),
        make_node("far", "event", scope=MemoryScope(region_primary="港口", region_secondary=("北门", "南门"))),
        make_node("none", "event"),
    ]
    snap = make_snapshot(make_graph(nodes))
    ctx = ContextInfo(active_region="钟楼", adjacent_regions=("旧城区",))
    assert scope_buckets(snap, np.arange(5), ctx).tolist() == [
        "objectiveCurrentRegion", "objectiveAdjacentRegion", "objectiveAdjacentRegion", "objectiveGlobal",
        "objectiveGlobal",
    ]
    assert (scoring_module._snapshot_arrays(snap).token_matrix is None) == (columns == 0)


def test_scope_buckets_are_the_same_computed_at_once_or_remembered_in_parts() -> None:
    nodes = [
        make_node("mine", "pov_memory", scope=pov_scope("Erin")),
        make_node("theirs", "pov_memory", scope=pov_scope("Bram")),
        make_node("user", "pov_memory", scope=pov_scope("me", "user")),
        make_node("here", "location", scope=region_scope("钟楼")),
        make_node("near", "event", scope=region_scope("旧城区")),
        make_node("far", "event", scope=region_scope("港口")),
    ]
    scenes = [
        ContextInfo(owner_keys=("character:erin",), owner_mode="request", active_region="钟楼",
                    adjacent_regions=("旧城区",)),
        ContextInfo(owner_keys=("character:bram", "user:me"), owner_mode="request", active_region="港口"),
        ContextInfo(),
    ]
    every = np.arange(len(nodes))
    snap = make_snapshot(make_graph(nodes))
    for ctx in scenes:
        fresh = scope_buckets(make_snapshot(make_graph(nodes)), every, ctx).tolist()
        assert scope_buckets(snap, np.array([4, 1]), ctx).tolist() == [fresh[4], fresh[1]]
        assert scope_buckets(snap, every, ctx).tolist() == fresh
        no_pov = ContextSettings(enable_pov_memory=False)  # another setting: its own verdicts
        assert scope_buckets(snap, every, ctx, settings=no_pov).tolist() == scope_buckets(
            make_snapshot(make_graph(nodes)), every, ctx, settings=no_pov).tolist()
    assert scope_buckets(snap, every, scenes[0]).tolist() == [
        "characterPov", "otherPov", "userPov", "objectiveCurrentRegion", "objectiveAdjacentRegion", "objectiveGlobal",
    ]


@pytest.mark.parametrize("k", [1, 3, 62, 64])
def test_owner_lists_per_node_for_any_number_of_owners(k: int) -> None:
    from memory_recall.pipeline.scoring import _owner_lists

    rng = np.random.default_rng(k)
    columns = rng.random((k, 40)) < 0.5
    ids = np.array([f"n{j}" for j in range(40)], dtype=object)
    keys = tuple(f"character:o{o}" for o in range(k))
    seen, missing = _owner_lists(columns, ids, keys)
    assert list(seen) == ids.tolist()
    for j, nid in enumerate(ids.tolist()):
        assert seen[nid] == [keys[o] for o in range(k) if columns[o, j]]
        assert missing.get(nid, []) == [keys[o] for o in range(k) if not columns[o, j]]
        assert (nid in missing) == (not columns[:, j].all())


# The per-snapshot code columns: numpy's lower-casing and first-occurrence codes, built without numpy strings.

# "İ" lower-cases to two characters, "Σ" to a final sigma after a letter, numpy drops trailing NULs.
_TRICKY = st.text(
    alphabet=st.sampled_from(["A", "b", "İ", "ẞ", "ß", "Σ", "Α", "\x00", " ", "É", "艾", "ǅ"]), max_size=4
)


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(_TRICKY, max_size=8))
def test_lower_list_is_numpy_lower(values: list[str]) -> None:
    from memory_recall.pipeline.scoring import _lower_list

    expected = np.char.lower(np.array(values, dtype=str)).tolist() if values else []
    assert _lower_list(values) == expected


def test_lower_list_keeps_numpy_width_and_nul_rules() -> None:
    from memory_recall.pipeline.scoring import _lower_list

    assert _lower_list(["İ"]) == ["i"]  # "i̇" cut to the array's one-character width
    assert _lower_list(["İ", "ab"]) == ["i̇", "ab"]  # fits the width of "ab"
    assert _lower_list(["A\x00", "B"]) == ["a", "b"]  # trailing NUL dropped by numpy
    assert _lower_list(["Ab", "CD"]) == ["ab", "cd"]
    assert _lower_list([]) == []


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_TRICKY, max_size=8), min_size=1, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3))
def test_encode_numbers_strings_in_first_occurrence_order(columns: list[list[str]], lower: list[bool]) -> None:
    from memory_recall.pipeline.scoring import _encode

    vocab: dict[str, int] = {}
    expected_vocab: dict[str, int] = {}
    for column, low in zip(columns, lower[: len(columns)], strict=True):
        codes = _encode(column, vocab, lower=low)
        coded = (np.char.lower(np.array(column, dtype=str)).tolist() if column else []) if low else column
        expected = [expected_vocab.setdefault(v, len(expected_vocab)) for v in coded]
        assert codes.dtype == np.int32
        assert codes.tolist() == expected
    assert vocab == expected_vocab


# --- per-structure caches after a real append (update paths) ------------------------------------------------

_AW_CHAT, _AW_MODEL, _AW_NOW = "aw", "aw-model", 1_700_000_000_000


def _aw_node(i: int, prev: str | None) -> Node:
    kind = ("event", "character", "pov_memory", "location", "message", "synopsis")[i % 6]
    scope: dict[str, Any] = {"region_primary": f"Region {i % 3}", "region_secondary": [f"Zone {i % 2}"]}
    if kind == "pov_memory":
        scope = {"layer": "pov", "owner_type": "character", "owner_name": "Erin", "region_primary": "Tower"}
    words = ("dragon", "lantern", "harbor", "tower", "river", "forest")
    return Node(
        id=f"n{i:03d}", type=kind, seq=i, importance=float(1 + i % 9), prev_id=prev,
        fields={"title": f"{words[i % 6]} scene {i}", "name": f"Name{i % 4}",
                "summary": f"the {words[(i + 2) % 6]} by the {words[(i + 3) % 6]}"},
        scope=scope, seq_range=(i, i + 1 + i % 2) if i % 4 else None,
        story_time={"segment_id": f"seg-{i % 3}", "tense": "past" if i % 2 else "ongoing"},
    )


def _aw_vector(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(bench.DIM).astype(np.float32)


def _aw_store(path: Path) -> Store:
    """A store of 18 nodes (every kind, POV memories, ranges, story time), vectors and one knowledge owner."""
    store = Store(path)
    nodes = [_aw_node(i, f"n{i - 1:03d}" if i else None) for i in range(18)]
    with store.write(_AW_CHAT) as w:
        w.upsert_nodes(nodes)
        w.put_embeddings(_AW_MODEL, {n.id: _aw_vector(n.seq) for n in nodes if n.seq % 5 != 3})
        w.set_knowledge(KnowledgeState(owners={"character:erin": KnowledgeOwner(
            owner_key="character:erin", owner_type="character", owner_name="Erin",
            known_node_ids=["n001", "n002"], visibility_scores={"n004": 0.6})}))
    return store


def _aw_append(store: Store, i: int) -> None:
    """One new chat-turn node, as a chat write appends it."""
    last = max(n.seq for n in store.get_nodes(_AW_CHAT))
    with store.write(_AW_CHAT) as w:
        w.upsert_nodes([_aw_node(i, f"n{last:03d}")])
        w.put_embeddings(_AW_MODEL, {f"n{i:03d}": _aw_vector(i)})


def _aw_recall(snap: GraphSnapshot, store: Store, k: int) -> str:
    query = RecallQuery(
        user_message=("the dragon by the river", "a lantern in the tower", "Erin at the harbor")[k % 3],
        recent_lines=("[user]: hello", "[assistant]: The lantern flickers."),
        now_ms=_AW_NOW, seed=k, chat_id=_AW_CHAT, user_floor=20 + k, active_region="Region 1",
        active_owner_keys=("character:erin",),
    )
    providers = Providers(embedder=bench._PassThroughEmbedder(_AW_MODEL, {}),
                          lexical_index=lambda terms, limit: store.bm25(_AW_CHAT, terms, limit))
    return json_dumps(retrieve(snap, query, RecallSettings(profile="app"), providers))


def _aw_fresh(store: Store) -> GraphSnapshot:
    return build_snapshot(store.snapshot_source(_AW_CHAT, _AW_MODEL), now_ms=_AW_NOW)


def _arrays_differences(a: Any, b: Any) -> list[str]:
    memo = {"labels", "temporal_memo"}
    return [f.name for f in fields(a)
            if f.name not in memo and not exactly_equal(getattr(a, f.name), getattr(b, f.name))]


class TestAfterAppend:
    """The scoring stage's per-structure values after a one-node append through a real store: derived from the
    parent structure's (shared where unchanged), equal to what a fresh build gives."""

    def test_snapshot_arrays_updated_equal_built(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            _aw_recall(first, store, 0)
            parent = scoring._snapshot_arrays(first)
            for step in range(3):
                _aw_append(store, 100 + step)
                snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
                assert snap.structure.change is not None and snap.structure.change.appended_only
                updated = scoring._snapshot_arrays(snap)
                assert updated.vocab is parent.vocab  # the update path, not a build
                assert _arrays_differences(updated, scoring._snapshot_arrays(_aw_fresh(store))) == []
                assert _aw_recall(snap, store, step) == _aw_recall(_aw_fresh(store), store, step)
                parent = updated

    def test_gate_codes_of_some_columns_equal_the_full_table(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            snap = _aw_fresh(store)
            full = scoring._gate_codes(snap)
            cols = np.array([5, 0, 17, 2], dtype=np.int64)
            assert np.array_equal(scoring._gate_codes(snap, cols), full[:, cols])

    def test_a_state_write_builds_the_arrays_again(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            parent = scoring._snapshot_arrays(first)
            with store.write(_AW_CHAT) as w:
                w.set_knowledge(KnowledgeState(owners={"character:erin": KnowledgeOwner(
                    owner_key="character:erin", owner_type="character", owner_name="Erin",
                    known_node_ids=["n003"])}))
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            assert snap.structure.parent is first.structure and snap.structure.change.state_changed
            built = scoring._snapshot_arrays(snap)
            assert built.vocab is not parent.vocab
            assert _arrays_differences(built, scoring._snapshot_arrays(_aw_fresh(store))) == []

    def test_a_rewrite_that_changes_a_coded_string_builds_again(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            parent = scoring._snapshot_arrays(first)
            old = store.get_node(_AW_CHAT, "n000")
            assert old is not None
            with store.write(_AW_CHAT) as w:
                w.upsert_nodes([old.model_copy(update={"scope": MemoryScope(region_primary="Somewhere New")})])
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            built = scoring._snapshot_arrays(snap)
            assert built.vocab is not parent.vocab
            assert _arrays_differences(built, scoring._snapshot_arrays(_aw_fresh(store))) == []

    def test_field_table_shares_the_parent_rows(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            sources = prepare_sources(["the dragon by the river", "lantern scene 1", "harbor"])
            table = scoring._field_table(first)
            table.scores(np.arange(first.n), sources, functools.partial(scoring._prepared_node, first))
            old = store.get_node(_AW_CHAT, "n004")
            assert old is not None
            with store.write(_AW_CHAT) as w:  # a rewrite of one node's fields plus a new node
                w.upsert_nodes([old.model_copy(update={"fields": {**old.fields, "title": "river gate"}})])
            _aw_append(store, 100)
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            assert snap.structure.parent is first.structure
            carried = scoring._field_table(snap)
            assert carried._nodes is table._nodes and carried.vocab is table.vocab  # shared, not copied
            rewritten = snap.index["n004"]
            assert carried.field_texts(rewritten) is None and carried.field_texts(snap.n - 1) is None
            keys = np.arange(snap.n)
            got = carried.scores(keys, sources, functools.partial(scoring._prepared_node, snap))
            fresh = _aw_fresh(store)
            want = scoring._field_table(fresh).scores(keys, sources, functools.partial(scoring._prepared_node, fresh))
            assert got.tobytes() == want.tobytes()
            # The parent table still scores its own graph bit for bit after handing its buffers over.
            again = table.scores(np.arange(first.n), sources, functools.partial(scoring._prepared_node, first))
            base = PackedFieldTable(first.n, 1000).scores(
                np.arange(first.n), sources, functools.partial(scoring._prepared_node, first))
            assert again.tobytes() == base.tobytes()

    def test_field_table_keeps_the_rows_of_a_rewrite_with_the_same_fields(self, tmp_path: Path) -> None:
        """A node rewritten with its fields unchanged (here a new region) keeps its packed row, in place; the node
        whose title changed is packed again; the scores equal a fresh build's bit for bit."""
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            sources = prepare_sources(["the dragon by the river", "lantern scene 1", "harbor", "river gate"])
            table = scoring._field_table(first)
            table.scores(np.arange(first.n), sources, functools.partial(scoring._prepared_node, first))
            moved, retitled = store.get_node(_AW_CHAT, "n003"), store.get_node(_AW_CHAT, "n004")
            assert moved is not None and retitled is not None
            with store.write(_AW_CHAT) as w:
                w.upsert_nodes([
                    moved.model_copy(update={"scope": MemoryScope(region_primary="Somewhere New")}),
                    retitled.model_copy(update={"fields": {**retitled.fields, "title": "river gate"}}),
                ])
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            change = snap.structure.change
            assert change is not None and snap.structure.parent is first.structure
            i3, i4 = snap.index["n003"], snap.index["n004"]
            assert change.rewritten.tolist() == sorted([i3, i4])
            assert change.refielded is not None and change.refielded.tolist() == [i4]
            carried = scoring._field_table(snap)
            assert carried._slot[i3] == table._slot[first.index["n003"]]  # the same packed row
            assert carried.field_texts(i3) == table.field_texts(first.index["n003"])
            assert carried.field_texts(i4) is None  # packed again on first use
            assert carried._dead == 1
            keys = np.arange(snap.n)
            got = carried.scores(keys, sources, functools.partial(scoring._prepared_node, snap))
            fresh = _aw_fresh(store)
            want = scoring._field_table(fresh).scores(keys, sources, functools.partial(scoring._prepared_node, fresh))
            assert got.tobytes() == want.tobytes()
            prepared = scoring._prepared_node(fresh, i4)
            assert prepared is not None and carried.field_texts(i4) == tuple(f.text for f in prepared.fields)
            # The fixture's name, new title and summary, lower-cased, then all three joined (prepare_node's fields).
            assert carried.field_texts(i4) == (
                "name0", "river gate", "the dragon by the lantern", "name0 river gate the dragon by the lantern")
            assert carried.field_texts(i4) != table.field_texts(first.index["n004"])

    def test_scene_codes_carried_with_the_vocabulary(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            ctx = ContextInfo(owner_keys=("character:erin",), active_region="region 1")
            scope_buckets(first, np.arange(first.n), ctx)
            _aw_append(store, 100)
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            got = scope_buckets(snap, np.arange(snap.n), ctx)
            assert list(scoring._structure_scenes(snap).codes) == list(scoring._structure_scenes(first).codes)
            assert got.tolist() == scope_buckets(_aw_fresh(store), np.arange(snap.n), ctx).tolist()

    def test_a_rewrite_that_keeps_the_coded_strings_is_updated(self, tmp_path: Path) -> None:
        with _aw_store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            parent = scoring._snapshot_arrays(first)
            edited = [store.get_node(_AW_CHAT, f"n{i:03d}") for i in (3, 7, 8)]
            with store.write(_AW_CHAT) as w:  # new summaries, same scope strings and region tokens
                w.upsert_nodes([n.model_copy(update={"fields": {**n.fields, "summary": "edited"}})
                                for n in edited if n])
            _aw_append(store, 100)
            snap = cache.get(store, _AW_CHAT, _AW_MODEL, now_ms=_AW_NOW)
            assert snap.structure.change.rewritten.size >= 3 and snap.structure.change.appended_only
            updated = scoring._snapshot_arrays(snap)
            assert updated.vocab is parent.vocab
            assert _arrays_differences(updated, scoring._snapshot_arrays(_aw_fresh(store))) == []


class TestRescueSampleCarried:
    """The rescue sample (the rows the calibration measures against) is kept per structure and, after an
    appended-only delta, served from or copied out of the parent's samples where the vector memory is shared —
    always equal, bit for bit, to :func:`rescue_sample` of the current matrix and mask."""

    CHAT, MODEL = "rescue", "m"

    def _write(self, store, ids, rng) -> None:
        from memory_recall.model.graph import Node

        with store.write(self.CHAT) as w:
            w.upsert_nodes([Node(id=i, type="event", seq=k, fields={"title": i}, seq_range=(k, k + 1))
                            for k, i in ids])
        store.put_embeddings(self.CHAT, self.MODEL, {i: rng.normal(size=8).astype(np.float32) for _, i in ids})

    def test_after_appends_and_a_rewritten_vector_equals_a_fresh_gather(self, tmp_path, monkeypatch) -> None:
        from memory_recall.pipeline import scoring
        from memory_recall.store import Store
        from memory_recall.store.snapshot import SnapshotCache

        monkeypatch.setattr(scoring, "RESCUE_MAX_SAMPLE", 12)  # a stride over 40 nodes
        rng = np.random.default_rng(7)
        with Store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            self._write(store, [(k, f"n{k:03d}") for k in range(40)], rng)

            def check(snap, eligible):
                got = scoring._rescue_sample(snap, eligible)
                want = scoring.rescue_sample(snap.embeddings, eligible)
                assert got[1] == want[1] and got[0].tobytes() == want[0].tobytes()
                return got[0]

            snap = cache.get(store, self.CHAT, self.MODEL, now_ms=0)
            first = check(snap, snap.has_vector.copy())
            assert check(snap, snap.has_vector.copy()) is first  # kept for the structure
            def positions(mask):  # the even stride over the eligible nodes (rescue_sample's contract)
                at = np.flatnonzero(mask)
                return at[:: -(-at.size // 12)].tolist() if at.size > 12 else at.tolist()

            reused: list[bool] = []
            served: list[bool] = []
            same_sample: list[bool] = []
            previous = positions(snap.has_vector)
            for step in range(6):
                self._write(store, [(40 + step, f"m{step:03d}")], rng)  # one new node with its vector
                if step == 3:  # an old node's vector rewritten: the matrix is copied, nothing is reused
                    store.put_embeddings(self.CHAT, self.MODEL, {"n004": rng.normal(size=8).astype(np.float32)})
                child = cache.get(store, self.CHAT, self.MODEL, now_ms=0)
                assert child.structure.parent is not None
                eligible = child.has_vector.copy()
                eligible[-1] = step % 2 == 0  # the newest node in and out of the sample
                rows = check(child, eligible)
                reused.append(scoring._same_rows(
                    scoring._RescueSample.of(np.zeros(0, np.int64), np.zeros((0, 8), np.float32), snap.embeddings),
                    child.embeddings))
                served.append(rows is first)
                same_sample.append(positions(eligible) == previous)
                snap, first, previous = child, rows, positions(eligible)
            # The vector memory is shared except where the delta copies the matrix: the rewrite of an old vector
            # (step 3). That copy has spare rows, so the append after it grows it in place, as the first delta after
            # the build appends into the spare rows the store's read allocated. Where it is shared, the kept sample
            # is served as is exactly when the sample holds the same rows (a new node on the stride changes them).
            assert reused == [True, True, True, False, True, True]
            assert served == [r and same for r, same in zip(reused, same_sample, strict=True)]
            assert served == [False, True, True, False, False, True]

    def test_kept_samples_do_not_keep_an_old_matrix_alive(self, tmp_path, monkeypatch) -> None:
        """Each rewrite of a vector that an old node held copies the matrix. A structure carries its parent's
        samples, but a sample holds its matrix's memory only weakly: once no snapshot (nor the parent structure
        the newest one derives from) holds an old copy, the copy is freed, and the carried samples drop it. A
        copy kept alive there is the size of the chat's matrix (154 MB at 100k nodes)."""
        import gc
        import weakref

        monkeypatch.setattr(scoring, "RESCUE_MAX_SAMPLE", 12)
        rng = np.random.default_rng(8)
        with Store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            self._write(store, [(k, f"n{k:03d}") for k in range(40)], rng)
            snap = cache.get(store, self.CHAT, self.MODEL, now_ms=0)
            scoring._rescue_sample(snap, snap.has_vector.copy())
            held = [weakref.ref(memory_owner(snap.embeddings))]
            for _ in range(3):
                store.put_embeddings(self.CHAT, self.MODEL, {"n004": rng.normal(size=8).astype(np.float32)})
                snap = cache.get(store, self.CHAT, self.MODEL, now_ms=0)
                assert snap.structure.change is not None and snap.structure.change.appended_only
                got = scoring._rescue_sample(snap, snap.has_vector.copy())
                want = scoring.rescue_sample(snap.embeddings, snap.has_vector.copy())
                assert got[0].tobytes() == want[0].tobytes()
                held.append(weakref.ref(memory_owner(snap.embeddings)))
            gc.collect()
            # Only the newest copy (the parent structure, which the child keeps until its next delta, let go of
            # its buffer when the child copied it).
            assert [ref() is not None for ref in held] == [False, False, False, True]
            entries = scoring._rescue_samples(snap).entries
            # Carried from the parent less the samples whose matrix was gone by then (all), then its own.
            assert [x.owner() is held[3]() for x in entries] == [True]
            store.put_embeddings(self.CHAT, self.MODEL, {"n005": rng.normal(size=8).astype(np.float32)})
            child = cache.get(store, self.CHAT, self.MODEL, now_ms=0)
            del snap, entries
            gc.collect()
            assert held[3]() is None
            scoring._rescue_sample(child, child.has_vector.copy())
            owner = memory_owner(child.embeddings)
            assert [x.owner() is owner for x in scoring._rescue_samples(child).entries] == [True]
