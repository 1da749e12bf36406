"""Result builder (reference §3.19–§3.21 with recall-spec departures 2 and 5) and canonical JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from e2e_helpers import contract_setup, graph, make_settings, node, owner, pov, scored_state, snapshot, summaries

from memory_recall.model.graph import MemoryScope, Node, StoryTime
from memory_recall.model.state import StorySegment, TimelineState
from memory_recall.pipeline import result as result_module
from memory_recall.pipeline.result import (
    PRIVATE_META_KEYS,
    RecallResult,
    build_result,
    is_plain_json,
    json_dumps,
    plain,
)
from memory_recall.pipeline.retrieve import retrieve, run_pipeline
from memory_recall.pipeline.state import ContextInfo, Providers, RecallQuery, StageTrace
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache


def region(name: str) -> MemoryScope:
    return MemoryScope(region_primary=name)


def finalised(state, keys=(), mode="unresolved", scores=None):
    """The state as the owner stage leaves it."""
    scores = scores if scores is not None else tuple(1.0 for _ in keys)
    meta = state.with_meta(ownerPovAugmented=[])
    return state.evolve(final_owner_keys=tuple(keys), final_owner_scores=tuple(scores), final_owner_mode=mode,
                        meta=meta)


class TestSelectionAndCore:
    def test_final_cap_unique(self):
        snap = snapshot(graph([node(f"n{k}") for k in range(5)]))
        state = scored_state(snap, [(f"n{k}", 0.5 - k / 10) for k in range(5)], selection=["n3", "n1", "n3", "n0"])
        r = build_result(finalised(state), make_settings(selection={"max_recall_nodes": 2}))
        assert r.selected_node_ids == ["n3", "n1"]
        assert [m.rank for m in r.selected] == [1, 2]

    def test_synopsis_dropped_with_active_summaries(self):
        g = graph([node("syn", "synopsis", summary="S"), node("ev", "event", title="E")], summary=summaries("sum"))
        r = build_result(finalised(scored_state(snapshot(g), [])), make_settings())
        assert r.core_node_ids == ["ev"]
        assert [e["text"] for e in r.summary_entries] == ["sum"]
        assert r.stats["summaryCount"] == 1

    def test_recall_nodes_grouped(self):
        nodes = [node("c", "character", seq=2), node("l", "location", seq=4), node("r", "reflection", seq=1),
                 node("p", "pov_memory", seq=3, scope=pov("A")), node("e", "event", seq=5, title="E")]
        snap = snapshot(graph(nodes))
        state = scored_state(snap, [(i, 0.1) for i in snap.ids], selection=["c", "l", "r", "p", "e"])
        r = build_result(finalised(state), make_settings())
        assert r.recall_node_ids == ["l", "p", "c", "r"]  # recency desc; the event is a core node
        assert r.grouped_recall_node_ids == {"state": ["l", "c"], "episodic": [], "reflective": ["r"],
                                             "rule": [], "other": ["p"]}
        assert r.core_node_ids == ["e"]


class TestCoreCap:
    def test_cap_order(self):
        nodes = [node("ev-old", "event", seq=1), node("ev-new", "event", seq=9), node("ev-mid", "event", seq=5),
                 node("syn", "synopsis", seq=3, summary="S"), node("th", "thread", seq_range=None, title="T")]
        snap = snapshot(graph(nodes))
        state = scored_state(snap, [("ev-old", 0.9), ("ev-mid", 0.1)], selection=["ev-old"])
        r = build_result(finalised(state), make_settings(injector={"core_cap": 3}))
        # cap order: ev-old (selected), ev-mid (scored), ev-new (most recent unscored); then syn, th omitted
        assert r.core_node_ids == ["ev-new", "ev-mid", "ev-old"]
        assert [(o.node_id, o.reason) for o in r.omitted] == [("syn", "core-cap"), ("th", "core-cap")]
        assert r.stats["coreOmittedCount"] == 2

    def test_omitted_list_is_capped(self):
        snap = snapshot(graph([node(f"ev{k:03d}", "event", seq=k) for k in range(120)]))
        r = build_result(finalised(scored_state(snap, [])), make_settings(injector={"core_cap": 10}))
        assert r.core_node_ids == [f"ev{k:03d}" for k in range(119, 109, -1)]
        core_cut = [o.node_id for o in r.omitted if o.reason == "core-cap"]
        assert len(core_cut) == 50 and core_cut[0] == "ev109"
        assert r.stats["coreOmittedCount"] == 110
        assert r.stats["objectiveGlobalOmittedCount"] == 4  # the 10 core events share the 6 global places

    def test_gated_hidden_future_archived_excluded(self):
        nodes = [
            node("ok", "event", seq=1), node("gated", "event", seq=2), node("hidden", "event", seq=3),
            node("future", "event", seq=4, story_time=StoryTime(label="x", tense="future")),
            node("archived", "event", seq=5, archived=True), node("norange", "rule", seq=0, seq_range=None, title="R"),
        ]
        snap = snapshot(graph(nodes))
        hidden = np.zeros(snap.n, dtype=bool)
        hidden[snap.index["hidden"]] = True
        state = scored_state(snap, [], meta={"gate_suppressed": ["gated"], "visibility_hidden_mask": hidden})
        r = build_result(finalised(state), make_settings())
        assert r.core_node_ids == ["ok", "norange"]  # recency: ok (1) > norange (seq 0)

    def test_core_node_the_owner_cannot_see_is_excluded(self):
        g = graph([node("secret", "event", seq=2, title="S"), node("known", "event", seq=1, title="K")],
                  owners=[owner("Erin", visibility={"known": 0.9})])
        ctx = ContextInfo(owner_keys=("character:erin",), owner_scores=(1.0,), owner_mode="request")
        state = scored_state(snapshot(g), [], context=ctx)
        r = build_result(finalised(state, ("character:erin",), "request"), make_settings())
        assert r.core_node_ids == ["known"]


class TestScopeBuckets:
    def fixture(self):
        nodes = [
            node("pa", "pov_memory", seq=6, scope=pov("艾琳"), summary="a"),
            node("pb", "pov_memory", seq=5, scope=pov("露西亚"), summary="b"),
            node("pu", "pov_memory", seq=4, scope=pov("玩家", "user"), summary="u"),
            node("cur", "character", seq=3, scope=region("钟楼"), name="Cur"),
            *[node(f"g{k}", "character", seq=10 + k, name=f"G{k}") for k in range(8)],
        ]
        return snapshot(graph(nodes))

    def state(self, snap, selection, rows=None):
        ctx = ContextInfo(active_region="钟楼", active_user_pov_owner="玩家")
        rows = rows if rows is not None else [(i, 0.1) for i in selection]
        return scored_state(snap, rows, selection=selection, context=ctx)

    def test_buckets_with_final_owners(self):
        snap = self.fixture()
        state = self.state(snap, ["pa", "pb", "pu", "cur", "g0"])
        r = build_result(finalised(state, ("character:艾琳",), "llm"), make_settings())
        b = r.scope_buckets
        assert b.characterPov == ["pa"]  # pb's owner is not a final owner: otherPov, dropped
        assert b.characterPovByOwner == {"character:艾琳": ["pa"]}
        assert b.characterPovOwnerOrder == ["character:艾琳"]
        assert b.characterPovOwnerLabels == {"character:艾琳": "艾琳"}
        assert b.userPov == ["pu"]
        assert b.objectiveCurrentRegion == ["cur"]
        assert b.objectiveGlobal == ["g0"]
        assert r.stats["characterPovCount"] == 1 and r.stats["userPovCount"] == 1

    def test_unresolved_owners_drop_character_pov(self):
        snap = self.fixture()
        r = build_result(finalised(self.state(snap, ["pa", "g0"])), make_settings())
        assert r.scope_buckets.characterPov == [] and r.scope_buckets.objectiveGlobal == ["g0"]

    def test_user_pov_switch(self):
        snap = self.fixture()
        r = build_result(finalised(self.state(snap, ["pu"])), make_settings(injector={"inject_user_pov_memory": False}))
        assert r.scope_buckets.userPov == []

    def test_objective_global_cap_by_score_not_recency(self):
        """Departure 5: the 6 slots go to the best-scored nodes (here the oldest), shown in recall order."""
        snap = self.fixture()
        selection = [f"g{k}" for k in range(8)]
        rows = [(f"g{k}", 1.0 - k / 10) for k in range(8)]
        r = build_result(finalised(self.state(snap, selection, rows)), make_settings())
        assert r.scope_buckets.objectiveGlobal == ["g5", "g4", "g3", "g2", "g1", "g0"]
        assert [(o.node_id, o.reason) for o in r.omitted] == [("g6", "objective-global-cap"),
                                                               ("g7", "objective-global-cap")]

    def test_objective_global_disabled(self):
        snap = self.fixture()
        r = build_result(finalised(self.state(snap, ["g0"])),
                         make_settings(injector={"inject_objective_global_memory": False}))
        assert r.scope_buckets.objectiveGlobal == []
        assert [o.reason for o in r.omitted] == ["objective-global-disabled"]

    def test_recall_order_uses_story_time_without_cue(self):
        timeline = TimelineState(segments=(StorySegment(id="s1", order=1), StorySegment(id="s5", order=5)))
        nodes = [node("old", "character", seq=9, name="O", story_time=StoryTime(segment_id="s1")),
                 node("now", "character", seq=1, name="N", story_time=StoryTime(segment_id="s5"))]
        snap = snapshot(graph(nodes, timeline=timeline))
        ctx = ContextInfo(story_segment_id="s5", story_segment_order=5, cue_mode="flashback")
        state = scored_state(snap, [("old", 0.5), ("now", 0.1)], selection=["old", "now"], context=ctx)
        r = build_result(finalised(state), make_settings())
        assert r.recall_node_ids == ["now", "old"]  # current beats distantPast; recency alone says old first
        # Same snapshot, the other segment active: the priorities kept per snapshot are per story time.
        ctx = ContextInfo(story_segment_id="s1", story_segment_order=1)
        state = scored_state(snap, [("old", 0.5), ("now", 0.1)], selection=["old", "now"], context=ctx)
        r = build_result(finalised(state), make_settings())
        assert r.recall_node_ids == ["old", "now"]  # current beats future


class TestExplanations:
    def test_parts_add_up(self):
        snap = snapshot(graph([node("a"), node("b")]))
        state = scored_state(snap, [("a", 0.3), ("b", 0.2)], selection=["a", "b"],
                             meta={"selectionOrigins": {"a": "llm", "b": "owner-pov"}})
        r = build_result(finalised(state), make_settings())
        for m in r.selected:
            assert m.explanation.total() == m.score == m.explanation.score
        assert [m.origin for m in r.selected] == ["llm", "owner-pov"]

    def test_unscored_addition(self):
        snap = snapshot(graph([node("a"), node("b")]))
        state = scored_state(snap, [("a", 0.3)], selection=["a", "b"],
                             meta={"selectionOrigins": {"a": "score", "b": "scene-reconstruction"}})
        r = build_result(finalised(state), make_settings())
        b = r.selected[1]
        assert (b.score, b.origin) == (0.0, "scene-reconstruction")
        assert [(p.name, p.value, p.weight, p.contribution) for p in b.explanation.parts] == [
            ("added_by", 0.0, 0.0, 0.0)]
        assert b.explanation.notes["added_by"] == "scene-reconstruction"
        assert b.explanation.total() == b.score


class TestMetaAndJson:
    def result(self) -> RecallResult:
        snap = snapshot(graph([node("a", seq=2, name="A"), node("e", "event", seq=1, title="E")]))
        mask = np.zeros(snap.n, dtype=bool)
        state = scored_state(snap, [("a", 0.25)], selection=["a"], llm={"status": "disabled", "reason": "x"},
                             meta={"visibility_hidden_mask": mask, "activeNodeCount": 2, "weird": np.float64(0.5),
                                   "nan": float("nan")})
        state = state.evolve(skip_reasons=("vector-config-invalid",),
                             traces=(StageTrace(name="scoring", elapsed_ms=1.234, notes={"x": np.int64(3)}),))
        return build_result(finalised(state), make_settings(), timings={"scoring": 1.234, "total": 2.0})

    def test_meta(self):
        r = self.result()
        retrieval = r.meta["retrieval"]
        assert "visibility_hidden_mask" not in retrieval
        assert retrieval["skipReasons"] == ["vector-config-invalid"]
        assert retrieval["llm"] == {"status": "disabled", "reason": "x"}
        assert retrieval["weird"] == 0.5 and retrieval["nan"] is None
        assert retrieval["timings"] == {"scoring": 1.2, "total": 2.0}
        ctx = r.meta["scopeContext"]
        assert ctx["sceneOwnerResolutionMode"] == "unresolved"
        assert ctx["graph"] == {"chatId": "chat-e2e", "version": 1, "nodeCount": 2}
        assert r.stats == {
            "totalActive": 2, "summaryCount": 0, "coreCount": 1, "recallCount": 1, "characterPovCount": 0,
            "userPovCount": 0, "objectiveCurrentRegionCount": 0, "objectiveGlobalCount": 2, "episodicCount": 0,
            "stateCount": 1, "reflectiveCount": 0, "ruleCount": 0, "coreOmittedCount": 0,
            "objectiveGlobalOmittedCount": 0,
        }
        assert set(r.nodes) == {"a", "e"} and r.nodes["a"]["fields"] == {"name": "A"}
        assert r.llm_status == "disabled"

    def test_json_dumps_canonical(self):
        a, b = json_dumps(self.result()), json_dumps(self.result())
        assert a == b
        data = json.loads(a)
        assert data["timings"] == {"scoring": 0.0, "total": 0.0}
        assert data["traces"][0]["elapsed_ms"] == 0.0 and data["traces"][0]["notes"] == {"x": 3}
        assert list(data) == sorted(data)
        with_timings = json.loads(json_dumps(self.result(), timings=True))
        assert with_timings["timings"] == {"scoring": 1.2, "total": 2.0}
        assert "NaN" not in a

    def test_json_dumps_is_plain_of_the_model(self):
        """Field by field or through ``model_dump``: the same text."""
        r = self.result()
        assert r.traces[0]["notes"] == {"x": 3} and type(r.traces[0]["notes"]["x"]) is int
        for timings in (False, True):
            data = plain(r)
            if not timings:
                data["timings"] = {k: 0.0 for k in data["timings"]}
                data["meta"]["retrieval"]["timings"] = {k: 0.0 for k in data["meta"]["retrieval"]["timings"]}
                for trace in data["traces"]:
                    trace["elapsed_ms"] = 0.0
            expected = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            assert json_dumps(r, timings=timings) == expected

    def test_node_dumps_kept_per_snapshot(self):
        snap = snapshot(graph([node("a", seq=2, name="A"), node("e", "event", seq=1, title="E")]))
        state = finalised(scored_state(snap, [("a", 0.25)], selection=["a"]))
        first, second = build_result(state, make_settings()), build_result(state, make_settings())
        assert first.nodes == {"a": snap.node(0).model_dump(mode="json"), "e": snap.node(1).model_dump(mode="json")}
        assert second.nodes["e"] is first.nodes["e"]  # shared, read-only (see RecallResult)


def test_is_plain_json():
    assert is_plain_json({"a": [1, 2.5, None, True, "x", {"b": []}], "c": {}})
    for value in ((1, 2), {1: "x"}, [float("nan")], {"a": [float("inf")]}, np.float64(1.0), {"a": {"b": [np.int64(1)]}},
                  {"a": {"b"}}, [[("x",)]]):
        assert not is_plain_json(value), value


@pytest.mark.parametrize("mode", ["vector", "lexical_fallback", "llm", "llm_garbage", "empty"])
def test_stages_write_plain_meta(mode):
    """The result shares the stages' meta values instead of copying them (see RecallResult): every stage writes
    them (and its trace notes) as plain JSON data, here with every optional stage on."""
    snap, query, settings, providers = contract_setup(mode)
    run = run_pipeline(snap, query, settings, providers)
    meta = {k: v for k, v in run.state.meta.items() if k not in PRIVATE_META_KEYS}
    assert len(meta) > (0 if mode == "empty" else 30)
    for key, value in meta.items():
        assert is_plain_json(value), key
    for trace in run.state.traces:
        assert is_plain_json(dict(trace.notes)), trace.name
    result = build_result(run.state, run.settings, timings=run.timings)
    assert is_plain_json(result.meta) and is_plain_json(result.traces) and is_plain_json(result.nodes)


# --- per-structure caches after a write (updated from the parent structure's, equal to a fresh build) -----------

CHAT = "result-carry"
NOW = 1_700_000_000_000
CARRY_SETTINGS = RecallSettings(profile="app").with_overrides({"injector": {"core_cap": 3}})


def _chat_node(k: int, **update: object) -> Node:
    """Events (core nodes) in recency ties of three and importance ties of two, plus characters and messages."""
    kind = ("event", "event", "character", "event", "message")[k % 5]
    words = ("dragon", "lantern", "harbor", "tower", "river")
    fields = {"title": f"{words[k % 5]} scene {k}", "name": f"Name{k % 3}", "summary": f"the {words[(k + 1) % 5]}"}
    data: dict[str, object] = {"id": f"n{k:03d}", "type": kind, "seq": k // 3, "importance": float(1 + k % 2),
                               "fields": fields, "created_time": NOW}
    data.update(update)
    return Node.model_validate(data)


@pytest.fixture
def chat_store(store: Store) -> Store:
    store.upsert_nodes(CHAT, [_chat_node(k) for k in range(24)])
    return store


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _recall_json(snap: GraphSnapshot, store: Store, k: int = 0) -> str:
    query = RecallQuery(user_message=("the dragon scene", "a lantern in the tower", "harbor river")[k % 3],
                        now_ms=NOW, seed=k, chat_id=CHAT, user_floor=30 + k)
    providers = Providers(lexical_index=lambda terms, limit: store.bm25(CHAT, terms, limit))
    return json_dumps(retrieve(snap, query, CARRY_SETTINGS, providers))


def _fill(snap: GraphSnapshot, store: Store) -> None:
    """What a recall and the result builder keep per structure: dumps of every node, omitted models, priorities."""
    _recall_json(snap, store)
    for i in range(snap.n):
        result_module._node_entry(snap, i)
    result_module._omitted(snap, range(snap.n), "core-cap")
    result_module._temporal_priority(snap, ContextInfo(), np.arange(snap.n))


def _assert_carried_equal_fresh(snap: GraphSnapshot, fresh: GraphSnapshot) -> None:
    """Every value the updated structure holds equals the fresh build's (arrays: dtype, shape, bytes)."""
    order, synopsis = result_module._core_order(snap)
    built = result_module._sorted_core_order(fresh)
    fresh_order, fresh_synopsis = built.order, built.synopsis
    assert _same_array(order, fresh_order) and _same_array(synopsis, fresh_synopsis)
    table = result_module._dump_table(snap)
    assert table, "the parent's dumps were not carried"
    for i, (stat, dump, label) in list(table.items()):
        node = fresh.node(i)
        expected = (node.model_dump(mode="json"), result_module.node_label(node))
        if stat == snap.stats.reinforced.get(i):  # an entry of another overlay's statistics is never used here
            assert (dump, label) == expected, fresh.ids[i]
        assert result_module._node_entry(snap, i) == expected, fresh.ids[i]
    kept = result_module._kept(snap)
    assert all(m.node_id == fresh.ids[i] and m.reason == reason for (i, reason), m in kept.omitted.items())
    for story, priorities in kept.priority.items():
        judged = np.flatnonzero(priorities != result_module._UNKNOWN_PRIORITY)
        expected = result_module._temporal_priority(fresh, story, judged)
        assert _same_array(priorities[judged].astype(np.float64), expected)


class TestCachesAfterAWrite:
    def _after(self, chat_store: Store, write) -> tuple[GraphSnapshot, GraphSnapshot, GraphSnapshot]:
        cache = SnapshotCache()
        old = cache.get(chat_store, CHAT, "", now_ms=NOW)
        _fill(old, chat_store)
        write(chat_store)
        new = cache.get(chat_store, CHAT, "", now_ms=NOW)
        assert cache.last_update[CHAT] == "delta" and new.structure.parent is old.structure
        fresh = SnapshotCache().get(chat_store, CHAT, "", now_ms=NOW)
        return old, new, fresh

    def test_append_carries_every_value_without_a_sort(self, chat_store: Store, monkeypatch) -> None:
        def append(s: Store) -> None:  # a new event tied with the newest ones on recency and importance
            s.upsert_nodes(CHAT, [_chat_node(24, seq=7, importance=2.0, type="event"),
                                  _chat_node(26, seq=7, type="character")])

        cache = SnapshotCache()
        old = cache.get(chat_store, CHAT, "", now_ms=NOW)
        _fill(old, chat_store)
        old_dumps = dict(result_module._dump_table(old))
        append(chat_store)
        new = cache.get(chat_store, CHAT, "", now_ms=NOW)
        assert new.structure.change is not None and new.structure.change.appended_only
        dumps_made = []
        real_label = result_module.node_label
        monkeypatch.setattr(result_module, "node_label", lambda n: dumps_made.append(n.id) or real_label(n))
        with monkeypatch.context() as m:
            m.setattr(result_module, "_sorted_core_order", lambda snap: pytest.fail("core order sorted anew"))
            order = result_module._core_order(new)[0]
        assert [new.ids[i] for i in order[:3]] == ["n021", "n023", "n024"]  # placed into its tie group
        got = _recall_json(new, chat_store)
        # Only the new nodes are dumped; the parent's entries are the same objects.
        assert set(dumps_made) <= {"n024", "n026"}
        table = result_module._dump_table(new)
        assert all(table[i] is old_dumps[i] for i in old_dumps)
        fresh = SnapshotCache().get(chat_store, CHAT, "", now_ms=NOW)
        assert got == _recall_json(fresh, chat_store)
        _assert_carried_equal_fresh(new, fresh)

    def test_a_reinforcement_patches_a_copy_of_the_held_dump(self, chat_store: Store, monkeypatch) -> None:
        """After an access reinforcement (a new overlay, the same structure) a reinforced node's dump is the held
        one with the overlay's statistics, in a copy: equal to a fresh build's, key for key and in the same order,
        with no node dumped anew and the structure's entry left as it was."""
        cache = SnapshotCache()
        old = cache.get(chat_store, CHAT, "", now_ms=NOW)
        _fill(old, chat_store)
        held = dict(result_module._dump_table(old))
        targets = ["n021", "n003"]
        dumped: list[str] = []
        real_label = result_module.node_label
        for step in range(2):  # twice: the second patches a dump held with the first's statistics too
            chat_store.reinforce(CHAT, targets, now_ms=NOW + 1 + step)
            new = cache.get(chat_store, CHAT, "", now_ms=NOW)
            assert new.structure is old.structure and new.stats is not old.stats
            dumped.clear()
            monkeypatch.setattr(result_module, "node_label", lambda n: dumped.append(n.id) or real_label(n))
            fresh = SnapshotCache().get(chat_store, CHAT, "", now_ms=NOW)
            for nid in targets:
                i = new.index[nid]
                dump, label = result_module._node_entry(new, i)
                expected = fresh.node(i).model_dump(mode="json")
                assert json.dumps(dump) == json.dumps(expected) and label == result_module.node_label(fresh.node(i))
                assert dump["access_count"] == step + 1 + old.node(i).access_count
                assert dump is not held[i][1]
            assert dumped == [fresh.ids[new.index[t]] for t in targets]  # the labels compared above, nothing else
            table = result_module._dump_table(new)
            assert all(table[i] is held[i] for i in held)  # no entry replaced
            assert _recall_json(new, chat_store) == _recall_json(fresh, chat_store)
            monkeypatch.setattr(result_module, "node_label", real_label)

    def test_rewrite_drops_the_rewritten_node(self, chat_store: Store) -> None:
        def rewrite(s: Store) -> None:  # the newest event moves to the end of the core order, renamed
            s.upsert_nodes(CHAT, [_chat_node(21, seq=0, importance=1.0, fields={"title": "renamed"})])

        old, new, fresh = self._after(chat_store, rewrite)
        i = new.index["n021"]
        assert i not in result_module._dump_table(new)  # not carried: its row was rewritten
        assert result_module._node_entry(new, i)[1] == "renamed" != result_module._node_entry(old, i)[1]
        assert result_module._core_order(new)[0].tolist() != result_module._core_order(old)[0].tolist()
        assert _recall_json(new, chat_store) == _recall_json(fresh, chat_store)
        _assert_carried_equal_fresh(new, fresh)

    def test_delete_moves_the_carried_rows(self, chat_store: Store) -> None:
        old, new, fresh = self._after(chat_store, lambda s: s.delete_nodes(CHAT, ["n003", "n010"]))
        assert new.n == old.n - 2 and new.structure.change is not None and not new.structure.change.appended_only
        carried = {(m.node_id, reason) for (_, reason), m in result_module._kept(new).omitted.items()}
        before = {(m.node_id, reason) for (_, reason), m in result_module._kept(old).omitted.items()}
        assert carried == {(nid, reason) for nid, reason in before if nid not in ("n003", "n010")}
        assert _recall_json(new, chat_store) == _recall_json(fresh, chat_store)
        _assert_carried_equal_fresh(new, fresh)

    def test_too_many_placed_nodes_sort_anew(self, chat_store: Store, monkeypatch) -> None:
        monkeypatch.setattr(result_module, "MAX_CORE_REPLACED", 0)
        sorts = []
        real = result_module._sorted_core_order
        monkeypatch.setattr(result_module, "_sorted_core_order", lambda snap: sorts.append(snap) or real(snap))
        old, new, fresh = self._after(chat_store, lambda s: s.upsert_nodes(CHAT, [_chat_node(25)]))
        result_module._core_order(new)
        assert sorts and sorts[-1] is new  # the update gave up: built
        _assert_carried_equal_fresh(new, fresh)

    def test_reinforcement_then_append(self, chat_store: Store) -> None:
        """A reinforcement write (a new overlay of the same structure) reorders importance ties: the core order of
        the new overlay and of the next structure are derived, and equal fresh builds."""
        cache = SnapshotCache()
        old = cache.get(chat_store, CHAT, "", now_ms=NOW)
        _fill(old, chat_store)
        chat_store.reinforce(CHAT, ["n018", "n000"], NOW + 1, 5.0)
        stats = cache.get(chat_store, CHAT, "", now_ms=NOW + 1)
        assert stats.structure is old.structure and stats.stats is not old.stats
        fresh = SnapshotCache().get(chat_store, CHAT, "", now_ms=NOW + 1)
        assert _recall_json(stats, chat_store) == _recall_json(fresh, chat_store)
        _assert_carried_equal_fresh(stats, fresh)
        assert result_module._core_order(stats)[0].tolist() != result_module._core_order(old)[0].tolist()
        chat_store.upsert_nodes(CHAT, [_chat_node(27)])
        new = cache.get(chat_store, CHAT, "", now_ms=NOW + 1)
        assert new.structure.parent is old.structure
        fresh = SnapshotCache().get(chat_store, CHAT, "", now_ms=NOW + 1)
        assert _recall_json(new, chat_store) == _recall_json(fresh, chat_store)
        _assert_carried_equal_fresh(new, fresh)
