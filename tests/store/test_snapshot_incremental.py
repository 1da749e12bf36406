"""Incremental snapshot updates: after any sequence of writes, the snapshot :class:`SnapshotCache` keeps up to date
from the store's deltas equals a fresh build of the same version — every array field, every node, and the full
recall output with the per-structure caches updated from the previous structure's — and the delta path is the one
taken (never a rebuild)."""

from __future__ import annotations

import dataclasses
import gc
import shutil
import weakref
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mapped_buffers import mapping_of
from snapshot_equality import exactly_equal

from memory_recall import bench, heap
from memory_recall.model.graph import Edge, MemoryScope, Node
from memory_recall.model.state import KnowledgeOwner, KnowledgeState
from memory_recall.pipeline import _graph_cache, anchors, owners, scoring
from memory_recall.pipeline.result import json_dumps
from memory_recall.pipeline.retrieve import prepare_snapshot, retrieve
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.settings import RecallSettings, load_settings
from memory_recall.store import Store
from memory_recall.store import snapshot as snapshot_module
from memory_recall.store.snapshot import (
    GraphSnapshot,
    JoinedStrings,
    SnapshotCache,
    apply_delta,
    build_snapshot,
)
from memory_recall.text.mentions import fold

CHAT = "inc"
MODEL = "test-model"
NOW = 1_700_000_000_000
DIM = bench.DIM
SETTINGS = RecallSettings(profile="app")
#: The default profile too: its stages read per-structure values the app profile does not (turn context, time cues).
PROFILES = (SETTINGS, load_settings(profile="default"))
OPS = ("message", "turn", "turn", "edit", "rescope", "archive", "delete", "edge", "edge-edit", "edge-delete",
       "reinforce", "reinforce-carry", "vector", "vector-delete", "knowledge", "empty", "time")


def _vector(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(DIM).astype(np.float32) * float(rng.uniform(0.5, 3.0))


def _node(i: int, rng: np.random.Generator, *, prev: str | None = None) -> Node:
    kind = ("event", "character", "pov_memory", "location", "message")[i % 5]
    scope: dict[str, Any] = {"region_primary": f"Region {i % 3}"}
    if kind == "pov_memory":
        scope = {"layer": "pov", "owner_type": "character", "owner_name": "Erin", "region_primary": "Tower"}
    words = ("dragon", "lantern", "harbor", "tower", "river", "forest")
    return Node(
        id=f"n{i:03d}", type=kind, seq=i, importance=float(rng.integers(1, 10)), prev_id=prev,
        fields={"title": f"{words[i % 6]} scene {i}", "name": f"Name{i % 4}",
                "summary": f"the {words[(i + 2) % 6]} by the {words[(i + 3) % 6]}",
                "visibility": "Erin" if i % 6 == 0 else ""},
        scope=scope,
        seq_range=(i, i + 1) if i % 4 else None,
        story_time={"segment_id": f"seg-{i % 3}", "tense": "past" if i % 2 else "ongoing"},
    )


def _seed_store(path: Path) -> None:
    rng = np.random.default_rng(7)
    with Store(path) as store:
        nodes = [_node(i, rng, prev=f"n{i - 1:03d}" if i else None) for i in range(14)]
        edges = [Edge(id=f"e{k:03d}", from_id=f"n{k % 14:03d}", to_id=f"n{(k * 5 + 3) % 14:03d}",
                      strength=float(rng.uniform(0.1, 1.0)), edge_type=255 if k % 7 == 0 else 0,
                      expired_at=NOW + 5_000 if k == 4 else None)
                 for k in range(20) if k % 14 != (k * 5 + 3) % 14]
        with store.write(CHAT) as w:
            w.upsert_nodes(nodes)
            w.upsert_edges(edges)
            w.put_embeddings(MODEL, {n.id: _vector(rng) for n in nodes if n.seq % 5 != 3})
            w.set_knowledge(KnowledgeState(owners={"character:erin": KnowledgeOwner(
                owner_key="character:erin", owner_type="character", owner_name="Erin",
                known_node_ids=["n001", "n002"])}))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inc") / "seed.sqlite3"
    _seed_store(path)
    return path


def _differences(a: GraphSnapshot, b: GraphSnapshot) -> list[str]:
    """Names of the snapshot fields that differ (arrays: dtype, shape and bytes; nodes compared as models)."""

    same = exactly_equal

    # The node JSON of a reinforced node predates the overlay's statistics: nodes are compared as models below.
    skip = {"_lock", "_nodes", "_node_json", "structure", "stats", "built_at_ms"}
    out = [f.name for f in dataclasses.fields(GraphSnapshot)
           if f.name not in skip and not same(getattr(a, f.name), getattr(b, f.name))]
    if not same(a.importance, b.importance):
        out.append("importance")
    if [a.node(i) for i in range(a.n)] != [b.node(i) for i in range(b.n)]:
        out.append("nodes")
    return out


#: Per-structure caches with an update path (derived from the parent structure's value and the delta), by the
#: first element of their key: after a recall, each must equal the fresh build's exactly. Fields filled on use
#: (memo tables, the diffusion adjacency's ``derived`` notes for its own updates) are left out. (The result's
#: per-structure core order holds the order of the structure's first overlay, so it is compared in test_result.)
_UPDATED_CACHES = ("anchors", "scoring-arrays", "diffusion-adjacency", "cross-recall-cooccurrence-eligible",
                   "turn-neighbours", "visibility", "context", "time-cue-span")
#: Of those, the ones a recall makes only on some graphs (the time cue reads the chat's years only when a message
#: node is a candidate): compared when both structures hold them.
_UPDATED_WHEN_USED = frozenset({"time-cue-span"})
#: Carried memo tables (filled on use, so compared entry by entry with what a fresh build prepares).
_CARRIED_TABLES = (("lexical-fields",),)
_MEMO_FIELDS = frozenset({"labels", "temporal_memo", "derived"})


def _updated_keys(snap: GraphSnapshot) -> list[Any]:
    def name(key: Any) -> Any:
        return key[0] if isinstance(key, tuple) else key

    return [k for k in _graph_cache._CACHE[snap.structure] if name(k) in _UPDATED_CACHES]


def _cache_differences(a: GraphSnapshot, b: GraphSnapshot) -> list[str]:
    """Keys of :data:`_UPDATED_CACHES` whose values differ between the two snapshots' structures (a recall on
    each ran first; both must hold the same keys, once ``b`` has the values prepare derived for ``a``)."""
    # Values prepare derived that the recall did not read: made for the fresh build by the same accessor.
    for key in set(_updated_keys(a)) - set(_updated_keys(b)):
        _graph_cache._RECIPES[a.structure][key](b)
    keys = sorted(_updated_keys(a), key=repr)  # in the order each was made: prepare may have derived some first
    if keys != sorted(_updated_keys(b), key=repr):
        return [f"keys {keys} != {_updated_keys(b)}"]
    held = {k[0] if isinstance(k, tuple) else k for k in keys}
    out = [f"no {name} cache" for name in _UPDATED_CACHES  # the recall must have made each
           if name not in held and name not in _UPDATED_WHEN_USED]
    for key in keys:
        x = _graph_cache._CACHE[a.structure][key]
        y = _graph_cache._CACHE[b.structure][key]
        if not dataclasses.is_dataclass(x):
            out.extend([] if exactly_equal(x, y) else [f"{key}"])
            continue
        names = [f.name for f in dataclasses.fields(x) if f.name not in _MEMO_FIELDS]
        out.extend(f"{key}.{name}" for name in names if not exactly_equal(getattr(x, name), getattr(y, name)))
    table = _graph_cache._CACHE[a.structure].get(_CARRIED_TABLES[0])
    if table is not None:
        for k in table.keys():
            prepared = scoring._prepared_node(b, k)
            if table.field_texts(k) != (() if prepared is None else tuple(f.text for f in prepared.fields)):
                out.append(f"lexical-fields[{k}]")
    return out


#: Per-node arrays a delta recomputes at the rewritten rows (what StructureChange.changed_columns names).
_ROW_COLUMNS = ("type_code", "archived", "seq", "seq_start", "seq_end", "importance", "created_time", "is_pov",
                "owner_type_code", "scope_owner_key", "tense_code", "has_story_label", "has_span_label",
                "prev_index", "next_index")
#: Values an appended-only turn (chat state untouched, no node changing its type) derives rather than leaves.
_TURN_UPDATED = (("turn-neighbours",), ("visibility", "index"), ("context", "owner-index"), ("time-cue-span",),
                 ("stats", ("result-core-order",)), ("stats", ("result-node-dumps",)))


def _change_rows(old: GraphSnapshot, new: GraphSnapshot) -> tuple[frozenset[str], list[int]]:
    """What an appended-only change must report, from the two snapshots' arrays: the columns that differ at a
    rewritten row, and the old rows whose prev/next index moved."""
    rw = new.structure.change.rewritten
    changed = frozenset(
        name for name in _ROW_COLUMNS
        if not exactly_equal(getattr(old, name)[rw], getattr(new, name)[rw])
    )
    n = old.n
    moved = (old.prev_index != new.prev_index[:n]) | (old.next_index != new.next_index[:n])
    return changed, np.flatnonzero(moved).tolist()


def _recall(snap: GraphSnapshot, store: Store, k: int) -> str:
    query = RecallQuery(
        user_message=("the dragon by the river", "a lantern in the tower", "Erin at the harbor")[k % 3],
        recent_lines=("[user]: hello", "[assistant]: The lantern flickers."),
        now_ms=NOW, seed=k, chat_id=CHAT, user_floor=20 + k, active_region="Region 1",
        active_owner_keys=("character:erin",),
    )
    providers = Providers(embedder=bench._PassThroughEmbedder(MODEL, {}),
                          lexical_index=partial(store.bm25, CHAT))
    return "\n".join(json_dumps(retrieve(snap, query, settings, providers)) for settings in PROFILES)


class _World:
    """The writes of one example; ``rng`` picks targets so every sequence is reproducible."""

    def __init__(self, store: Store, cache: SnapshotCache) -> None:
        self.store = store
        self.cache = cache
        self.now = NOW
        self.next_node = 100
        self.next_edge = 100

    def ids(self) -> list[str]:
        return sorted(n.id for n in self.store.get_nodes(CHAT))

    def edge_ids(self) -> list[str]:
        return sorted(e.id for e in self.store.get_edges(CHAT))

    def apply(self, op: str, seed: int) -> str:
        """Run ``op``; returns how the cache must get the next snapshot ("delta" or "stats")."""
        rng = np.random.default_rng(seed)
        ids = self.ids()
        pick = ids[int(rng.integers(len(ids)))] if ids else None
        if op == "message" or pick is None:
            i, self.next_node = self.next_node, self.next_node + 1
            node = _node(i, rng, prev=ids[-1] if ids else None)
            with self.store.write(CHAT) as w:
                w.upsert_nodes([node])
                if ids:
                    w.upsert_edges([Edge(id=f"m{i}", from_id=node.id, to_id=ids[int(rng.integers(len(ids)))],
                                         strength=0.6)])
                w.put_embeddings(MODEL, {node.id: _vector(rng)})
            return "delta"
        if op == "turn":  # a chat turn: a message node chained to the last one, as ingestion writes it
            i, self.next_node = self.next_node, self.next_node + 1
            turns = sorted((n for n in self.store.get_nodes(CHAT) if n.type == "message" and n.id.startswith("t")),
                           key=lambda n: n.seq)
            last = turns[-1] if turns else None
            floor = i if last is None or rng.integers(3) else last.seq  # sometimes on the floor of the last turn
            node = Node(id=f"t{i:03d}", type="message", seq=floor, seq_range=(floor, floor),
                        prev_id=last.id if last else None,
                        created_time=NOW + int(rng.integers(-10**11, 10**11)),
                        fields={"text": f"the lantern at the harbor, turn {i}", "speaker": "Erin"})
            named = last is not None and bool(rng.integers(2))
            if named:  # the old turn names the new one before it exists: the link resolves when it comes
                assert last is not None
                with self.store.write(CHAT) as w:
                    w.upsert_nodes([last.model_copy(update={"next_id": node.id})])
                self.cache.get(self.store, CHAT, MODEL, now_ms=self.now)
            with self.store.write(CHAT) as w:
                if last is not None and not named:
                    w.upsert_nodes([last.model_copy(update={"next_id": node.id})])
                w.upsert_nodes([node])
            return "delta"
        if op == "rescope":  # rewritten with the same fields: caches made of the fields alone keep the node's values
            old = self.store.get_node(CHAT, pick)
            assert old is not None
            with self.store.write(CHAT) as w:
                w.upsert_nodes([old.model_copy(update={"scope": MemoryScope(region_primary=f"Region {seed % 4}"),
                                                       "importance": float(rng.integers(1, 10))})])
            return "delta"
        if op in ("edit", "archive"):
            old = self.store.get_node(CHAT, pick)
            assert old is not None
            upd: dict[str, Any] = {"fields": {**old.fields, "title": f"edited {seed % 97}",
                                              "name": f"Renamed{seed % 5}"}}
            if op == "archive":
                upd["archived"] = not old.archived
            else:
                upd["importance"] = float(rng.integers(1, 10))
                upd["seq_range"] = None if old.seq_range else (old.seq, old.seq + 2)
            with self.store.write(CHAT) as w:
                w.upsert_nodes([old.model_copy(update=upd)])
            return "delta"
        if op == "delete":
            with self.store.write(CHAT) as w:
                w.delete_nodes([pick])
            return "delta"
        if op in ("delete-tail", "delete-tail-rewrite"):
            # The newest node goes (a chat's deleted message: ingestion moves the later turns' contents down a
            # floor and deletes the last node); "-rewrite" also writes some edges again as they were, as that does.
            nodes = self.store.get_nodes(CHAT)
            last = nodes[-1].id
            again = [e for e in self.store.get_edges(CHAT) if last not in (e.from_id, e.to_id)][: 1 + seed % 3]
            with self.store.write(CHAT) as w:
                w.delete_nodes([last])
                if op == "delete-tail-rewrite" and again:
                    w.upsert_edges(again)
            return "delta"
        others = [i for i in ids if i != pick]
        if op == "edge" and others:
            j, self.next_edge = self.next_edge, self.next_edge + 1
            other = others[int(rng.integers(len(others)))]
            with self.store.write(CHAT) as w:
                w.upsert_edges([Edge(id=f"x{j}", from_id=pick, to_id=other, strength=float(rng.uniform(0.1, 1)),
                                     edge_type=255 if j % 3 == 0 else 0,
                                     expired_at=self.now + 2_000 if j % 4 == 0 else None)])
            return "delta"
        edges = self.edge_ids()
        if op in ("edge-edit", "edge-delete") and edges:
            target = edges[int(rng.integers(len(edges)))]
            with self.store.write(CHAT) as w:
                if op == "edge-delete":
                    w.delete_edges([target])
                else:
                    e = next(e for e in self.store.get_edges(CHAT) if e.id == target)
                    end = pick if pick != e.from_id else e.to_id
                    w.upsert_edges([e.model_copy(update={"strength": float(rng.uniform(0.1, 1)), "to_id": end})])
            return "delta"
        if op in ("reinforce", "reinforce-carry"):
            chosen = sorted(set(rng.choice(ids, size=min(3, len(ids)), replace=False).tolist()))
            with self.store.write(CHAT) as w:
                base = w.chat_version(CHAT)
                w.reinforce(chosen, self.now, 0.7)
                version = w.version
            if op == "reinforce-carry":  # the controller's path: the cache is told what the write did
                self.cache.apply_reinforcement(CHAT, MODEL, chosen, 0.7, version, base_version=base, now_ms=self.now)
                return "cached"
            return "stats"
        if op == "vector":
            with self.store.write(CHAT) as w:
                w.put_embeddings(MODEL, {pick: _vector(rng)})
            return "delta"
        if op == "vector-delete":
            with self.store.write(CHAT) as w:
                w.delete_embeddings(MODEL, [pick])
            return "delta"
        if op == "knowledge":
            known = sorted(set(rng.choice(ids, size=min(4, len(ids)), replace=False).tolist()))
            with self.store.write(CHAT) as w:
                w.set_knowledge(KnowledgeState(owners={"character:erin": KnowledgeOwner(
                    owner_key="character:erin", owner_type="character", owner_name="Erin", known_node_ids=known)}))
            return "delta"
        if op == "time":  # past the expiry of the edges that have one: the horizon moves, not the version
            self.now += 6_000
            return "delta"
        with self.store.write(CHAT):  # a batch that writes nothing of the graph
            pass
        return "delta"


@pytest.fixture
def world(seeded: Path, tmp_path: Path) -> Iterator[_World]:
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(seeded, path)
    with Store(path) as store:
        yield _World(store, SnapshotCache())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2**32 - 1)), min_size=1, max_size=10))
def test_incremental_snapshot_equals_a_fresh_build(seeded: Path, tmp_path_factory: pytest.TempPathFactory,
                                                   steps: list[tuple[str, int]]) -> None:
    path = tmp_path_factory.mktemp("ex") / "store.sqlite3"
    shutil.copyfile(seeded, path)
    _check_steps(path, steps)


#: Writes around deletions: any node, the newest (with edges written again as they were), among chat turns.
DELETE_OPS = ("turn", "turn", "message", "delete", "delete-tail", "delete-tail-rewrite", "edit", "vector", "edge",
              "reinforce-carry")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(DELETE_OPS), st.integers(0, 2**32 - 1)), min_size=2, max_size=10))
def test_deletions_keep_the_snapshot_equal_to_a_fresh_build(
    seeded: Path, tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    """Deleted nodes: the snapshot derived from the kept graph (:func:`snapshot._kept_snapshot`, then the
    rewritten and new rows appended) equals a fresh build, and so do its recalls and derived values."""
    path = tmp_path_factory.mktemp("del") / "store.sqlite3"
    shutil.copyfile(seeded, path)
    _check_steps(path, steps)


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the full builds of the snapshot arrays (``_build_snapshot``) from now on: the list's length."""
    calls: list[int] = []
    build = snapshot_module._build_snapshot

    def counted(source: Any, *, now_ms: int) -> GraphSnapshot:
        calls.append(now_ms)
        return build(source, now_ms=now_ms)

    monkeypatch.setattr(snapshot_module, "_build_snapshot", counted)
    return calls


@pytest.mark.parametrize("op", ["delete-tail", "delete-tail-rewrite", "middle"])
def test_a_deletion_is_derived_from_the_kept_graph_not_built(
    world: _World, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """A deleted node (the newest, the newest with edges written again unchanged, or one in the middle with its
    edges) gives a snapshot derived from the old one's arrays: no full build of the arrays, equal to a fresh
    build, its recall too. The stages' values the old structure held (anchors, scoring arrays, the diffusion
    adjacency) are derived for it by dropping the deleted rows, then updating for the rest, each equal to the
    fresh build's."""
    for i in range(3):
        world.apply("turn", 70 + i)
    before = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    _recall(before, world.store, 5)  # the old structure's values, which the new one's derive from
    builds = _builds(monkeypatch)
    if op == "middle":  # a turn between two others: its edges go, the turns around it keep theirs
        middle = sorted((i for i in range(before.n) if before.ids[i].startswith("t")), key=before.ids.__getitem__)[1]
        gone = before.ids[middle]
        with world.store.write(CHAT) as w:
            w.delete_nodes([gone])
    else:
        gone = before.ids[-1]
        world.apply(op, 3)
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert builds == [] and world.cache.last_update[CHAT] == "delta"
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert after.n == before.n - 1 and gone not in after.index
    assert _differences(after, fresh) == []
    derived = {k[0] for k in prepare_snapshot(after) if isinstance(k, tuple)}
    assert {"anchors", "scoring-arrays", "diffusion-adjacency"} <= derived, derived
    assert _recall(after, world.store, 5) == _recall(fresh, world.store, 5)
    assert _cache_differences(after, fresh) == []


def test_a_deletion_whose_dead_edge_joined_two_kept_nodes_sums_their_rows_again(
    world: _World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edge deleted between two nodes that stay, beside parallel edges between them: their rows are summed
    again from the kept edges, bit for bit as a build sums them (strengths whose sum depends on the order), with
    no full build of the arrays."""
    before = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    a, b = before.ids[1], before.ids[2]
    parallel = [Edge(id=f"par{j}", from_id=a if j % 2 else b, to_id=b if j % 2 else a, strength=s)
                for j, s in enumerate((0.1, 0.2, 0.3, 0.7, 1e-9))]
    with world.store.write(CHAT) as w:
        w.upsert_edges(parallel)
    world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    builds = _builds(monkeypatch)
    victim = before.ids[5]
    with world.store.write(CHAT) as w:
        w.delete_nodes([victim])
        w.delete_edges(["par2"])
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert builds == [] and world.cache.last_update[CHAT] == "delta" and victim not in after.index
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert _differences(after, fresh) == []
    pa, pb = after.index[a], after.index[b]
    base = sum(e.strength for e in world.store.get_edges(CHAT) if {e.from_id, e.to_id} == {a, b}
               and e.edge_type != 255 and not e.id.startswith("par"))
    assert after.adjacency[pa, pb] == pytest.approx(base + 0.1 + 0.2 + 0.7 + 1e-9)


#: A chat's turns, some named by the turn before them ahead of time, among other writes.
_CHAT_TURNS = [("turn", 1), ("turn", 2), ("turn", 3), ("turn", 4), ("edit", 5), ("turn", 6), ("turn", 7),
               ("knowledge", 8), ("turn", 9), ("reinforce-carry", 10), ("turn", 11), ("delete", 12), ("turn", 13),
               ("turn", 14)]


def test_chat_turns_update_each_per_structure_value(seeded: Path, tmp_path: Path) -> None:
    """The turn values (message pairs, visibility index, owner index, time span, core order) are derived after
    each turn and equal the fresh build's, the message pairs growing with the chat."""
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(seeded, path)
    last = _check_steps(path, _CHAT_TURNS)
    pairs = _graph_cache._CACHE[last.structure][("turn-neighbours",)]
    turns = sorted((i for i in range(last.n) if last.ids[i].startswith("t")), key=lambda i: last.ids[i])
    assert pairs.prev_rows.tolist() == turns[1:] and pairs.prev_of.tolist() == turns[:-1]
    assert pairs.next_rows.tolist() == turns[:-1] and pairs.next_of.tolist() == turns[1:]


def _check_steps(path: Path, steps: list[tuple[str, int]]) -> GraphSnapshot:
    """Apply ``steps`` to the store at ``path``, checking after each that the cache's snapshot, its recalls and its
    updated per-structure values equal a fresh build's. Returns the last snapshot."""
    with Store(path) as store:
        w = _World(store, SnapshotCache())
        first = w.cache.get(store, CHAT, MODEL, now_ms=w.now)
        assert w.cache.last_update[CHAT] == "rebuild"
        _recall(first, store, 0)
        previous = first
        for op, seed in steps:
            # What the older snapshot's readers see of its vectors (its rows with one) must not change.
            kept_rows = previous.embeddings[previous.has_vector].tobytes()
            expected = w.apply(op, seed)
            snap = w.cache.get(store, CHAT, MODEL, now_ms=w.now)
            assert previous.embeddings[previous.has_vector].tobytes() == kept_rows, (op, seed)
            fresh = build_snapshot(store.snapshot_source(CHAT, MODEL), now_ms=w.now)
            assert snap.version == fresh.version == store.chat_version(CHAT)
            assert _differences(snap, fresh) == [], (op, seed)
            change = snap.structure.change
            if snap.structure is not previous.structure and change is not None and change.appended_only:
                assert _change_rows(previous, snap) == (change.changed_columns, change.relinked.tolist()), (op, seed)
                # Before the recall, as a chat event does: the values updated after a turn are derived, not left.
                parent = snap.structure.parent  # previous's, or an unrecalled one between (a "turn" in two writes)
                parent_keys = set(_graph_cache._CACHE.get(parent, ())) if parent is not None else set()
                prepared = set(prepare_snapshot(snap))
                if not change.state_changed and "type_code" not in change.changed_columns:
                    assert {k for k in _TURN_UPDATED if k in parent_keys} <= prepared, (op, seed)
            # The recall on the updated snapshot (per-structure caches updated from the parent's, which the
            # previous step's recall filled) equals the recall on the fresh build (every cache built anew).
            assert _recall(snap, store, seed) == _recall(fresh, store, seed), (op, seed)
            assert _cache_differences(snap, fresh) == [], (op, seed)
            if op == "message":
                assert snap.structure.change is not None and snap.structure.change.appended_only, seed
            how = w.cache.last_update[CHAT]
            if expected == "stats":
                assert how == "stats" and snap.structure is previous.structure
            elif expected == "cached":
                assert how == "cached" and snap.structure is previous.structure
            else:
                assert how in ("delta", "stats", "cached"), (op, how)
            previous = snap
        return previous


def test_a_new_message_is_a_delta_and_recalls_equal(world: _World) -> None:
    before = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.apply("message", 11) == "delta"
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta"
    assert after.n == before.n + 1 and after.ids[-1] == "n100" and after.structure is not before.structure
    assert _differences(after, fresh) == []
    assert _recall(after, world.store, 0) == _recall(fresh, world.store, 0)


def test_reinforcement_keeps_the_structure_and_overlays_the_node(world: _World) -> None:
    before = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    with world.store.write(CHAT) as w:
        w.reinforce(["n003"], NOW + 9, 0.5)
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "stats"
    assert after.structure is before.structure and after is not before
    i = after.index["n003"]
    assert after.importance[i] == before.importance[i] + 0.5
    node = after.node(i)
    assert (node.access_count, node.last_access_time) == (before.node(i).access_count + 1, NOW + 9)
    assert after.node(i) == world.store.get_node(CHAT, "n003")
    assert before.node(i).access_count == 0  # the old snapshot is unchanged


def test_a_rebuild_mark_makes_the_cache_rebuild(world: _World) -> None:
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    with world.store.write(CHAT) as w:
        w.delete_embeddings(MODEL)  # every vector of the model: no delta describes it
    assert world.store.snapshot_delta(CHAT, MODEL, snap.version) is None
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "rebuild" and after.dim == 0


def test_apply_delta_refuses_a_delta_from_another_version(world: _World) -> None:
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    world.apply("message", 3)
    delta = world.store.snapshot_delta(CHAT, MODEL, snap.version - 1)
    assert delta is not None and apply_delta(snap, delta, now_ms=NOW) is None


def test_caches_are_updated_from_the_parent_after_the_old_snapshot_is_gone(world: _World) -> None:
    """The service keeps only the newest snapshot: the new structure holds its parent (and so the parent's caches)
    until it is updated itself, so the first recall after a write updates the parent's values."""
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    _recall(snap, world.store, 0)
    texts = dict(owners._memo(snap).participant_text)
    assert texts
    parent = weakref.ref(snap.structure)
    del snap
    gc.collect()
    assert world.apply("message", 5) == "delta"
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert new.structure.parent is parent() is not None
    assert owners._memo(new).participant_text == texts  # moved from the parent (an append moves no node)
    world.apply("edge", 6)
    newer = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    gc.collect()
    assert newer.structure.parent is new.structure and new.structure.parent is None and parent() is None


def test_a_new_message_updates_the_caches_from_the_parent(world: _World) -> None:
    """An appended message takes the update paths: the snapshot's arrays are derived from the parent's (the
    vector matrix grows in place into spare rows, the old snapshot keeps its rows), and the per-structure caches
    are derived from the parent's values (untouched entries are the parent's objects, memo tables carried)."""
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    _recall(snap, world.store, 0)
    old_anchors = anchors._folded_anchors(snap)
    old_arrays = scoring._snapshot_arrays(snap)
    assert old_arrays.labels
    shared = [t for t, v in old_anchors.index.items() if len(v) > 1]
    assert shared
    assert world.apply("message", 11) == "delta"
    world.apply("message", 12)
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert new.structure.change is not None and new.structure.change.appended_only
    assert _differences(new, fresh) == []
    assert new.n == snap.n + 2 and new.embeddings.base is not None
    arrays = scoring._snapshot_arrays(new)
    rewritten = set(new.structure.change.rewritten.tolist())
    changed = set(new.structure.change.fields_changed.tolist())
    assert changed <= rewritten
    assert arrays.labels == {i: v for i, v in old_arrays.labels.items() if i not in rewritten}
    # The lexical field table carries the packed rows of every kept node whose fields are unchanged (as prepared
    # afresh), rewritten or not.
    old_table = scoring._field_table(snap)
    table = scoring._field_table(new)
    assert len(old_table) and table.keys() == [k for k in old_table.keys() if k not in changed]
    for k in table.keys():
        prepared = scoring._prepared_node(fresh, k)
        assert table.field_texts(k) == (() if prepared is None else tuple(f.text for f in prepared.fields))
    folded = anchors._folded_anchors(new)
    added = {fold(t) for i in range(snap.n, new.n) for t in new.anchor_terms[i]}
    untouched = [t for t in shared if t not in added]
    assert untouched
    assert all(folded.index[t] is old_anchors.index[t] for t in untouched)
    assert all(folded.index[t] != old_anchors.index.get(t) for t in added if t in old_anchors.index)
    _recall(new, world.store, 3)
    _recall(fresh, world.store, 3)
    assert _cache_differences(new, fresh) == []
    before = new.embeddings.copy()
    world.apply("message", 13)
    newer = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert newer.n == new.n + 1 and np.shares_memory(newer.embeddings, new.embeddings)
    assert new.embeddings.shape == before.shape and new.embeddings.tobytes() == before.tobytes()
    assert newer.embeddings[: new.n].tobytes() == before.tobytes()
    assert _differences(newer, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 10_000)), min_size=1, max_size=30),
       st.integers(2, 6))
def test_spliced_node_json_equals_the_spliced_list(steps: list[tuple[int, int, int]], limit: int) -> None:
    """Deltas on the node JSON (rows deleted, rewritten, appended), composed into one level over the blobs the store
    read and packed into one blob past the limit of written rows: item for item the list they describe."""
    rng = np.random.default_rng(len(steps))
    model = [f"b{i}".encode() for i in range(8)]
    ends = np.cumsum([len(b) for b in model])
    blobs: Any = snapshot_module.BlobSlices(b"".join(model), ends)
    old_limit = snapshot_module._MAX_SPLICED_EXTRA
    snapshot_module._MAX_SPLICED_EXTRA = limit
    try:
        for k, (deleted, rewritten, added) in enumerate(steps):
            n = len(model)
            keep = np.sort(rng.choice(n, size=max(n - min(deleted, n - 1), 1), replace=False))
            take = np.concatenate([keep, np.full(added % 3, -1, np.int64)]).astype(np.int64)
            extra: dict[int, bytes] = {}
            for p in rng.choice(keep.size, size=min(rewritten, keep.size), replace=False).tolist():
                take[p] = -1
                extra[p] = f"r{k}.{p}".encode()
            for j in range(added % 3):
                extra[keep.size + j] = f"a{k}.{j}".encode()
            model = [extra[i] if at < 0 else model[at] for i, at in enumerate(take.tolist())]
            blobs = snapshot_module._spliced(blobs, take, extra)
            assert list(blobs) == model and len(blobs) == len(model)
            assert not isinstance(getattr(blobs, "_base", None), snapshot_module._SplicedBlobs)
    finally:
        snapshot_module._MAX_SPLICED_EXTRA = old_limit


def test_parsed_nodes_stay_bounded_and_carry_the_newest(world: _World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot keeps at most MAX_PARSED_NODES parsed nodes (the oldest parse goes), and the snapshot a delta
    derives from it takes over the newest of them: the same nodes as parsed afresh."""
    monkeypatch.setattr(snapshot_module, "MAX_PARSED_NODES", 5)
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    for i in range(12):
        assert snap.node(i) == fresh.node(i)
    assert list(snap._nodes) == [7, 8, 9, 10, 11]
    assert world.apply("message", 4) == "delta"
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    rewritten = set(new.structure.change.rewritten.tolist()) if new.structure.change else set()
    assert list(new._nodes) == [i for i in (7, 8, 9, 10, 11) if i not in rewritten]
    assert all(new._nodes[i] is snap._nodes[i] for i in new._nodes)


def test_a_parse_not_kept_leaves_the_snapshot_as_it_was(world: _World) -> None:
    """``node(i, keep=False)`` gives the node ``node(i)`` gives without adding it to the parsed nodes; a kept parse
    is returned as it is."""
    snap = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert [snap.node(i, keep=False) for i in range(6)] == [fresh.node(i) for i in range(6)]
    assert list(snap._nodes) == []
    kept = snap.node(3)
    assert snap.node(3, keep=False) is kept and list(snap._nodes) == [3]


def test_appended_rows_share_the_buffer_and_never_write_over_an_array() -> None:
    """An append writes into the buffer's spare room only for its longest view; any other view gets a new buffer;
    the result is the concatenation (dtype, shape, bytes) for 1-D, object and 2-D arrays."""
    first = snapshot_module.appended_rows(np.arange(5, dtype=np.int64), np.array([5, 6]))
    second = snapshot_module.appended_rows(first, np.array([7]))  # room in the buffer: appended in place
    assert second.base is first.base and second.tolist() == list(range(8)) and first.tolist() == list(range(7))
    other = snapshot_module.appended_rows(first, np.array([-1, -2]))  # rows 7… are second's now: a new buffer
    assert other.base is not first.base and other.tolist() == [*range(7), -1, -2]
    assert second.tolist() == list(range(8)) and first.tolist() == list(range(7))
    objs = snapshot_module.appended_rows(np.array(["a"], dtype=object), np.array(["b"], dtype=object))
    assert objs.dtype == object and objs.tolist() == ["a", "b"]
    matrix = snapshot_module.appended_rows(np.zeros((2, 3), np.int32), np.ones((1, 3), np.int32))
    assert matrix.shape == (3, 3) and matrix.dtype == np.int32 and matrix.tobytes() == np.concatenate(
        [np.zeros((2, 3), np.int32), np.ones((1, 3), np.int32)]).tobytes()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-50, 50), max_size=30),
    st.lists(st.tuples(st.floats(0, 1), st.integers(-9, 9), st.booleans()), min_size=1, max_size=8),
    st.sampled_from([np.int32, np.int64, np.float64, object]),
)
def test_inserted_equals_numpy_insert(
    base: list[int], entries: list[tuple[float, int, bool]], dtype: Any
) -> None:
    """:func:`inserted` gives ``np.insert``'s array for positions within ``[-n, n]`` (values, dtype, the order of
    values at one position, unsorted and negative positions); a position past either end is an ``IndexError``
    (``np.insert`` wraps some of those silently)."""
    arr = np.asarray(base, dtype=dtype)
    n = arr.size
    at = [round(f * n) - (n if negative and round(f * n) < n else 0) for f, _, negative in entries]
    vals = np.asarray([v for _, v, _ in entries], dtype=dtype)
    want = np.insert(arr, np.asarray(at, dtype=np.int64), vals)
    got = snapshot_module.inserted(arr, at, vals)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert snapshot_module.inserted(arr, [], vals[:0]).tolist() == arr.tolist()
    for wrong in (n + 1, -n - 1):
        with pytest.raises(IndexError):
            snapshot_module.inserted(arr, [0, wrong], vals[:1].repeat(2))


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 60), max_size=25), st.lists(st.integers(-5, 70), max_size=20), st.booleans())
def test_positions_finds_each_key_sorted_or_not(keys: set[int], query: list[int], ascending: bool) -> None:
    """:func:`_positions`: each query value's position in the keys, −1 when absent, whether the keys are ascending
    (rowids in insertion order: searched as they are) or not (sorted first)."""
    arr = np.asarray(sorted(keys) if ascending else list(keys)[::-1], dtype=np.int64)
    where = {int(k): i for i, k in enumerate(arr.tolist())}
    got = snapshot_module._positions(arr, np.asarray(query, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == [where.get(q, -1) for q in query]


def test_the_first_append_after_a_read_writes_into_the_spare_rows(world: _World) -> None:
    """The store reads a chat's vectors into a matrix with spare rows after it, so the first new message after a
    build does not copy the matrix (at 100k nodes that copy was half a second): the new rows go into the spare
    ones, the built snapshot keeps its shorter view and its bytes, and a second snapshot built from the same read
    does not append into the same rows."""
    first = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "rebuild"
    buffer = first.embeddings.base
    assert buffer is not None and buffer.shape[0] == first.n + snapshot_module.spare_rows(first.n)
    before = first.embeddings.copy()
    world.apply("message", 21)
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and new.n == first.n + 1
    assert new.embeddings.base is buffer and np.shares_memory(new.embeddings, first.embeddings)
    assert first.embeddings.tobytes() == before.tobytes() and new.embeddings[: first.n].tobytes() == before.tobytes()
    assert _differences(new, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []
    # Two snapshots of one read: the second to append gets a copy, the first's rows stay as written.
    source = world.store.snapshot_source(CHAT, MODEL)
    a, b = build_snapshot(source, now_ms=NOW), build_snapshot(source, now_ms=NOW)
    world.apply("message", 22)
    delta = world.store.snapshot_delta(CHAT, MODEL, a.version)
    assert delta is not None
    child_a, child_b = apply_delta(a, delta, now_ms=NOW), apply_delta(b, delta, now_ms=NOW)
    assert child_a is not None and child_b is not None
    assert child_a.embeddings.base is a.embeddings.base and child_b.embeddings.base is not a.embeddings.base
    assert child_a.embeddings.tobytes() == child_b.embeddings.tobytes()
    assert a.embeddings.tobytes() == b.embeddings.tobytes() == child_a.embeddings[: a.n].tobytes()


def _buffer_rows(matrix: np.ndarray) -> int:
    """Rows of the buffer ``matrix`` is a view of."""
    assert isinstance(matrix.base, np.ndarray)
    return int(matrix.base.size) // matrix.shape[1]


@pytest.mark.parametrize("mapped", [False, True], ids=["heap", "mapped"])
def test_a_rewritten_vector_row_copies_once_and_the_next_append_writes_into_the_spare_rows(
    world: _World, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    """An edited message: its node held a vector, and the background embedding writes its new one. That delta must
    copy the matrix (an older snapshot may still read the old vector); the copy has spare rows, so the next message
    appends into them instead of copying again (at 10k nodes, 8 ms of every event). A large copy gets its own
    mapping (``mapped``: the bound lowered so this chat's small matrix is one), and the append works the same."""
    monkeypatch.setattr(heap, "MAPPED_MIN_BYTES", 0 if mapped else 1 << 40)
    first = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    world.apply("message", 31)
    appended = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    before = appended.embeddings.copy()
    has_before = appended.has_vector.copy()
    target = appended.ids[int(np.flatnonzero(appended.has_vector)[3])]  # a kept row that holds a vector
    with world.store.write(CHAT) as w:
        w.put_embeddings(MODEL, {target: _vector(np.random.default_rng(32))})
    rewritten = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta"
    assert not np.shares_memory(rewritten.embeddings, appended.embeddings)
    assert appended.embeddings.tobytes() == before.tobytes() and appended.has_vector.tolist() == has_before.tolist()
    assert rewritten.embeddings.tobytes() != before.tobytes()
    buffer = rewritten.embeddings.base
    assert (mapping_of(rewritten.embeddings) is not None) is mapped
    assert _buffer_rows(rewritten.embeddings) == rewritten.n + snapshot_module.spare_rows(rewritten.n)
    kept = rewritten.embeddings.copy()
    world.apply("message", 33)
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and new.n == rewritten.n + 1
    assert new.embeddings.base is buffer
    assert rewritten.embeddings.tobytes() == kept.tobytes()
    assert new.embeddings[: rewritten.n].tobytes() == kept.tobytes()
    assert rewritten.has_vector.tolist() == new.has_vector[: rewritten.n].tolist()
    assert new.n == first.n + 2
    assert _differences(new, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []


def _turn_without_vector(world: _World, i: int) -> Node:
    """A chat turn as an event writes it: the node, chained to the last one, its vector still to come."""
    last = world.ids()[-1]
    node = Node(id=f"p{i:03d}", type="message", seq=500 + i, seq_range=(500 + i, 500 + i), prev_id=last,
                created_time=NOW, fields={"text": f"the lantern at the harbor, turn {i}", "speaker": "Erin"})
    with world.store.write(CHAT) as w:
        w.upsert_nodes([node])
    return node


@pytest.mark.parametrize("runs", ["slices", "gather"])
def test_a_deletion_copies_the_kept_rows_once_and_the_next_append_writes_into_the_spare_rows(
    world: _World, monkeypatch: pytest.MonkeyPatch, runs: str
) -> None:
    """A deleted node: the rows after it move up one place, so the delta copies the kept rows into a new buffer
    (run by run of consecutive rows, or in one gather past :data:`MAX_COPY_RUNS` gaps) with spare rows after them,
    and the next message appends into those instead of copying the matrix a second time (at 100k nodes each copy
    was a quarter of a second). The snapshot the node was deleted from keeps its bytes; both equal fresh builds."""
    monkeypatch.setattr(heap, "MAPPED_MIN_BYTES", 0)  # this chat's small matrix gets a mapping, as a large one does
    monkeypatch.setattr(snapshot_module, "MAX_COPY_RUNS", 64 if runs == "slices" else 0)
    world.apply("message", 51)
    world.apply("message", 52)
    before = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    kept_bytes = before.embeddings.copy()
    gone = before.ids[3]  # an early row: every later one moves
    with world.store.write(CHAT) as w:
        w.delete_nodes([gone])
    after = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and after.n == before.n - 1 and gone not in after.index
    assert before.embeddings.tobytes() == kept_bytes.tobytes()
    rows = [i for i in range(before.n) if i != 3]
    assert after.embeddings.tobytes() == np.where(before.has_vector[rows, None], kept_bytes[rows], 0).tobytes()
    assert mapping_of(after.embeddings) is not None
    assert _buffer_rows(after.embeddings) == after.n + snapshot_module.spare_rows(after.n)
    assert _differences(after, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []
    world.apply("message", 53)
    new = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and new.n == after.n + 1
    assert new.embeddings.base is after.embeddings.base
    assert _differences(new, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []


def test_a_row_filled_by_a_copying_delta_is_claimed(world: _World) -> None:
    """A delta that copies the matrix (it rewrites a row that held a vector) and in the same write gives a new
    turn its first vector: that row is claimed in the new buffer, so re-embedding the turn later copies again
    instead of writing over the vector the snapshot of that delta still reads."""
    world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    world.apply("message", 61)
    node = _turn_without_vector(world, 61)
    pending = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    old_row = pending.ids[int(np.flatnonzero(pending.has_vector)[2])]
    with world.store.write(CHAT) as w:  # the turn's first vector and an old row's new one, in one write
        w.put_embeddings(MODEL, {node.id: _vector(np.random.default_rng(62)),
                                 old_row: _vector(np.random.default_rng(63))})
    filled = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and bool(filled.has_vector[filled.index[node.id]])
    assert not np.shares_memory(filled.embeddings, pending.embeddings)
    kept = filled.embeddings.copy()
    with world.store.write(CHAT) as w:  # the turn re-embedded (an edit)
        w.put_embeddings(MODEL, {node.id: _vector(np.random.default_rng(64))})
    again = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta"
    assert filled.embeddings.tobytes() == kept.tobytes()
    assert again.embeddings[again.index[node.id]].tobytes() != kept[filled.index[node.id]].tobytes()
    assert _differences(again, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []


def test_the_background_vector_of_a_new_turn_is_written_in_place(world: _World) -> None:
    """A chat turn: the event appends the turn's node without a vector, then the background embedding writes its
    first vector. That row never held a vector, so the vector goes into the same memory (at 100k nodes a copy of
    the matrix is 154 MB per message): the turn's snapshot then sees the vector in that row, but its
    ``has_vector`` is false there and every recall on it answers as before, byte for byte; its rows with a vector
    keep their bytes. The filled row is claimed: writing it again (an edit) copies, and so does a delta from a
    snapshot that is no longer the newest, whose rows without a vector the copy holds as zeros."""
    world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    world.apply("message", 41)
    node = _turn_without_vector(world, 1)
    pending = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta"
    row = pending.index[node.id]
    assert row == pending.n - 1 and not pending.has_vector[row] and not pending.embeddings[row].any()
    recalled = [_recall(pending, world.store, k) for k in range(3)]
    kept = pending.embeddings[pending.has_vector].tobytes()
    has_before = pending.has_vector.copy()

    vector = _vector(np.random.default_rng(42))
    with world.store.write(CHAT) as w:
        w.put_embeddings(MODEL, {node.id: vector})
    filled = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta" and filled.n == pending.n
    assert filled.embeddings.base is pending.embeddings.base and np.shares_memory(filled.embeddings, pending.embeddings)
    assert filled.has_vector[row] and pending.has_vector.tolist() == has_before.tolist()
    unit = vector / np.linalg.norm(vector)
    assert pending.embeddings[row].tobytes() == filled.embeddings[row].tobytes() and np.allclose(
        filled.embeddings[row], unit, atol=1e-6)
    assert pending.embeddings[pending.has_vector].tobytes() == kept
    assert [_recall(pending, world.store, k) for k in range(3)] == recalled
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert _differences(filled, fresh) == []
    assert _recall(filled, world.store, 0) == _recall(fresh, world.store, 0)

    # The next turn appends into the spare rows of the same memory, and its vector fills in place again.
    node2 = _turn_without_vector(world, 2)
    with world.store.write(CHAT) as w:
        w.put_embeddings(MODEL, {node2.id: _vector(np.random.default_rng(43))})
    second = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert second.n == filled.n + 1 and second.embeddings.base is filled.embeddings.base
    assert _differences(second, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []

    # A delta from the pending snapshot (no longer the newest): a copy, its rows without a vector zero.
    delta = world.store.snapshot_delta(CHAT, MODEL, pending.version)
    assert delta is not None
    branch = apply_delta(pending, delta, now_ms=NOW)
    assert branch is not None and not np.shares_memory(branch.embeddings, second.embeddings)
    assert _differences(branch, second) == []

    # Writing the filled row again (the message edited): a copy; the older snapshots keep their bytes.
    before = second.embeddings.copy()
    with world.store.write(CHAT) as w:
        w.put_embeddings(MODEL, {node.id: _vector(np.random.default_rng(44))})
    edited = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    assert world.cache.last_update[CHAT] == "delta"
    assert not np.shares_memory(edited.embeddings, second.embeddings)
    assert second.embeddings.tobytes() == before.tobytes()
    assert edited.embeddings[row].tobytes() != before[row].tobytes()
    assert _differences(edited, build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)) == []


def test_a_turns_background_vectors_pass_the_derived_values_on(world: _World) -> None:
    """Between two chat events the background embedding writes the last turn's vectors, and no recall runs on
    that version. Its refresh still derives every per-structure value from the turn's (the diffusion matrices
    shared as they are: a vector changes none of their rows; the owner, admission and scene memos carried), so
    the recall after the next event derives from them instead of building them again."""

    def kept(snap: GraphSnapshot) -> dict[str, bool]:
        keys = _graph_cache._CACHE.get(snap.structure, {})
        return {
            "diffusion": any(isinstance(k, tuple) and k[0] == "diffusion-adjacency" for k in keys),
            "participants": bool(keys.get(("owners", "participants"))),
            "verdicts": bool(keys.get(("admission", "verdicts"))),
            "scenes": bool(keys[("scoring", "scene-codes")].codes) if ("scoring", "scene-codes") in keys else False,
        }

    _turn_without_vector(world, 1)
    turn = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    _recall(turn, world.store, 0)
    assert kept(turn) == dict.fromkeys(("diffusion", "participants", "verdicts", "scenes"), True)
    with world.store.write(CHAT) as w:
        w.put_embeddings(MODEL, {turn.ids[-1]: _vector(np.random.default_rng(51))})
    filled = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    prepare_snapshot(filled)  # what the refresh after the write does; no recall on this version
    assert kept(filled) == kept(turn)
    key = next(k for k in _graph_cache._CACHE[filled.structure]
               if isinstance(k, tuple) and k[0] == "diffusion-adjacency")
    adjacency, parent_adjacency = _graph_cache._CACHE[filled.structure][key], _graph_cache._CACHE[turn.structure][key]
    assert adjacency.normal is parent_adjacency.normal and adjacency.inhibit is parent_adjacency.inhibit
    _turn_without_vector(world, 2)
    nxt = world.cache.get(world.store, CHAT, MODEL, now_ms=NOW)
    prepared = prepare_snapshot(nxt)
    assert kept(nxt) == kept(turn) and key in prepared
    assert ("owners", "participants") in prepared and ("admission", "verdicts") in prepared
    def held(key: Any) -> Any:  # a ("stats", key) value is held by the snapshot object itself
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "stats":
            return _graph_cache._CACHE[nxt].get(key[1])
        return _graph_cache._CACHE[nxt.structure].get(key)

    derived = {k: held(k) for k in prepared}
    assert [k for k, v in derived.items() if v is None] == []
    fresh = build_snapshot(world.store.snapshot_source(CHAT, MODEL), now_ms=NOW)
    assert _recall(nxt, world.store, 0) == _recall(fresh, world.store, 0)
    assert _cache_differences(nxt, fresh) == []
    # The recall used what the write derived: none of those values was built again.
    assert [k for k, v in derived.items() if held(k) is not v] == []


def test_a_copy_of_an_older_view_zeroes_the_rows_it_has_without_a_vector() -> None:
    """:class:`_RowBuffer`: a row filled in place by the head shows in an older view that has no vector there;
    a copy made from that older view holds zeros in it (what a fresh build of the older view's version holds)."""
    data = np.zeros((8, 2), np.float32)
    data[:3] = [[1, 0], [0, 1], [0, 0]]
    has = np.array([True, True, False])
    buffer = snapshot_module._RowBuffer(data, data[:3], has)
    old = buffer.head
    grown = buffer.extended(old, 1, np.array([2, 3]))
    assert grown is not None and grown.shape == (4, 2) and buffer.head is grown
    grown[2:4] = [[0.6, 0.8], [1, 0]]
    assert old[2].tolist() == [np.float32(0.6), np.float32(0.8)]  # the older view sees the row, masked by ``has``
    assert buffer.extended(old, 1, np.zeros(0, np.int64)) is None  # not the head
    assert buffer.extended(grown, 0, np.array([2])) is None  # row 2 is claimed now
    assert buffer.extended(grown, 1, np.zeros(0, np.int64)) is not None
    copy = snapshot_module._RowBuffer.of(old, has, 1)
    assert copy.head.tolist() == [[1, 0], [0, 1], [0, 0], [0, 0]]


def test_deleted_edges_ids_leave_the_text_once_most_are_gone(world: _World) -> None:
    """A delta that deletes edges selects the kept edges' ids by their offsets (no string copied); once less than
    half of the ids' text is in use, the ids are written out anew, so the ids of deleted edges do not pile up over
    a chain of deletions. Every snapshot equals a fresh build's."""
    store, cache = world.store, world.cache
    ids = list(cache.get(store, CHAT, MODEL, now_ms=world.now).edge_ids)
    rewrites = 0
    while len(ids) > 3:
        gone, ids = ids[: len(ids) // 3], ids[len(ids) // 3:]
        with store.write(CHAT) as w:
            w.delete_edges(gone)
        snap = cache.get(store, CHAT, MODEL, now_ms=world.now)
        assert cache.last_update[CHAT] == "delta"
        assert _differences(snap, build_snapshot(store.snapshot_source(CHAT, MODEL), now_ms=world.now)) == []
        held = snap.edge_ids
        assert isinstance(held, JoinedStrings) and list(held) == ids
        assert 2 * held.characters() >= held.text_size()
        rewrites += held.characters() == held.text_size()
    assert rewrites >= 2
