"""The store's snapshot read (edge columns, vectors read straight into one matrix) builds exactly the snapshot
that :func:`snapshot_from_graph` builds from the same graph (the edge-row path)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from snapshot_equality import exactly_equal

import memory_recall.store.sqlite as store_sqlite
from memory_recall.errors import StoreError
from memory_recall.model import Edge, KnowledgeOwner, KnowledgeState, MemoryGraph, Node
from memory_recall.store import Store
from memory_recall.store.snapshot import (
    BlobSlices,
    EdgeColumns,
    EdgeRow,
    GraphSnapshot,
    JoinedStrings,
    NodeIndexTable,
    PackedTexts,
    build_snapshot,
    compress_text,
    decompress_text,
    node_index,
    snapshot_from_graph,
)

CHAT = "read"
MODEL = "model-a"
NOW = 1_000


def _differences(a: GraphSnapshot, b: GraphSnapshot) -> list[str]:
    """Names of the snapshot fields that are not exactly equal (arrays: dtype, shape and bytes)."""

    same = exactly_equal

    skip = {"_lock", "_nodes", "version", "chat_id", "model_id", "structure"}  # structure: an identity token
    return [f.name for f in dataclasses.fields(GraphSnapshot) if f.name not in skip
            and not same(getattr(a, f.name), getattr(b, f.name))]


def _graph(n: int = 40) -> tuple[MemoryGraph, dict[str, np.ndarray]]:
    """Nodes in non-id order with archived ones and a prev/next chain; normal, inhibit, invalid, expired,
    future-expiring and archived-end edges; vectors of several norms, a zero vector and missing vectors."""
    rng = np.random.default_rng(3)
    types = ("event", "character", "pov_memory", "location", "message")
    nodes = []
    for i in range(n):
        t = types[i % len(types)]
        scope: dict[str, Any] = {"region_primary": f"Region {i % 3}"}
        if t == "pov_memory":
            scope = {"layer": "pov", "owner_type": "character", "owner_name": "Erin", "region_primary": "Tower"}
        nodes.append(Node(
            id=f"n{(i * 7) % n:03d}", type=t, seq=i, archived=i % 9 == 4, importance=float(i % 10),
            fields={"title": f"node {i}", "name": f"Name {i % 4}", "visibility": "Erin" if i % 6 == 0 else ""},
            prev_id=f"n{((i - 1) * 7) % n:03d}" if i % 2 and i else None, scope=scope,
            story_time={"segment_id": f"seg-{i // 10}", "tense": "past"},
        ))
    ids = [nd.id for nd in nodes]
    edges = []
    for k in range(3 * n):
        a, b = ids[int(rng.integers(n))], ids[int(rng.integers(n))]
        if a == b:
            continue
        kind = k % 6
        edges.append(Edge(
            id=f"e{k:04d}", from_id=a, to_id=b, relation=("related", "causes", "contradicts")[k % 3],
            strength=round(float(rng.uniform(0.1, 1.0)), 3), edge_type=255 if kind == 1 else 0,
            invalid_at=NOW - 10 if kind == 2 else (NOW + 77 if kind == 5 else None),
            expired_at=NOW - 1 if kind == 3 else (NOW + 500 if kind == 4 else None),
        ))
    knowledge = KnowledgeState(owners={"character:erin": KnowledgeOwner(
        owner_type="character", owner_key="character:erin", owner_name="Erin", node_id=ids[1],
        known_node_ids=tuple(ids[:5]), visibility_scores={ids[7]: 0.4})})
    vectors = {}
    for i, nid in enumerate(ids):
        if i % 5 == 3:
            continue  # no vector
        vec = rng.standard_normal(6).astype(np.float32) * float(10 ** (i % 4 - 2))
        vectors[nid] = np.zeros(6, np.float32) if i % 11 == 2 else vec
    return MemoryGraph(nodes=tuple(nodes), edges=tuple(edges), knowledge=knowledge), vectors


def _store(tmp_path: Path, graph: MemoryGraph, vectors: dict[str, np.ndarray]) -> Store:
    store = Store(tmp_path / "snap.sqlite3")
    with store.write(CHAT) as w:
        w.replace_graph(graph)
        if vectors:
            w.put_embeddings(MODEL, vectors)
        # Another model's vectors (another size) must not be read.
        w.put_embeddings("model-b", {graph.nodes[0].id: np.ones(3, np.float32)})
    return store


@pytest.mark.parametrize("chunk", [3, 8192])
def test_store_snapshot_equals_graph_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(store_sqlite, "_SNAPSHOT_CHUNK", chunk)  # several fetches, or one
    graph, vectors = _graph()
    with _store(tmp_path, graph, vectors) as store:
        source = store.snapshot_source(CHAT, MODEL)
        assert source.edge_columns is not None and source.embeddings_aligned
        from_store = build_snapshot(source, now_ms=NOW)
        stored_graph = store.load_graph(CHAT)
    from_graph = snapshot_from_graph(stored_graph, now_ms=NOW, embeddings=vectors, model_id=MODEL)
    assert _differences(from_store, from_graph) == []
    # The fixture exercises what it claims: missing and zero vectors, archived ends, dropped and kept edges.
    assert from_store.has_vector.sum() == len(vectors) - sum(1 for v in vectors.values() if not v.any())
    assert 0 < len(from_store.edge_ids) < len(graph.edges)
    assert from_store.inhibit.nnz > 0 and from_store.archived.any()
    assert from_store.valid_until_ms == NOW + 77
    # Repeated relation words are one string object each.
    first = {}
    for rel in from_store.edge_relation:
        assert first.setdefault(rel, rel) is rel


def test_edge_rows_and_edge_columns_build_the_same_arrays(tmp_path: Path) -> None:
    graph, vectors = _graph(25)
    with _store(tmp_path, graph, vectors) as store:
        source = store.snapshot_source(CHAT, MODEL)
    columns = source.edge_columns
    assert columns is not None
    rows = [EdgeRow.of(e) for e in graph.edges]
    old = dataclasses.replace(source, edges=rows, edge_columns=None, embeddings=source.embeddings.copy())
    assert _differences(build_snapshot(source, now_ms=NOW), build_snapshot(old, now_ms=NOW)) == []
    index = {nid: i for i, nid in enumerate(source.node_ids)}
    from_rows = EdgeColumns.of_rows(rows, index)
    assert from_rows.src.tolist() == columns.src.tolist() and list(from_rows.edge_ids) == list(columns.edge_ids)
    assert np.array_equal(from_rows.expired_at, columns.expired_at, equal_nan=True)


def test_vectors_are_read_in_node_order_and_normalised_in_place(tmp_path: Path) -> None:
    graph, vectors = _graph(12)
    with _store(tmp_path, graph, vectors) as store:
        source = store.snapshot_source(CHAT, MODEL)
    raw = source.embeddings
    assert raw.shape == (12, 6) and raw.dtype == np.float32
    for i, nid in enumerate(source.node_ids):
        assert raw[i].tolist() == (vectors[nid].tolist() if nid in vectors else [0.0] * 6)
    snap = build_snapshot(source, now_ms=NOW)
    assert snap.embeddings is raw  # the matrix read from the store is the snapshot's: no second copy
    norms = np.linalg.norm(snap.embeddings[snap.has_vector], axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6)


def test_no_vectors_no_model_and_empty_chat(tmp_path: Path) -> None:
    graph, _ = _graph(10)
    with _store(tmp_path, graph, {}) as store:
        for model in (MODEL, ""):
            source = store.snapshot_source(CHAT, model)
            assert source.embeddings.shape == (0, 0) and not source.embeddings_aligned
            snap = build_snapshot(source, now_ms=NOW)
            assert snap.embeddings.shape == (10, 0) and not snap.has_vector.any()
            assert _differences(snap, snapshot_from_graph(store.load_graph(CHAT), now_ms=NOW)) == []
        with store.write("empty") as w:
            w.upsert_nodes([])
        empty = build_snapshot(store.snapshot_source("empty", MODEL), now_ms=NOW)
    assert _differences(empty, snapshot_from_graph(MemoryGraph(), now_ms=NOW)) == []
    assert empty.n == 0 and empty.edge_src.shape == (0,) and empty.embeddings.shape == (0, 0)


@pytest.mark.parametrize("corruption", ["dim", "blob"])
def test_vectors_of_different_sizes_are_a_store_error(tmp_path: Path, corruption: str) -> None:
    graph, vectors = _graph(10)
    store = _store(tmp_path, graph, vectors)
    store.close()
    conn = sqlite3.connect(str(tmp_path / "snap.sqlite3"))
    victim = graph.nodes[-1].id
    sql = ("UPDATE embeddings SET dim = 7 WHERE node_id = ? AND model_id = ?" if corruption == "dim" else
           "UPDATE embeddings SET vector = zeroblob(28) WHERE node_id = ? AND model_id = ?")
    assert conn.execute(sql, (victim, MODEL)).rowcount == 1
    conn.commit()
    conn.close()
    with Store(tmp_path / "snap.sqlite3") as store, pytest.raises(StoreError, match="vector sizes differ"):
        store.snapshot_source(CHAT, MODEL)



def test_index_table_rows_equal_the_node_index_of_each_node() -> None:
    graph, _ = _graph(12)
    rows = [node_index(nd) for nd in graph.nodes]
    table = NodeIndexTable.from_packed([r.to_packed() for r in rows], [r.strings_json() for r in rows])
    assert list(table) == rows
    assert table[-1] == rows[-1] and table[2:6] == rows[2:6]
    assert any(r.visibility for r in rows) and any(r.archived for r in rows)
    with pytest.raises(IndexError):
        table[12]


def test_packed_index_rows_equal_the_node_index_of_each_node() -> None:
    """``nodes.ixb`` / ``nodes.ixs`` decode to the node index of each node, extreme values included."""
    graph, _ = _graph(12)
    extra = Node(id="wide", type="event", seq=3, seq_range=(-1, 2**53 - 1), importance=0.125,
                 created_time=253_402_300_799_999, fields={"title": "Ünïcode \u2028 title", "visibility": ["a", "b"]})
    open_ended = Node(id="open", type="rule", seq=4, seq_range=None)
    rows = [node_index(nd) for nd in (*graph.nodes, open_ended, extra)]
    blobs, strings = [r.to_packed() for r in rows], [r.strings_json() for r in rows]
    table = NodeIndexTable.from_packed(blobs, strings)
    assert list(table) == rows
    assert rows[-1].seq_end == 2**53 - 1 and table[-1].seq_end == 2**53 - 1
    assert table[-1].created_time == 253_402_300_799_999
    assert any(r.seq_start is None for r in rows) and any(r.visibility for r in rows)
    # The snapshot built from packed rows equals the one built from the rows themselves.
    assert table.columns()["seq_end"].dtype == np.float64
    with pytest.raises(ValueError, match="wrong size"):
        NodeIndexTable.from_packed([blobs[0][:-1]], strings[:1])


def test_packed_texts_round_trip_and_replace() -> None:
    texts = ["{}", '{"a":"ü\\u2028😀"}', "x" * 5000, ""]
    packed = PackedTexts.of(texts)
    assert list(packed) == texts and packed == texts and texts == packed and len(packed) == 4
    assert packed[-1] == "" and packed[1:3] == texts[1:3] and packed != texts[:3]
    with pytest.raises(IndexError):
        packed[4]
    changed = packed.replaced({1: "new"})
    assert list(changed) == ["{}", "new", "x" * 5000, ""] and list(packed) == texts
    assert len(compress_text("x" * 5000)) < 100
    with pytest.raises(ValueError, match="format"):
        decompress_text(b"\x02abc")
    with pytest.raises(ValueError, match="corrupt"):
        decompress_text(compress_text('{"a": 1}')[:-2])


def test_rid_positions_dense_and_sparse() -> None:
    from memory_recall.store.sqlite import _rid_positions

    for rids in ([5, 3, 9, 4], [10**12, 7, 3 * 10**9, 8]):
        arr = np.array(rids, dtype=np.int64)
        lookup = _rid_positions(arr)
        query = np.array([*rids, 6, -1, 10**13], dtype=np.int64)
        assert lookup(query).tolist() == [0, 1, 2, 3, -1, -1, -1]
    assert _rid_positions(np.zeros(0, np.int64))(np.array([1], np.int64)).tolist() == [-1]


@pytest.mark.parametrize("corruption", ["ixb", "ixs", "jz", "eb"])
def test_corrupt_packed_columns_are_a_store_error(tmp_path: Path, corruption: str) -> None:
    graph, vectors = _graph(10)
    _store(tmp_path, graph, vectors).close()
    conn = sqlite3.connect(tmp_path / "snap.sqlite3")
    sql = {
        "ixb": "UPDATE nodes SET ixb = x'00' WHERE rowid = (SELECT min(rowid) FROM nodes)",
        "ixs": "UPDATE nodes SET ixs = '[1]' WHERE rowid = (SELECT min(rowid) FROM nodes)",
        "jz": "UPDATE nodes SET jz = x'' WHERE rowid = (SELECT min(rowid) FROM nodes)",
        "eb": "UPDATE edges SET eb = x'0102' WHERE rowid = (SELECT min(rowid) FROM edges)",
    }[corruption]
    assert conn.execute(sql).rowcount == 1
    conn.commit()
    conn.close()
    with Store(tmp_path / "snap.sqlite3") as store, pytest.raises(StoreError, match="corrupt"):
        store.snapshot_source(CHAT, MODEL)


def test_joined_strings_split_and_take() -> None:
    items = ["e1", "", "ü😀", "x" * 300, "last"]
    joined = JoinedStrings.split("\x1f".join(items), "\x1f", len(items))
    assert list(joined) == items and joined == items and len(joined) == 5 and joined[-1] == "last"
    assert joined[1:4] == items[1:4]
    picked = joined.take(np.array([4, 0, 2, 2]))
    assert list(picked) == ["last", "e1", "ü😀", "ü😀"] and picked[3] == "ü😀"
    assert list(picked.take([1])) == ["e1"]
    assert list(JoinedStrings.split("", "\x1f", 0)) == [] and list(JoinedStrings.split("", "\x1f", 1)) == [""]
    with pytest.raises(ValueError, match="expected 3 strings, got 2"):
        JoinedStrings.split("a\x1fb", "\x1f", 3)
    with pytest.raises(IndexError):
        joined.take([5])
    with pytest.raises(IndexError):
        picked[4]


def test_blob_slices_and_packed_texts_over_one_blob() -> None:
    texts = ['{"a":1}', "ü" * 40, "{}"]
    blobs = [compress_text(t) for t in texts]
    ends = np.cumsum([len(b) for b in blobs])
    slices = BlobSlices(b"".join(blobs), ends)
    assert len(slices) == 3 and list(slices) == blobs and slices[-1] == blobs[-1] and slices[:2] == blobs[:2]
    assert list(PackedTexts(slices)) == texts and PackedTexts(slices).replaced({0: "x"})[0] == "x"
    with pytest.raises(IndexError):
        slices[3]


def test_joined_index_rows_equal_packed_rows() -> None:
    graph, _ = _graph(12)
    rows = [node_index(nd) for nd in graph.nodes]
    blobs, strings = [r.to_packed() for r in rows], [r.strings_json() for r in rows]
    table = NodeIndexTable.from_joined(b"".join(blobs), ",".join(strings), len(rows))
    assert list(table) == rows
    assert list(NodeIndexTable.from_joined(b"", "", 0)) == []
    with pytest.raises(ValueError, match="wrong size"):
        NodeIndexTable.from_joined(b"".join(blobs)[:-1], ",".join(strings), len(rows))
    with pytest.raises(ValueError, match="12 packed index rows but 11 string rows"):
        NodeIndexTable.from_joined(b"".join(blobs), ",".join(strings[:-1]), len(rows))
    with pytest.raises(ValueError, match="not JSON"):
        NodeIndexTable.from_joined(b"".join(blobs), ",".join(strings)[:-1], len(rows))


def test_two_chats_and_a_relation_holding_the_separator(tmp_path: Path) -> None:
    """Each chat's snapshot reads only its own nodes, edges and vectors (the same node ids in both chats), and
    relation words holding the read's separator character are read as they are."""
    graph, vectors = _graph(20)
    odd = tuple(e.model_copy(update={"relation": "a\x1fb"}) if k % 4 == 0 else e for k, e in enumerate(graph.edges))
    graph = graph.model_copy(update={"edges": odd})
    other, other_vectors = _graph(15)
    other_vectors = {k: v * 2 + 1 for k, v in other_vectors.items()}
    with _store(tmp_path, graph, vectors) as store:
        with store.write("other") as w:
            w.replace_graph(other)
            w.put_embeddings(MODEL, other_vectors)
        for chat, vec in ((CHAT, vectors), ("other", other_vectors)):
            snap = build_snapshot(store.snapshot_source(chat, MODEL), now_ms=NOW)
            expected = snapshot_from_graph(store.load_graph(chat), now_ms=NOW, embeddings=vec, model_id=MODEL)
            assert _differences(snap, expected) == []
            assert snap.n == (20 if chat == CHAT else 15)
            assert ("a\x1fb" in snap.edge_relation) == (chat == CHAT)


def test_gc_paused_restores_the_collector_state() -> None:
    import gc

    from memory_recall.store.snapshot import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a process that turned it off keeps it off
    finally:
        gc.enable()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text(alphabet="ab\u00fc\U0001f600", max_size=4), max_size=6), min_size=1, max_size=40),
       st.integers(0, 39))
def test_joined_strings_extended_appends_parts_and_keeps_older_views(
    batches: list[list[str]], branch_at: int
) -> None:
    """A chain of :meth:`JoinedStrings.extended` (on a split, then on a selection) holds every string in order;
    each older view keeps its strings when a later one extends, or when it is extended a second time (a branch);
    the parts stay few (the small trailing ones merge)."""
    items = ["e1", "", "x" * 50]
    joined = JoinedStrings.split("\x1f".join(items), "\x1f", len(items))
    views: list[tuple[JoinedStrings, list[str]]] = [(joined, list(items))]
    for batch in batches:
        joined = joined.extended(batch)
        items = items + batch
        views.append((joined, list(items)))
    for view, want in views:
        assert list(view) == want and [view[i] for i in range(len(view))] == want
    assert len(joined._parts) <= 2 + 2 * max(1, len(items)).bit_length()
    base, base_items = views[min(branch_at, len(views) - 1)]
    branch = base.extended(["branch", "ü"])
    assert list(branch) == [*base_items, "branch", "ü"]
    for view, want in views:
        assert list(view) == want
    picked = joined.take(np.arange(len(joined))[::-1])
    assert list(picked.extended(["z"])) == [*items[::-1], "z"] and list(picked) == items[::-1]
