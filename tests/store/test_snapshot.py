"""GraphSnapshot: the arrays built from a graph or a store, and the cache that rebuilds them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memory_recall.model import (
    Edge,
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    Node,
)
from memory_recall.store import Store
from memory_recall.store.snapshot import (
    MAX_SHARED_OVERRIDES,
    NodeIndex,
    SharedPrefix,
    SnapshotCache,
    build_snapshot,
    node_index,
    snapshot_from_graph,
)


def _graph() -> MemoryGraph:
    nodes = (
        Node(id="erin", type="character", fields={"name": "Erin", "visibility": "Erin, Bob"}, seq=1),
        Node(id="tower", type="location", fields={"name": "Bell Tower"}, seq=2,
             scope={"region_primary": "王都/钟楼"}),
        Node(id="ev-2", type="event", fields={"title": "Key found"}, seq=3, prev_id="ev-1"),
        Node(id="ev-1", type="event", fields={"title": "Key hidden"}, seq=2, next_id="ev-2"),
        Node(id="old", type="event", fields={"title": "Gone"}, seq=0, archived=True),
        Node(id="pov-erin", type="pov_memory", fields={"summary": "I hid it"}, seq=2,
             scope={"layer": "pov", "owner_type": "character", "owner_name": "Erin"}),
        Node(id="undated", type="rule", fields={"title": "No magic"}, seq_range=None),
    )
    edges = (
        Edge(id="e1", from_id="erin", to_id="tower", strength=0.5),
        Edge(id="e2", from_id="erin", to_id="tower", strength=0.25),  # parallel edges add up
        Edge(id="e3", from_id="ev-1", to_id="erin", strength=0.8, edge_type=255, relation="contradicts"),
        Edge(id="e4", from_id="ev-2", to_id="erin", strength=0.9, invalid_at=50),  # already invalid at now=100
        Edge(id="e5", from_id="ev-2", to_id="tower", strength=0.7, expired_at=500),  # valid until 500
        Edge(id="e6", from_id="old", to_id="erin", strength=1.0),  # archived end: never in the arrays
    )
    knowledge = KnowledgeState(
        owners={
            "character:erin#erin": KnowledgeOwner(
                owner_type="character", owner_key="character:erin#erin", owner_name="Erin", node_id="erin",
                known_node_ids=("ev-1",), mistaken_node_ids=("ev-2",), visibility_scores={"tower": 0.6},
            )
        }
    )
    return MemoryGraph(nodes=nodes, edges=edges, knowledge=knowledge)


class TestArrays:
    def test_ids_ranks_types_and_ranges(self) -> None:
        snap = snapshot_from_graph(_graph(), now_ms=100)
        assert snap.ids == ("erin", "tower", "ev-2", "ev-1", "old", "pov-erin", "undated")
        # id_rank is the position in byte order: erin < ev-1 < ev-2 < old < pov-erin < tower < undated.
        assert snap.id_rank.tolist() == [0, 5, 2, 1, 3, 4, 6]
        assert [snap.type_of(i) for i in range(snap.n)] == [
            "character", "location", "event", "event", "event", "pov_memory", "rule"
        ]
        assert snap.finite_range.tolist() == [True, True, True, True, True, True, False]
        assert snap.archived.tolist() == [False, False, False, False, True, False, False]
        assert snap.core_mask.tolist() == [False, False, True, True, False, False, True]

    def test_active_edges_only_and_undirected_sums(self) -> None:
        snap = snapshot_from_graph(_graph(), now_ms=100)
        adj = snap.adjacency.toarray()
        assert adj[0, 1] == adj[1, 0] == 0.75
        assert adj[2, 1] == adj[1, 2] == 0.7
        assert adj[2, 0] == 0.0  # e4 is invalid at now=100
        assert adj[4].sum() == 0.0  # the archived node takes part in nothing
        inh = snap.inhibit.toarray()
        assert inh[3, 0] == inh[0, 3] == 0.8 and inh.sum() == 1.6
        assert snap.edge_ids == ("e1", "e2", "e3", "e5")
        assert snap.valid_until_ms == 500.0
        assert snap.active_edges_of(0) == [0, 1, 2]

    def test_temporal_pairs_scope_and_anchors(self) -> None:
        snap = snapshot_from_graph(_graph(), now_ms=100)
        assert snap.temporal_pairs.tolist() == [[2, 3]]
        assert snap.region_primary[1] == "钟楼" and snap.region_tokens[1] == ("钟楼", "王都")
        assert snap.is_pov.tolist() == [False, False, False, False, False, True, False]
        assert snap.scope_owner_key[5] == "character:erin"
        # Archived nodes are not anchors; one-character names would not be either.
        assert snap.anchor_index == {
            "Erin": (0,), "Bell Tower": (1,), "Key found": (2,), "Key hidden": (3,), "No magic": (6,)
        }
        assert snap.anchor_lengths == (10, 9, 8, 4)
        assert snap.visibility == {0: ("Erin", "Bob")}

    def test_knowledge_arrays_fix_the_node_id_quirk(self) -> None:
        snap = snapshot_from_graph(_graph(), now_ms=100)
        k = snap.knowledge
        assert k.owner_keys == ("character:erin#erin",)
        assert k.row("character:erin") == 0 and k.row("Character:Erin#erin") == 0 and k.row("user:x") == -1
        # Known: ev-1 and the owner's own character node.
        assert k.known[0].tolist() == [True, False, False, True, False, False, False]
        assert k.mistaken[0].tolist() == [False, False, True, False, False, False, False]
        # The owner's own POV node matches although the entry key carries "#erin" (reference §7 item 4).
        assert k.own_pov[0].tolist() == [False, False, False, False, False, True, False]
        assert k.visibility[0].tolist() == [0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0]

    def test_embeddings_are_normalised_and_masked(self) -> None:
        vecs = {"erin": np.array([3.0, 4.0]), "tower": np.array([0.0, 0.0]), "nope": np.array([1.0, 0.0])}
        snap = snapshot_from_graph(_graph(), now_ms=100, embeddings=vecs, model_id="m")
        assert snap.dim == 2
        assert snap.has_vector.tolist() == [True, False, False, False, False, False, False]
        assert snap.embeddings[0].tolist() == [np.float32(0.6), np.float32(0.8)]
        assert snap.embeddings[1:].sum() == 0.0

    def test_lazy_nodes_equal_the_originals(self) -> None:
        graph = _graph()
        snap = snapshot_from_graph(graph, now_ms=100)
        assert [snap.node(i) for i in range(snap.n)] == list(graph.nodes)
        assert snap.node_by_id("tower") == graph.nodes[1] and snap.node_by_id("missing") is None

    def test_node_index_json_round_trip(self) -> None:
        for node in _graph().nodes:
            idx = node_index(node)
            assert NodeIndex.from_json(idx.to_json()) == idx


class TestFromStore:
    def test_store_source_equals_graph_source(self, tmp_path: Path) -> None:
        graph = _graph()
        with Store(tmp_path / "s.sqlite3") as store:
            store.replace_graph("c", graph)
            store.put_embeddings("c", "m", {"erin": np.array([1.0, 0.0], dtype=np.float32)})
            from_store = build_snapshot(store.snapshot_source("c", "m"), now_ms=100)
        from_graph = snapshot_from_graph(
            graph, now_ms=100, chat_id="c", version=from_store.version,
            embeddings={"erin": np.array([1.0, 0.0])}, model_id="m",
        )
        assert from_store.ids == from_graph.ids
        assert (from_store.adjacency != from_graph.adjacency).nnz == 0
        assert (from_store.inhibit != from_graph.inhibit).nnz == 0
        assert from_store.anchor_index == from_graph.anchor_index
        assert np.array_equal(from_store.embeddings, from_graph.embeddings)
        assert np.array_equal(from_store.knowledge.known, from_graph.knowledge.known)
        assert from_store.temporal_pairs.tolist() == from_graph.temporal_pairs.tolist()


class TestCache:
    def test_rebuilds_on_write_and_on_edge_expiry_only(self, tmp_path: Path) -> None:
        cache = SnapshotCache()
        with Store(tmp_path / "s.sqlite3") as store:
            store.replace_graph("c", _graph())
            first = cache.get(store, "c", "", now_ms=100)
            assert cache.get(store, "c", "", now_ms=200) is first  # nothing changed
            expired = cache.get(store, "c", "", now_ms=500)  # e5 expired at 500: a new horizon
            assert expired is not first and expired.adjacency[2, 1] == 0.0
            store.upsert_nodes("c", [Node(id="new", type="character", fields={"name": "Nia"})])
            rebuilt = cache.get(store, "c", "", now_ms=600)
            assert rebuilt is not expired and rebuilt.version > expired.version and rebuilt.n == 8
            cache.invalidate("c")
            assert cache.get(store, "c", "", now_ms=600) is not rebuilt

    def test_forget_drops_a_deleted_chats_snapshots_locks_and_last_update_only(self, tmp_path: Path) -> None:
        cache = SnapshotCache()
        with Store(tmp_path / "s.sqlite3") as store:
            store.replace_graph("c", _graph())
            store.replace_graph("d", _graph())
            kept = cache.get(store, "d", "", now_ms=100)
            cache.get(store, "c", "", now_ms=100)
            cache.get(store, "c", "m", now_ms=100)
            held = cache._key_lock(("c", "held"))
            with held:
                cache.forget("c")
                # The lock a thread holds stays; the others of "c" go, and "d" keeps everything.
                assert sorted(cache._updating) == [("c", "held"), ("d", "")]
                assert sorted(cache._items) == [("d", "")] and cache.last_update == {"d": "rebuild"}
            assert cache.get(store, "d", "", now_ms=200) is kept
            cache.forget("c")
            assert sorted(cache._updating) == [("d", "")]


class TestSharedPrefix:
    """The string columns a delta rewrites in place: shared items, the rewritten positions held apart."""

    def test_rewritten_positions_are_held_apart_and_the_parent_unchanged(self) -> None:
        parent = SharedPrefix.of(["a", "b", "c"])
        child = parent.replaced({1: "B"}).appended(["d"])
        assert list(child) == ["a", "B", "c", "d"] and tuple(child) == ("a", "B", "c", "d")
        assert [child[i] for i in range(4)] == ["a", "B", "c", "d"] and child[-3] == "B" and child[1:3] == ("B", "c")
        assert list(parent) == ["a", "b", "c"] and parent[1] == "b"
        assert child._items is parent._items  # shared: the rewrite copied no item
        grandchild = child.replaced({0: "A", 1: "b2"})
        assert list(grandchild) == ["A", "b2", "c", "d"] and list(child) == ["a", "B", "c", "d"]
        assert child == ("a", "B", "c", "d") and grandchild != child
        with pytest.raises(IndexError):
            child[4]

    def test_too_many_overrides_are_written_into_a_copy(self) -> None:
        items = [f"x{i}" for i in range(MAX_SHARED_OVERRIDES + 10)]
        base = SharedPrefix.of(items)
        near = base.replaced({i: f"y{i}" for i in range(MAX_SHARED_OVERRIDES)})
        assert near._items is base._items and len(near._overrides) == MAX_SHARED_OVERRIDES
        over = near.replaced({MAX_SHARED_OVERRIDES: "z"})
        assert over._items is not base._items and not over._overrides
        expected = [f"y{i}" for i in range(MAX_SHARED_OVERRIDES)] + ["z"] + items[MAX_SHARED_OVERRIDES + 1:]
        assert list(over) == expected and list(base) == items
