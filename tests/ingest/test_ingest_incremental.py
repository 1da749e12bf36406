"""Targeted ingest reads: the store reads it uses, and plans/graphs equal to the whole-chat read path."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ingest_helpers import BASE, NOW, T0, write_plan

from memory_recall.ingest.messages import (
    GraphView,
    IngestPlan,
    character_id,
    delete_message,
    edge_id,
    entity_id,
    ingest_messages,
    load_view,
    load_view_targeted,
    message_id,
    plan_deletions,
    plan_messages,
)
from memory_recall.model import ChatMessage
from memory_recall.model.graph import Edge, Node
from memory_recall.store.sqlite import Store

CHAT = "chat-inc"
OSCAR = entity_id("Oscar")


def _store(tmp_path: Path, name: str) -> Store:
    return Store(tmp_path / f"{name}.sqlite3")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = _store(tmp_path, "base")
    ingest_messages(s, CHAT, BASE, now_ms=NOW)
    yield s
    s.close()


def _plans(store: Store, messages: Sequence[ChatMessage] = (), floors: Sequence[int] = (),
           now: int = NOW + 1000) -> tuple[IngestPlan, IngestPlan, GraphView]:
    with store.read() as r:
        if floors:
            full = plan_deletions(floors, load_view(r, CHAT, floors=floors), now)
            view = load_view_targeted(r, CHAT, floors=floors)
            targeted = plan_deletions(floors, view, now)
        else:
            full = plan_messages(messages, load_view(r, CHAT, messages), now)
            view = load_view_targeted(r, CHAT, messages)
            targeted = plan_messages(messages, view, now)
    return full, targeted, view


def _ingest_full(store: Store, messages: Sequence[ChatMessage], now: int) -> None:
    """The whole-chat read path (``load_view``), written like ``ingest_messages`` writes."""
    with store.read() as r:
        plan = plan_messages(messages, load_view(r, CHAT, messages), now)
    _write(store, plan)


def _delete_full(store: Store, floor: int, now: int) -> None:
    with store.read() as r:
        plan = plan_deletions([floor], load_view(r, CHAT, floors=[floor]), now)
    _write(store, plan)


def _write(store: Store, plan: IngestPlan) -> None:
    write_plan(store, CHAT, plan)


def _dump(store: Store) -> str:
    nodes = sorted((n.model_dump(mode="json") for n in store.get_nodes(CHAT)), key=lambda d: d["id"])
    edges = sorted((e.model_dump(mode="json") for e in store.get_edges(CHAT)), key=lambda d: d["id"])
    return json.dumps({"nodes": nodes, "edges": edges}, ensure_ascii=False, sort_keys=True)


# ------------------------------------------------------------------------------------------------------------
# The store reads
# ------------------------------------------------------------------------------------------------------------


class TestTargetedReads:
    def test_get_nodes_by_type_exact_order(self, store: Store) -> None:
        got = store.get_nodes_by_type(CHAT, ["entity", "character"])
        want = [n for n in store.get_nodes(CHAT) if n.type in ("character", "entity")]
        assert [n.id for n in got] == [n.id for n in want]
        assert got == want
        assert [n.id for n in store.get_nodes_by_type(CHAT, ["character"])] == [
            character_id("Caroline"), character_id("Melanie"),
        ]
        assert store.get_nodes_by_type(CHAT, []) == []
        assert store.get_nodes_by_type("no-such-chat", ["message"]) == []

    def test_message_chain_exact(self, store: Store) -> None:
        assert store.message_chain(CHAT) == [
            (0, "msg:0", None, "msg:1"),
            (1, "msg:1", "msg:0", "msg:2"),
            (2, "msg:2", "msg:1", "msg:3"),
            (3, "msg:3", "msg:2", "msg:4"),
            (4, "msg:4", "msg:3", None),
        ]
        # Archived messages leave the chain; a message node of any id joins it at its seq, ties by id.
        extra = Node(id="imported", type="message", seq=2, fields={"summary": "x"}, prev_id="zzz")
        with store.write(CHAT) as w:
            w.upsert_nodes([store.get_node(CHAT, "msg:3").model_copy(update={"archived": True}), extra])  # type: ignore[union-attr]
        assert store.message_chain(CHAT) == [
            (0, "msg:0", None, "msg:1"),
            (1, "msg:1", "msg:0", "msg:2"),
            (2, "imported", "zzz", None),
            (2, "msg:2", "msg:1", "msg:3"),
            (4, "msg:4", "msg:3", None),
        ]

    def test_lasting_edge_choice(self, tmp_path: Path) -> None:
        s = _store(tmp_path, "edges")
        nodes = [Node(id=i, type="event", fields={"summary": i}) for i in ("x", "a", "b", "c", "d", "e")]

        def edge(eid: str, a: str, b: str, **kw: int) -> Edge:
            return Edge(id=eid, from_id=a, to_id=b, **kw)

        with s.write(CHAT) as w:
            w.upsert_nodes(nodes)
            w.upsert_edges([
                edge("e1", "x", "a", expired_at=NOW + 10),
                edge("e2", "b", "x", expired_at=NOW + 50),
                edge("e3", "x", "c", invalid_at=NOW + 99),  # invalidated: never chosen
                edge("e4", "d", "x"),                         # no expiry: chosen first
                edge("e5", "x", "e"),
            ])
        assert s.lasting_edge(CHAT, "x").id == "e4"  # type: ignore[union-attr]
        assert s.lasting_edge(CHAT, "x", ["d"]).id == "e5"  # type: ignore[union-attr]
        assert s.lasting_edge(CHAT, "x", ["d", "e"]).id == "e2"  # type: ignore[union-attr]
        assert s.lasting_edge(CHAT, "x", ["d", "e", "b"]).id == "e1"  # type: ignore[union-attr]
        assert s.lasting_edge(CHAT, "x", ["a", "b", "d", "e"]) is None
        assert s.lasting_edge(CHAT, "c") is None
        s.close()


# ------------------------------------------------------------------------------------------------------------
# Plans: targeted view == whole-chat view
# ------------------------------------------------------------------------------------------------------------


def _msg(floor: int, speaker: str, text: str, role: str = "user") -> ChatMessage:
    return ChatMessage(floor=floor, role=role, speaker=speaker, text=text, send_time_ms=T0 + floor)  # type: ignore[arg-type]


SCENARIOS: dict[str, list[ChatMessage]] = {
    "append": [_msg(5, "Melanie", "Tahoe sounds great, Caroline.", "assistant")],
    "append-new-entity": [_msg(5, "Melanie", 'I bought "Moby Dick" in Boston.', "assistant")],
    "edit-drops-mentions": [_msg(2, "Caroline", "We read a book.")],
    "edit-changes-speaker": [_msg(1, "Oscar", "Woof.", "assistant")],  # Oscar takes over his entity
    "system-retires": [ChatMessage(floor=3, role="system", text="[note]")],
    "gap-insert": [_msg(9, "Caroline", "Later, Paris."), _msg(7, "Melanie", "Oscar!", "assistant")],
    "same-again": [BASE[2]],
}


class TestPlansEqual:
    @pytest.mark.parametrize("name", sorted(SCENARIOS))
    def test_message_plans_equal(self, store: Store, name: str) -> None:
        full, targeted, view = _plans(store, SCENARIOS[name])
        assert view.chain is not None or view.runs is not None  # the targeted path was taken
        assert targeted == full

    def test_scenarios_change_what_they_should(self, store: Store) -> None:
        # Guards the equality tests above against vacuous plans.
        full, _, _ = _plans(store, SCENARIOS["edit-drops-mentions"])
        assert edge_id("msg:2", entity_id("Paris")) in full.retired_edges
        full, _, _ = _plans(store, SCENARIOS["edit-changes-speaker"])
        assert OSCAR in full.retired_nodes and character_id("Oscar") in full.added_nodes
        full, _, _ = _plans(store, SCENARIOS["system-retires"])
        assert full.retired_nodes == ("msg:3",) and set(full.updated_nodes) >= {"msg:2", "msg:4"}
        assert _plans(store, SCENARIOS["same-again"])[0].empty

    @pytest.mark.parametrize("floor", [0, 2, 4])
    def test_deletion_plans_equal(self, store: Store, floor: int) -> None:
        full, targeted, view = _plans(store, floors=[floor])
        assert view.chain is not None or view.runs is not None
        assert targeted == full
        assert message_id(floor) in full.retired_nodes

    def test_broken_stored_chain_repaired_alike(self, store: Store) -> None:
        # Another writer left wrong links far from the planned floor: both paths repair them.
        bad = store.get_node(CHAT, "msg:1").model_copy(update={"next_id": "msg:4"})  # type: ignore[union-attr]
        odd = Node(id="imported", type="message", seq=3, fields={"summary": "imported turn"})
        with store.write(CHAT) as w:
            w.upsert_nodes([bad, odd])
        full, targeted, _ = _plans(store, [_msg(6, "Caroline", "Hello again.")])
        assert targeted == full
        assert {"msg:1", "imported", "msg:3", "msg:4"} <= set(full.updated_nodes)

    def test_entity_kept_by_expired_or_far_edge(self, store: Store) -> None:
        # Paris is mentioned at floors 2 and 3. Editing floor 2 away keeps Paris (floor 3 edge, not read in
        # full by the targeted path); when that edge has expired, Paris is archived by both paths.
        full, targeted, _ = _plans(store, [_msg(2, "Caroline", "We read a book.")])
        assert targeted == full and entity_id("Paris") not in full.retired_nodes
        far = store.get_edges(CHAT)
        far_edge = next(e for e in far if e.id == edge_id("msg:3", entity_id("Paris")))
        with store.write(CHAT) as w:
            w.upsert_edges([far_edge.model_copy(update={"expired_at": NOW + 500})])
        full, targeted, _ = _plans(store, [_msg(2, "Caroline", "We read a book.")])
        assert targeted == full and entity_id("Paris") in full.retired_nodes

    def test_take_over_revalidates_stored_edge_of_mentioning_message(self, store: Store) -> None:
        # An imported (non-character) node holds Oscar's character id and an invalidated edge from msg:0: the
        # take-over by the new speaker Oscar re-validates that edge (read around msg:0, not a planned floor).
        cid = character_id("Oscar")
        with store.write(CHAT) as w:
            w.upsert_nodes([Node(id=cid, type="event", seq=0, fields={"summary": "imported"})])
            w.upsert_edges([Edge(id=edge_id("msg:0", cid), from_id="msg:0", to_id=cid, relation="related",
                                 strength=0.5, invalid_at=NOW - 5, created_time=T0)])
        full, targeted, _ = _plans(store, [_msg(5, "Oscar", "Woof.", "assistant")])
        assert targeted == full
        assert edge_id("msg:0", cid) in full.updated_edges

    def test_bulk_batch_falls_back_to_full_read(self, store: Store) -> None:
        batch = [_msg(f, "Caroline" if f % 2 == 0 else "Melanie", f"turn {f} about Oscar") for f in range(5, 210)]
        with store.read() as r:
            view = load_view_targeted(r, CHAT, batch)
        assert view.chain is None and view.runs is None
        full, targeted, _ = _plans(store, batch)
        assert targeted == full


# ------------------------------------------------------------------------------------------------------------
# Stores: ingest_messages (targeted) ends in the same graph as the whole-chat path
# ------------------------------------------------------------------------------------------------------------

_SPEAKERS = ("Caroline", "Melanie", "Oscar", "Mel")
_TEXTS = ("Hi Oscar.", "Paris with Melanie?", 'Read "Dune" today.', "Nothing much.", "Caroline and Oscar in Paris.",
          "Lake Tahoe!", "Mel said hi.")
_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 12), st.sampled_from(_SPEAKERS), st.sampled_from(_TEXTS),
              st.sampled_from(("user", "assistant", "system"))),
    st.tuples(st.just("delete"), st.integers(0, 12)),
)


class TestSameGraph:
    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(ops=st.lists(_op, min_size=1, max_size=8))
    def test_random_event_sequences(self, tmp_path_factory: pytest.TempPathFactory, ops: list[tuple]) -> None:
        d = tmp_path_factory.mktemp("seq")
        a, b = _store(d, "full"), _store(d, "targeted")
        try:
            for s in (a, b):
                ingest_messages(s, CHAT, BASE, now_ms=NOW)
            for i, op in enumerate(ops):
                now = NOW + (i + 1) * 1000
                if op[0] == "add":
                    _, floor, speaker, text, role = op
                    m = ChatMessage(floor=floor, role=role, speaker="" if role == "system" else speaker,
                                    text=text, send_time_ms=T0 + floor)
                    _ingest_full(a, [m], now)
                    ingest_messages(b, CHAT, [m], now_ms=now)
                else:
                    floor = op[1]
                    node = a.get_node(CHAT, message_id(floor))
                    if node is None:
                        continue
                    _delete_full(a, floor, now)
                    delete_message(b, CHAT, floor, now_ms=now)
                assert _dump(b) == _dump(a), f"after op {i}: {op}"
        finally:
            a.close()
            b.close()
