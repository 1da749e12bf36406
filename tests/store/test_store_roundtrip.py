"""Everything written comes back equal: nodes, edges, chat state, records, embeddings, whole graphs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import edge, graphs, new_chat_id, node, nodes

from memory_recall.errors import InputError
from memory_recall.model.graph import Edge, Node, embedding_text
from memory_recall.model.records import PersistedRecall
from memory_recall.model.state import (
    HistoryState,
    JournalEntry,
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    RegionAdjacency,
    RegionState,
    StorySegment,
    SummaryEntry,
    SummaryState,
    TimelineState,
)
from memory_recall.store import Store
from memory_recall.store.sqlite import StoreReader

T = TypeVar("T")

_HYPO = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _vm_steps(store: Store, read: Callable[[StoreReader], T]) -> tuple[T, int]:
    """``read`` on a reader of ``store``, and the SQLite virtual-machine steps it took: a read's cost that does not
    depend on the machine's speed."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    with store.read() as r:
        r._conn.set_progress_handler(step, 1)
        try:
            out = read(r)
        finally:
            r._conn.set_progress_handler(None, 1)
    return out, steps


def _exact(model: Node | Edge) -> str:
    # Byte-exact form: float repr (incl. -0.0) and dict key order must survive the round trip.
    return json.dumps(model.model_dump(mode="json"), ensure_ascii=False)


class TestNodeEdgeRoundTrip:
    @_HYPO
    @given(g=graphs())
    def test_nodes_and_edges_round_trip_exactly(
        self, shared_store: Store, g: tuple[list[Node], list[Edge]]
    ) -> None:
        ns, es = g
        chat = new_chat_id()
        with shared_store.write(chat) as w:
            w.upsert_nodes(ns)
            w.upsert_edges(es)
        back = shared_store.get_nodes(chat)
        assert back == ns
        assert [_exact(n) for n in back] == [_exact(n) for n in ns]
        # Field order is meaningful (embedding_text lists non-preferred fields in it).
        assert [list(n.fields) for n in back] == [list(n.fields) for n in ns]
        assert [embedding_text(n) for n in back] == [embedding_text(n) for n in ns]
        edges_back = shared_store.get_edges(chat)
        assert edges_back == es
        assert [_exact(e) for e in edges_back] == [_exact(e) for e in es]
        for n in ns:
            assert shared_store.get_node(chat, n.id) == n
            assert shared_store.edges_of(chat, n.id) == [e for e in es if n.id in (e.from_id, e.to_id)]

    @_HYPO
    @given(n=nodes())
    def test_a_stored_node_equals_the_model_validated_from_its_dump(
        self, shared_store: Store, n: Node
    ) -> None:
        chat = new_chat_id()
        shared_store.upsert_nodes(chat, [n.model_dump(mode="json")])  # dicts are validated like parse_node
        assert shared_store.get_nodes(chat) == [n]

    def test_insertion_order_is_kept_on_update(self, store: Store) -> None:
        store.upsert_nodes("c", [node("b", title="B"), node("a", title="A"), node("c", title="C")])
        store.upsert_nodes("c", [node("d", title="D"), node("a", title="A2")])
        assert [n.id for n in store.get_nodes("c")] == ["b", "a", "c", "d"]
        assert store.get_node("c", "a") == node("a", title="A2")
        assert [n.id for n in store.get_nodes("c", ["d", "zz", "b"])] == ["b", "d"]
        assert store.get_nodes("c", []) == []
        assert store.get_node("c", "zz") is None
        assert store.get_node("other", "a") is None

    def test_a_repeated_id_in_one_batch_keeps_its_first_place_and_last_value(self, store: Store) -> None:
        store.upsert_nodes("c", [node("x", title="1"), node("y"), node("x", title="2")])
        assert [(n.id, n.fields.get("title")) for n in store.get_nodes("c")] == [("x", "2"), ("y", None)]

    def test_edge_order_and_edges_of(self, store: Store) -> None:
        store.upsert_nodes("c", [node("a"), node("b"), node("c")])
        store.upsert_edges("c", [edge("e2", "a", "b"), edge("e1", "b", "c")])
        store.upsert_edges("c", [edge("e2", "b", "a", strength=0.3), edge("e0", "c", "a")])
        assert [e.id for e in store.get_edges("c")] == ["e2", "e1", "e0"]
        assert store.get_edges("c")[0].from_id == "b"
        assert [e.id for e in store.edges_of("c", "a")] == ["e2", "e0"]
        assert [e.id for e in store.edges_of("c", "b")] == ["e2", "e1"]

    def test_edges_of_reads_the_nodes_edges_not_the_chats(self, store: Store) -> None:
        # An edit's ingest reads the edited node's edges: that read must cost what the node has, not what the chat
        # has. The same node's three edges in a chat of 63 edges and in one of 3,003 (SQLite's planner, left to
        # itself, read the chat's every edge to sort them: 747 and 30,147 steps).
        store.upsert_nodes("c", [node("hub"), node("x"), node("y"), *(node(f"n{i}") for i in range(3001))])
        store.upsert_edges("c", [edge("e-a", "hub", "x"), edge("e-b", "y", "hub"), edge("e-c", "hub", "y")])

        def read(r: StoreReader) -> list[str]:
            return [e.id for e in r.edges_of("c", "hub")]

        store.upsert_edges("c", [edge(f"f{i}", f"n{i}", f"n{i + 1}") for i in range(60)])
        small, small_steps = _vm_steps(store, read)
        store.upsert_edges("c", [edge(f"f{i}", f"n{i}", f"n{i + 1}") for i in range(60, 3000)])
        large, large_steps = _vm_steps(store, read)
        assert small == large == ["e-a", "e-b", "e-c"]  # in insertion order
        assert large_steps <= small_steps + 40, (small_steps, large_steps)

    def test_nodes_by_type_reads_those_nodes_not_the_chats(self, store: Store) -> None:
        # Every message event's ingest cache starts from the chat's characters and entities: two of them among 60
        # events, then among 3,000, take the same steps.
        store.upsert_nodes("c", [node("n0"), node("ann", "character"), node("bo", "entity"),
                                 *(node(f"n{i}") for i in range(1, 60))])

        def read(r: StoreReader) -> list[str]:
            return [n.id for n in r.get_nodes_by_type("c", ["entity", "character"])]

        small, small_steps = _vm_steps(store, read)
        store.upsert_nodes("c", [node(f"n{i}") for i in range(60, 3000)])
        large, large_steps = _vm_steps(store, read)
        assert small == large == ["ann", "bo"]  # in insertion order
        assert large_steps <= small_steps + 40, (small_steps, large_steps)

    def test_delete_nodes_removes_edges_embeddings_and_fts_rows(self, store: Store) -> None:
        store.upsert_nodes(
            "c", [node("a", title="castle"), node("b", title="castle"), node("c", title="moat")]
        )
        store.upsert_edges("c", [edge("ab", "a", "b"), edge("bc", "b", "c"), edge("ac", "a", "c")])
        store.put_embeddings("c", "m", {"a": np.ones(3), "b": np.zeros(3)})
        assert store.delete_nodes("c", ["b", "missing"]) == 1
        assert [n.id for n in store.get_nodes("c")] == ["a", "c"]
        assert [e.id for e in store.get_edges("c")] == ["ac"]
        assert store.get_embeddings("c", "m")[0] == ["a"]
        assert [i for i, _ in store.bm25("c", ["castle"])] == ["a"]
        assert store.delete_edges("c", ["ac", "nope"]) == 1
        assert store.get_edges("c") == []

    def test_edge_with_a_missing_endpoint_is_rejected_naming_the_edge(self, store: Store) -> None:
        store.upsert_nodes("c", [node("a")])
        with pytest.raises(InputError) as info:
            store.upsert_edges("c", [edge("ok", "a", "a2"), edge("bad", "a", "ghost")])
        assert info.value.field == "edges[0].to_id"
        assert "'ok'" in info.value.reason and "'a2'" in info.value.reason
        # Endpoints written earlier in the same batch count.
        with store.write("c") as w:
            w.upsert_nodes([node("a2")])
            w.upsert_edges([edge("ok", "a", "a2")])
        assert [e.id for e in store.get_edges("c")] == ["ok"]
        # ... and endpoints deleted earlier in the same batch do not.
        with pytest.raises(InputError, match="'a2'"), store.write("c") as w:
            w.delete_nodes(["a2"])
            w.upsert_edges([edge("again", "a2", "a")])

    def test_invalid_models_surface_as_input_errors(self, store: Store) -> None:
        with pytest.raises(InputError) as info:
            store.upsert_nodes("c", [node("a"), {"id": "b", "type": "event", "importance": 11}])
        assert info.value.field == "nodes[1].importance"
        with pytest.raises(InputError) as info:
            store.upsert_nodes("c", [{"id": "b", "type": "nonsense"}])
        assert info.value.field == "nodes[0].type"
        with pytest.raises(InputError) as info:
            store.upsert_edges("c", [{"id": "e", "from_id": "a", "to_id": "a"}])
        assert info.value.field == "edges[0]"
        with pytest.raises(InputError) as info:
            store.upsert_nodes("c", [node("s", title="bad \ud800 surrogate")])
        assert info.value.field == "nodes[0]"
        assert store.get_nodes("c") == []


def _knowledge() -> KnowledgeState:
    alice = KnowledgeOwner(
        owner_type="character",
        owner_key="character:alice",
        owner_name="Alice",
        node_id="n1",
        aliases=("Ally", "爱丽丝"),
        known_node_ids=("n1", "n2"),
        mistaken_node_ids=("n3",),
        visibility_scores={"n1": 1.0, "n4": 0.92, "n5": 0.1 + 0.2},
        manual_hidden_node_ids=("n9",),
        updated_at=1_700_000_000_000,
        last_source="extract",
    )
    user = KnowledgeOwner(owner_type="user", owner_key="user:露西亚", owner_name="露西亚")
    # Insertion order deliberately not sorted.
    return KnowledgeState(owners={"user:露西亚": user, "character:alice": alice})


def _regions() -> RegionState:
    return RegionState(
        adjacency_map={
            "钟楼": RegionAdjacency(
                adjacent=("王都", "集市"), aliases=("Bell tower",), source="extract", updated_at=5
            ),
            "王都": RegionAdjacency(adjacent=("钟楼",)),
        },
        manual_active_region="钟楼",
        recent_regions=("钟楼", "王都"),
    )


def _timeline() -> TimelineState:
    return TimelineState(
        segments=(
            StorySegment(id="s1", label="第一天", order=1, aliases=("Day 1",)),
            StorySegment(id="s2", label="第二天", order=2, parent_id="s1", relation_to_parent="after"),
        ),
        next_order=3,
        manual_active_segment_id="s2",
        recent_segment_ids=("s2", "s1"),
    )


def _summaries() -> SummaryState:
    return SummaryState(
        entries=(
            SummaryEntry(id="a", level=0, text="他们在钟楼相遇。", message_range=(0, 12), created_at=1),
            SummaryEntry(
                id="b",
                level=1,
                kind="rollup",
                status="folded",
                text="Rollup",
                message_range=None,
                story_time_span={"start_label": "第一天", "end_label": "第二天", "mixed": True},
            ),
        ),
        active_entry_ids=("a",),
    )


def _history() -> HistoryState:
    return HistoryState(
        active_region="钟楼", active_character_pov_owner="Alice", last_processed_assistant_floor=41
    )


def _record(chat: str, floor: int) -> PersistedRecall:
    return PersistedRecall(
        chat_id=chat,
        user_floor=floor,
        injection_text=f"<memory>第{floor}层 recall</memory>",
        blocks=[{"kind": "table", "rows": [["钟楼", 0.5, None, True]], "nested": {"k": [1.25]}}],
        selected_node_ids=("n1", "n2"),
        recall_input="去钟楼",
        token_estimate=12,
        graph_version=3,
        created_at=10,
        updated_at=20,
    )


class TestStateRoundTrip:
    def test_every_state_kind_round_trips(self, store: Store) -> None:
        with store.write("c") as w:
            w.set_knowledge(_knowledge())
            w.set_regions(_regions())
            w.set_timeline(_timeline())
            w.set_summaries(_summaries())
            w.set_history(_history())
            w.set_journal([JournalEntry(processed_range=(0, 4)), JournalEntry(processed_range=(5, 9))])
        assert store.get_knowledge("c") == _knowledge()
        assert list(store.get_knowledge("c").owners) == ["user:露西亚", "character:alice"]
        assert store.get_regions("c") == _regions()
        assert store.get_timeline("c") == _timeline()
        assert store.get_summaries("c") == _summaries()
        assert store.get_history("c") == _history()
        assert store.get_journal("c") == [
            JournalEntry(processed_range=(0, 4)),
            JournalEntry(processed_range=(5, 9)),
        ]

    def test_unset_state_reads_as_defaults(self, store: Store) -> None:
        assert store.get_knowledge("nobody") == KnowledgeState()
        assert store.get_regions("nobody") == RegionState()
        assert store.get_timeline("nobody") == TimelineState()
        assert store.get_summaries("nobody") == SummaryState()
        assert store.get_history("nobody") == HistoryState()
        assert store.get_journal("nobody") == []
        assert store.load_graph("nobody") == MemoryGraph()

    def test_set_knowledge_replaces_all_owners(self, store: Store) -> None:
        store.set_knowledge("c", _knowledge())
        only = KnowledgeState(owners={"user:x": KnowledgeOwner(owner_type="user", owner_key="user:x")})
        store.set_knowledge("c", only)
        assert store.get_knowledge("c") == only

    def test_invalid_state_dicts_name_the_field(self, store: Store) -> None:
        with pytest.raises(InputError) as info, store.write("c") as w:
            w.set_timeline({"segments": [{"id": "s", "order": 0}]})  # type: ignore[arg-type]
        assert info.value.field == "timeline.segments.0.order"

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        h=st.builds(
            HistoryState,
            active_region=st.text(max_size=8),
            last_processed_assistant_floor=st.integers(min_value=-1, max_value=10**9),
        ),
        ranges=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=4),
    )
    def test_history_and_journal_property(
        self, shared_store: Store, h: HistoryState, ranges: list[tuple[int, int]]
    ) -> None:
        chat = new_chat_id()
        journal = [JournalEntry(processed_range=r) for r in ranges]
        with shared_store.write(chat) as w:
            w.set_history(h)
            w.set_journal(journal)
        assert shared_store.get_history(chat) == h
        assert shared_store.get_journal(chat) == journal


class TestRecords:
    def test_records_round_trip_and_delete(self, store: Store) -> None:
        for floor in (4, 0, 2, 9):
            store.put_record("c", _record("c", floor))
        assert store.get_record("c", 2) == _record("c", 2)
        assert store.get_record("c", 3) is None
        assert [r.user_floor for r in store.list_records("c")] == [0, 2, 4, 9]
        assert store.delete_record("c", 2) is True
        assert store.delete_record("c", 2) is False
        assert store.delete_records_from("c", 4) == 2
        assert [r.user_floor for r in store.list_records("c")] == [0]
        assert store.stats("c")["record_count"] == 1

    def test_put_replaces_the_record_of_a_floor(self, store: Store) -> None:
        store.put_record("c", _record("c", 1))
        newer = _record("c", 1).model_copy(update={"injection_text": "edited", "manually_edited": True})
        store.put_record("c", newer)
        assert store.list_records("c") == [newer]

    def test_record_of_another_chat_is_rejected(self, store: Store) -> None:
        with pytest.raises(InputError) as info:
            store.put_record("c", _record("d", 1))
        assert info.value.field == "record.chat_id"

    def test_a_record_in_the_batch_can_carry_the_version_it_commits(self, store: Store) -> None:
        store.upsert_nodes("c", [node("n1")])
        with store.write("c") as w:
            w.reinforce(["n1"], 1000)
            w.put_record(_record("c", 7).model_copy(update={"graph_version": w.version}))
        assert store.get_record("c", 7).graph_version == store.chat_version("c")  # type: ignore[union-attr]


class TestEmbeddingRoundTrip:
    def test_vectors_come_back_bit_exact_in_node_order(self, store: Store) -> None:
        rng = np.random.default_rng(7)
        store.upsert_nodes("c", [node("z"), node("a"), node("m")])
        vecs = {k: rng.standard_normal(5).astype(np.float32) for k in ("m", "z", "a")}
        vecs["a"][0] = np.float32(-0.0)
        store.put_embeddings("c", "model", [(k, v, f"h-{k}") for k, v in vecs.items()])
        ids, mat = store.get_embeddings("c", "model")
        assert ids == ["z", "a", "m"]
        assert mat.dtype == np.float32 and mat.shape == (3, 5)
        assert mat.tobytes() == b"".join(vecs[i].tobytes() for i in ids)
        assert store.embedding_hashes("c", "model") == {"z": "h-z", "a": "h-a", "m": "h-m"}

    def test_float64_input_is_stored_as_float32(self, store: Store) -> None:
        store.upsert_nodes("c", [node("a")])
        store.put_embeddings("c", "m", {"a": np.array([0.1, 1 / 3], dtype=np.float64)})
        assert store.get_embeddings("c", "m")[1][0].tolist() == [np.float32(0.1), np.float32(1 / 3)]


class TestGraph:
    def _graph(self, ids: list[str]) -> MemoryGraph:
        ns = tuple(node(i, title=f"T{i}") for i in ids)
        es = tuple(edge(f"{a}-{b}", a, b) for a, b in zip(ids, ids[1:], strict=False))
        return MemoryGraph(
            nodes=ns,
            edges=es,
            knowledge=_knowledge(),
            regions=_regions(),
            timeline=_timeline(),
            summaries=_summaries(),
            history=_history(),
            batch_journal=(JournalEntry(processed_range=(0, 1)),),
        )

    def test_replace_and_load_graph(self, store: Store) -> None:
        g = self._graph(["a", "b", "c"])
        store.replace_graph("c", g)
        assert store.load_graph("c") == g
        store.put_embeddings("c", "m", {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)})
        store.put_record("c", _record("c", 0))
        g2 = self._graph(["c", "x", "a"])
        store.replace_graph("c", g2)
        assert store.load_graph("c") == g2  # node order is the new graph's order
        assert store.get_embeddings("c", "m")[0] == ["c", "a"]  # kept nodes keep their vectors
        assert len(store.list_records("c")) == 1
        assert [i for i, _ in store.bm25("c", ["tb"])] == []

    def test_reinforce(self, store: Store) -> None:
        store.upsert_nodes("c", [Node(id="a", type="event", importance=9.95, access_count=2), node("b")])
        assert store.reinforce("c", ["a", "a", "ghost"], 1234) == 1
        a = store.get_node("c", "a")
        assert a is not None
        assert (a.access_count, a.importance, a.last_access_time) == (3, 10.0, 1234)
        assert store.get_node("c", "b") == node("b")
        with pytest.raises(InputError) as info:
            store.reinforce("c", ["a"], -1)
        assert info.value.field == "now_ms"
