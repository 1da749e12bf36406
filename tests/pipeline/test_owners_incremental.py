"""The owner stage's per-structure caches after a delta (:func:`memory_recall.pipeline.owners._updated_memo`,
:func:`~memory_recall.pipeline.owners._updated_participants`): the memo and the participant table a structure gets
from its parent equal what the same builds give on a freshly built snapshot of the same version — the type and
archived lists, the events by seq (dtype, shape, bytes), every walk list (also the importance-ordered ones, per
snapshot), the POV owners, participant texts and row contributions — after real writes through a real
:class:`~memory_recall.store.Store` on a temporary SQLite file. An appended-only delta carries the values (and
merges a new event into the nearest-event lists it enters); a delete, an event moved in ``seq`` or an owner
catalog change falls back to building what the change invalidates. A recall on the updated snapshot equals one on
the fresh snapshot."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from memory_recall import bench
from memory_recall.model.graph import Edge, Node
from memory_recall.model.state import KnowledgeOwner, KnowledgeState
from memory_recall.pipeline import owners
from memory_recall.pipeline.result import json_dumps
from memory_recall.pipeline.retrieve import retrieve
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache

CHAT = "owners-inc"
MODEL = "test-model"
NOW = 1_700_000_000_000
CATALOG = ("character:erin", "character:bram")
EVENT = owners._EVENT


def _owners_state(aliases: tuple[str, ...] = ("Erin", "Lady Erin")) -> KnowledgeState:
    return KnowledgeState(owners={
        "character:erin": KnowledgeOwner(owner_key="character:erin", owner_type="character", owner_name="Erin",
                                         node_id="c-erin", aliases=aliases, known_node_ids=("e000", "e001")),
        "character:bram": KnowledgeOwner(owner_key="character:bram", owner_type="character", owner_name="Bram",
                                         node_id="c-bram", aliases=("Bram",)),
    })


def _seed(store: Store, events: int) -> None:
    """``events`` events at even seq (gaps for new ones), two owner characters and a location linked to many of
    them, and Erin's POV memories linked to some."""
    rng = np.random.default_rng(3)
    nodes = [
        Node(id="c-erin", type="character", seq=1, fields={"name": "Erin"}),
        Node(id="c-bram", type="character", seq=1, fields={"name": "Bram"}),
        Node(id="loc", type="location", seq=1, fields={"name": "Harbor"}),
    ]
    edges = []
    for k in range(events):
        who = ("Erin", "Bram", "the ferryman")[k % 3]
        nodes.append(Node(id=f"e{k:03d}", type="event", seq=2 * k, importance=float(1 + k % 7),
                          seq_range=(2 * k, 2 * k + 1),
                          fields={"title": f"scene {k}", "summary": f"{who} waits at the harbor",
                                  "participants": who}))
        edges.append(Edge(id=f"x{k:03d}", from_id=("c-erin", "c-bram", "loc")[k % 3], to_id=f"e{k:03d}",
                          strength=float(rng.uniform(0.2, 1.0))))
        if k % 4 == 0:
            nodes.append(Node(id=f"p{k:03d}", type="pov_memory", seq=2 * k, seq_range=(2 * k, 2 * k + 1),
                              fields={"summary": f"Erin remembers scene {k}"},
                              scope={"layer": "pov", "owner_type": "character", "owner_name": "Erin"}))
            edges.append(Edge(id=f"y{k:03d}", from_id=f"p{k:03d}", to_id=f"e{k:03d}", strength=0.5))
            if k:
                edges.append(Edge(id=f"z{k:03d}", from_id=f"p{k:03d}", to_id=f"e{k - 1:03d}", strength=0.4))
    with store.write(CHAT) as w:
        w.upsert_nodes(nodes)
        w.upsert_edges(edges)
        w.put_embeddings(MODEL, {n.id: rng.standard_normal(bench.DIM).astype(np.float32) for n in nodes})
        w.set_knowledge(_owners_state())


def _fill(snap: GraphSnapshot) -> owners._SnapshotMemo:
    """What recalls would fill the owner memos with, for every node: walk lists of each kind, POV owners,
    participant texts, row contributions and the catalog aliases."""
    memo = owners._memo(snap)
    for i in range(snap.n):
        for kind in ("event", "pov", "entity"):
            owners._walk_list(snap, memo, kind, i)
        if memo.codes[i] == EVENT:
            owners._walk_list(snap, memo, "near", i)
        owners._pov_owner(snap, memo, i)
        owners._participant_text(snap, i)
    table = owners._participant_memo(snap)
    catalog = owners._catalog_aliases(_catalog_state(snap))
    with owners._PARTICIPANTS_LOCK:  # as scene_owner_candidates stores it
        table.setdefault(("catalog", CATALOG), catalog)
        table.catalogs.add(CATALOG)
    for i in range(snap.n):
        table.setdefault((CATALOG, i), owners._contributions(snap, i, catalog))
    return memo


def _catalog_state(snap: GraphSnapshot, catalog: tuple[str, ...] = CATALOG) -> Any:
    return SimpleNamespace(snapshot=snap, context=SimpleNamespace(owner_catalog=catalog))


def _same_array(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _assert_equals_fresh(snap: GraphSnapshot, fresh: GraphSnapshot) -> None:
    """Every value the (updated) owner memos of ``snap`` hold equals the same build on ``fresh``."""
    assert snap.ids == fresh.ids
    memo = owners._memo(snap)
    fresh_memo = owners._SnapshotMemo(fresh)
    assert memo.types == fresh.type_code.tolist() and memo.archived == fresh.archived.tolist()
    assert memo.codes == fresh_memo.codes and memo.flags == fresh_memo.flags  # the bytes the hot paths read
    if memo.events is not None:
        ev, ev_seq = owners._events_by_seq(fresh, fresh_memo)
        assert _same_array(memo.events[0], ev) and _same_array(memo.events[1], ev_seq)
    for key, value in memo.walk.items():
        assert value == owners._walk_list(fresh, fresh_memo, *key), key
    for key, value in owners._stats_walks(snap).items():
        assert value == owners._walk_list(fresh, fresh_memo, *key), key
    for i, value in memo.pov_owner.items():
        assert value == owners._resolve_pov_owner(fresh, i), i
    for i, value in memo.pov_base.items():
        assert value == owners.owner_base_key(owners._resolve_pov_owner(fresh, i)[0]), i
    for i, value in memo.participant_text.items():
        assert value == owners._participant_text(fresh, i), i
    table = owners._participant_memo(snap)
    assert table.catalogs == {key[1] for key in table if key[0] == "catalog"}
    for key, value in table.items():
        if key[0] == "catalog":
            assert value == owners._catalog_aliases(_catalog_state(fresh, key[1]))
        else:
            catalog = owners._catalog_aliases(_catalog_state(fresh, key[0]))
            assert value == owners._contributions(fresh, key[1], catalog), key


def _recall(snap: GraphSnapshot, store: Store, k: int) -> str:
    query = RecallQuery(
        user_message=("Erin at the harbor", "what did Bram see", "scene 70 at the harbor")[k % 3],
        recent_lines=("[user]: hello",), now_ms=NOW, seed=k, chat_id=CHAT, user_floor=10 + k,
        active_owner_keys=("character:erin",),
    )
    providers = Providers(embedder=bench._PassThroughEmbedder(MODEL, {}),
                          lexical_index=lambda terms, limit: store.bm25(CHAT, terms, limit))
    return json_dumps(retrieve(snap, query, RecallSettings(profile="app"), providers))


def _fresh(store: Store) -> GraphSnapshot:
    return SnapshotCache().get(store, CHAT, MODEL, now_ms=NOW)


@pytest.fixture
def chat(db_path: Path) -> Store:
    store = Store(db_path)
    _seed(store, 150)
    yield store
    store.close()


def _append(store: Store, k: int, *, seq: int, to: tuple[str, ...]) -> None:
    """A new event at ``seq`` linked to the nodes ``to`` (old ones), as a chat turn writes it."""
    with store.write(CHAT) as w:
        w.upsert_nodes([Node(id=f"new{k}", type="event", seq=seq, seq_range=(seq, seq + 1),
                             fields={"title": f"new scene {k}", "summary": "Erin and Bram at the harbor",
                                     "participants": "Erin, Bram"})])
        w.upsert_edges([Edge(id=f"n{k}-{t}", from_id=f"new{k}", to_id=t, strength=0.7) for t in to])
        w.put_embeddings(MODEL, {f"new{k}": np.full(bench.DIM, 0.1, np.float32)})


def test_an_appended_event_carries_the_memo_and_merges_into_the_nearest_event_lists(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    old_stats = dict(owners._stats_walks(old))
    # Between e070 (seq 140) and e071 (seq 142): it enters the nearest-event lists of the events around it.
    _append(chat, 0, seq=141, to=("e070", "c-erin"))
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    change = new.structure.change
    assert cache.last_update[CHAT] == "delta" and change is not None and change.appended_only
    memo = owners._memo(new)
    assert memo is not old_memo and owners._memo(old) is old_memo
    j, e70, e10, c_erin = new.index["new0"], new.index["e070"], new.index["e010"], new.index["c-erin"]
    # Carried, not built: the far event's list as it was; the near one's with the new event merged in.
    assert memo.walk[("near", e10)] == old_memo.walk[("near", e10)]
    assert j in memo.walk[("near", e70)][0] and j not in old_memo.walk[("near", e70)][0]
    assert ("event", e70) not in memo.walk and ("event", e10) in memo.walk  # e070 gained an edge
    assert memo.events is not None and j in memo.events[0].tolist()
    stats = owners._stats_walks(new)
    assert ("pov", c_erin) not in stats and stats[("entity", e10)] == old_stats[("entity", e10)]
    assert len(memo.pov_owner) == len(old_memo.pov_owner) and len(memo.participant_text) == len(
        old_memo.participant_text)
    assert (CATALOG, e10) in owners._participant_memo(new)
    fresh = _fresh(chat)
    _assert_equals_fresh(new, fresh)
    # The parent's values are untouched (copy on write).
    assert j not in old_memo.events[0].tolist() and ("event", e70) in old_memo.walk
    assert _recall(new, chat, 0) == _recall(fresh, chat, 0)


def test_appends_in_a_row_stay_equal_to_fresh_builds(chat: Store) -> None:
    cache = SnapshotCache()
    snap = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    for k, (seq, to) in enumerate([(299, ("e149",)), (141, ("e070", "p068")), (141, ("loc",)), (0, ("e000",))]):
        _fill(snap)
        _recall(snap, chat, k)
        _append(chat, k, seq=seq, to=to)
        snap = cache.get(chat, CHAT, MODEL, now_ms=NOW)
        assert snap.structure.change is not None and snap.structure.change.appended_only
        fresh = _fresh(chat)
        assert _recall(snap, chat, k) == _recall(fresh, chat, k)
        _assert_equals_fresh(snap, fresh)


def test_a_short_chat_drops_the_nearest_event_lists(db_path: Path) -> None:
    """With few events a nearest-event list may be the whole order: an appended event drops them."""
    store = Store(db_path)
    try:
        _seed(store, 20)
        cache = SnapshotCache()
        old = cache.get(store, CHAT, MODEL, now_ms=NOW)
        _fill(old)
        _append(store, 0, seq=15, to=("e007",))
        new = cache.get(store, CHAT, MODEL, now_ms=NOW)
        memo = owners._memo(new)
        assert not any(kind == "near" for kind, _ in memo.walk) and ("event", new.index["e001"]) in memo.walk
        _assert_equals_fresh(new, _fresh(store))
    finally:
        store.close()


def test_a_delete_builds_the_walk_lists_again(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    with chat.write(CHAT) as w:
        w.delete_nodes(["e050"])
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    change = new.structure.change
    assert change is not None and not change.appended_only and bool((change.remap < 0).any())
    memo = owners._memo(new)
    assert memo.walk == {} and memo.events is None and memo.stats is None
    # The per-node entries of the other nodes move to their new positions.
    assert memo.participant_text and len(memo.participant_text) == len(old_memo.participant_text) - 1
    assert new.ids[max(memo.participant_text)] == old.ids[max(old_memo.participant_text)]
    fresh = _fresh(chat)
    _fill(new)
    _assert_equals_fresh(new, fresh)
    assert _recall(new, chat, 1) == _recall(fresh, chat, 1)


def test_an_event_moved_in_seq_drops_the_nearest_event_lists(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    node = chat.get_node(CHAT, "e040")
    assert node is not None
    with chat.write(CHAT) as w:
        w.upsert_nodes([node.model_copy(update={"seq": 201, "seq_range": (201, 202)})])
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    change = new.structure.change
    assert change is not None and new.index["e040"] in change.rewritten.tolist()
    memo = owners._memo(new)
    assert memo.events is None and not any(kind == "near" for kind, _ in memo.walk)
    if change.appended_only:  # the event lists (edges, types) still stand
        assert any(kind == "event" for kind, _ in memo.walk)
    assert new.index["e040"] not in memo.participant_text and len(memo.participant_text) == len(
        old_memo.participant_text) - 1
    fresh = _fresh(chat)
    _fill(new)
    _assert_equals_fresh(new, fresh)
    assert _recall(new, chat, 2) == _recall(fresh, chat, 2)


def test_an_owner_catalog_change_resolves_owners_again(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    assert old_memo.pov_owner
    with chat.write(CHAT) as w:
        w.set_knowledge(_owners_state(aliases=("Erin", "the Warden")))
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    change = new.structure.change
    assert change is not None and change.state_changed
    memo = owners._memo(new)
    assert memo.signature != old_memo.signature and memo.pov_owner == {} and memo.pov_base == {}
    assert memo.participant_text == old_memo.participant_text  # reads only the node
    assert dict(owners._participant_memo(new)) == {}  # contributions read the catalog's aliases
    fresh = _fresh(chat)
    _fill(new)
    _assert_equals_fresh(new, fresh)
    assert _recall(new, chat, 0) == _recall(fresh, chat, 0)


def test_a_knowledge_write_that_keeps_the_catalog_keeps_the_owners(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    state = _owners_state()
    erin = state.owners["character:erin"].model_copy(update={"known_node_ids": ("e000", "e001", "e002")})
    with chat.write(CHAT) as w:
        w.set_knowledge(KnowledgeState(owners={**state.owners, "character:erin": erin}))
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    assert new.structure.change is not None and new.structure.change.state_changed
    memo = owners._memo(new)
    assert memo.pov_owner == old_memo.pov_owner and memo.scenes == {}
    assert len(owners._participant_memo(new)) == len(owners._participant_memo(old))
    _assert_equals_fresh(new, _fresh(chat))


def test_a_rewritten_node_is_matched_again(chat: Store) -> None:
    """An edit that names another owner in a node's text: an appended-only delta (a rewrite in place) drops that
    node's participant text and contributions, and the other nodes' stand."""
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    old_memo = _fill(old)
    node = chat.get_node(CHAT, "e008")  # "the ferryman waits at the harbor": no owner named
    assert node is not None
    with chat.write(CHAT) as w:
        w.upsert_nodes([node.model_copy(update={"fields": {**node.fields, "participants": "Bram, the ferryman"}})])
    new = cache.get(chat, CHAT, MODEL, now_ms=NOW)
    change = new.structure.change
    i = new.index["e008"]
    assert change is not None and change.appended_only and change.rewritten.tolist() == [i]
    table = owners._participant_memo(new)
    assert (CATALOG, i) not in table and len(table) == len(owners._participant_memo(old)) - 1
    memo = owners._memo(new)
    assert i not in memo.participant_text and len(memo.participant_text) == len(old_memo.participant_text) - 1
    _fill(new)
    assert [c[0] for c in table[(CATALOG, i)]] == ["character:bram"]
    fresh = _fresh(chat)
    _assert_equals_fresh(new, fresh)
    assert _recall(new, chat, 1) == _recall(fresh, chat, 1)
