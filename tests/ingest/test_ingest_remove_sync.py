"""Removing a message from the middle of a chat (later floors move down) and the whole-chat sync."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ingest_helpers import BASE, NOW, T0

from memory_recall.errors import InputError, NotFound
from memory_recall.ingest.messages import ingest_messages, message_id, remove_message, sync_messages
from memory_recall.model import ChatMessage
from memory_recall.model.graph import Edge, Node
from memory_recall.model.records import PersistedRecall
from memory_recall.store.sqlite import Store

CHAT = "chat-rm"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "rm.sqlite3")
    ingest_messages(s, CHAT, BASE, now_ms=NOW)
    yield s
    s.close()


def _messages(store: Store) -> list[tuple[str, str, int, str | None, str | None, bool]]:
    nodes = sorted((n for n in store.get_nodes(CHAT) if n.type == "message"), key=lambda n: n.seq)
    return [(n.id, n.fields["summary"], n.seq, n.prev_id, n.next_id, n.archived) for n in nodes]


def _active_edges(store: Store) -> list[tuple[str, str, str, str, float]]:
    return sorted((e.id, e.from_id, e.to_id, e.relation, e.strength) for e in store.get_edges(CHAT)
                  if e.invalid_at is None)


def _record(floor: int, text: str) -> PersistedRecall:
    return PersistedRecall(chat_id=CHAT, user_floor=floor, injection_text=text, recall_input=f"q{floor}",
                           bound_user_floor_text=f"q{floor}", graph_version=1, created_at=NOW, updated_at=NOW)


class TestRemoveMessage:
    def test_later_floors_move_down_with_their_edges(self, store: Store) -> None:
        def renamed(nid: str) -> str:
            return f"msg:{int(nid[4:]) - 1}" if nid.startswith("msg:") and int(nid[4:]) > 2 else nid

        # Expected: the edges before the removal without those of msg:2, their message ends renamed.
        expected = sorted(
            (f"e:{renamed(f)}>{renamed(t)}", renamed(f), renamed(t), rel, strength)
            for _, f, t, rel, strength in _active_edges(store) if "msg:2" not in (f, t)
        )
        nicole = _entity(store, "Becoming Nicole")
        report = remove_message(store, CHAT, 2, now_ms=NOW + 10)
        assert _messages(store) == [
            ("msg:0", "Hey Mel! Oscar says hi.", 0, None, "msg:1", False),
            ("msg:1", "Hi Caroline. How is Oscar?", 1, "msg:0", "msg:2", False),
            ("msg:2", "Paris again! Lovely.", 2, "msg:1", "msg:3", False),
            ("msg:3", "Next: Lake Tahoe with Melanie.", 3, "msg:2", None, False),
        ]
        assert _active_edges(store) == expected
        assert ("e:msg:2>ent:paris", "msg:2", "ent:paris", "related", 0.5) in expected  # from msg:3
        # "Becoming Nicole" was only mentioned by the removed message: archived; Paris is still mentioned.
        archived = sorted(n.id for n in store.get_nodes(CHAT) if n.type == "entity" and n.archived)
        assert archived == [nicole]
        # msg:2, msg:3 hold the renamed messages (msg:1 still links to msg:2: unchanged); msg:4 is freed and the
        # entity archived.
        assert (report.nodes_updated, report.nodes_retired) == (2, 2)
        assert report.node_ids == tuple(sorted(["msg:2", "msg:3", nicole]))

    def test_statistics_vectors_and_records_move_with_the_message(self, store: Store) -> None:
        with store.write(CHAT) as w:
            w.reinforce(["msg:3"], NOW + 1, 0.5)
            w.put_embeddings("m", {message_id(f): np.full(3, float(f), dtype=np.float32) for f in range(5)})
            for f in (0, 2, 4):
                w.put_record(_record(f, f"block {f}"))
        before = store.get_node(CHAT, "msg:3")
        assert before is not None
        remove_message(store, CHAT, 2, now_ms=NOW + 10)
        after = store.get_node(CHAT, "msg:2")
        assert after is not None
        assert (after.access_count, after.importance, after.last_access_time) == (
            before.access_count, before.importance, before.last_access_time)
        ids, matrix = store.get_embeddings(CHAT, "m")
        assert sorted(zip(ids, matrix[:, 0].tolist(), strict=True)) == [
            ("msg:0", 0.0), ("msg:1", 1.0), ("msg:2", 3.0), ("msg:3", 4.0)]
        assert [(r.user_floor, r.injection_text) for r in store.list_records(CHAT)] == [
            (0, "block 0"), (3, "block 4")]

    def test_removing_the_last_message_deletes_it(self, store: Store) -> None:
        remove_message(store, CHAT, 4, now_ms=NOW + 10)
        assert [m[0] for m in _messages(store)] == ["msg:0", "msg:1", "msg:2", "msg:3"]
        assert _messages(store)[-1][4] is None  # the chain ends at msg:3

    def test_a_floor_without_a_node_still_moves_the_later_ones(self, tmp_path: Path) -> None:
        s = Store(tmp_path / "gap.sqlite3")
        try:
            # Floor 1 was a system message: never a node.
            msgs = [BASE[0], ChatMessage(floor=1, role="system", text="note"), *BASE[2:]]
            ingest_messages(s, CHAT, msgs, now_ms=NOW)
            remove_message(s, CHAT, 1, now_ms=NOW + 10)
            nodes = sorted((n for n in s.get_nodes(CHAT) if n.type == "message"), key=lambda n: n.seq)
            assert [(n.id, n.fields["summary"]) for n in nodes] == [
                ("msg:0", "Hey Mel! Oscar says hi."), ("msg:1", 'We read "Becoming Nicole" in Paris.'),
                ("msg:2", "Paris again! Lovely."), ("msg:3", "Next: Lake Tahoe with Melanie.")]
        finally:
            s.close()

    def test_nothing_at_or_after_the_floor_is_not_found(self, store: Store) -> None:
        version = store.chat_version(CHAT)
        with pytest.raises(NotFound, match="floor 5"):
            remove_message(store, CHAT, 5, now_ms=NOW + 10)
        with pytest.raises(InputError, match="non-negative"):
            remove_message(store, CHAT, -1, now_ms=NOW + 10)
        assert store.chat_version(CHAT) == version


def _entity(store: Store, name: str) -> str:
    return next(n.id for n in store.get_nodes(CHAT) if n.type == "entity" and n.fields["name"] == name)


# -- property: a removal is a renaming of the rest, and equals ingesting the chat without the message -----------

_SPEAKERS = ("Ann", "Bob", "Cleo")
_WORDS = ("lantern", "harbor", "Ann", "Bob", "Cleo", "Dora", "key", "tower", '"Red Book"', "storm")
_message = st.tuples(st.sampled_from(_SPEAKERS), st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5),
                     st.booleans())


def _chat(spec: Sequence[tuple[str, list[str], bool]]) -> list[ChatMessage]:
    return [ChatMessage(floor=i, role="user" if u else "assistant", speaker=sp, text=" ".join(words) + ".",
                        send_time_ms=T0 + i) for i, (sp, words, u) in enumerate(spec)]


def _message_view(nodes: Sequence[Node]) -> list[tuple[object, ...]]:
    return sorted((n.id, n.fields["summary"], n.fields["speaker"], n.seq, n.seq_range, n.prev_id, n.next_id,
                   n.created_time, tuple(sorted(n.extra.items()))) for n in nodes if n.type == "message"
                  and not n.archived)


def _edge_view(edges: Sequence[Edge]) -> list[tuple[object, ...]]:
    return sorted((e.id, e.from_id, e.to_id, e.relation, e.strength) for e in edges if e.invalid_at is None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.lists(_message, min_size=2, max_size=9), data=st.data())
def test_removal_equals_ingesting_the_chat_without_the_message(tmp_path: Path, spec: list, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(spec) - 1))
    chat = _chat(spec)
    rest = [m for m in chat if m.floor != k]
    # Mentions depend on which names are speakers: the comparison holds when the removal keeps the speaker set.
    assume({m.speaker for m in rest} == {m.speaker for m in chat})
    shifted = [m.model_copy(update={"floor": i}) for i, m in enumerate(rest)]
    a = Store(tmp_path / f"a-{len(spec)}-{k}-{id(spec)}.sqlite3")
    b = Store(tmp_path / f"b-{len(spec)}-{k}-{id(spec)}.sqlite3")
    try:
        ingest_messages(a, CHAT, chat, now_ms=NOW)
        before = {n.id: n for n in a.get_nodes(CHAT)}
        remove_message(a, CHAT, k, now_ms=NOW + 5)
        ingest_messages(b, CHAT, shifted, now_ms=NOW)
        assert _message_view(a.get_nodes(CHAT)) == _message_view(b.get_nodes(CHAT))
        assert _edge_view(a.get_edges(CHAT)) == _edge_view(b.get_edges(CHAT))
        active = {n.id for n in a.get_nodes(CHAT) if not n.archived and n.type != "message"}
        assert active == {n.id for n in b.get_nodes(CHAT) if not n.archived and n.type != "message"}
        # Renaming: every later message node is the node of the floor above, unchanged but for its place.
        for f in range(k + 1, len(chat)):
            old, new = before[message_id(f)], a.get_node(CHAT, message_id(f - 1))
            assert new is not None
            keep = ("fields", "created_time", "importance", "access_count", "extra", "evidence", "scope")
            assert [getattr(new, x) for x in keep] == [getattr(old, x) for x in keep]
    finally:
        a.close()
        b.close()


class TestSyncMessages:
    def test_resending_the_same_chat_writes_nothing(self, store: Store) -> None:
        version = store.chat_version(CHAT)
        report = sync_messages(store, CHAT, list(reversed(BASE)), now_ms=NOW + 10)
        assert (report.version, report.nodes_added, report.nodes_updated, report.nodes_retired) == (version, 0, 0, 0)
        assert store.chat_version(CHAT) == version

    def test_a_shorter_chat_retires_the_floors_past_its_end(self, store: Store) -> None:
        edited = BASE[1].model_copy(update={"text": "Hi Caroline."})
        report = sync_messages(store, CHAT, [BASE[0], edited, BASE[2]], now_ms=NOW + 10)
        assert [(m[0], m[1], m[5]) for m in _messages(store)] == [
            ("msg:0", "Hey Mel! Oscar says hi.", False), ("msg:1", "Hi Caroline.", False),
            ("msg:2", 'We read "Becoming Nicole" in Paris.', False),
            ("msg:3", "Paris again! Lovely.", True), ("msg:4", "Next: Lake Tahoe with Melanie.", True)]
        assert _messages(store)[2][4] is None  # the chain ends at the new last message
        assert report.messages == 3
        # msg:1 edited, msg:2 relinked; msg:3, msg:4 and Lake Tahoe (only in msg:4) retired.
        assert (report.nodes_updated, report.nodes_retired) == (2, 3)

    def test_floors_must_be_the_whole_chat(self, store: Store) -> None:
        version = store.chat_version(CHAT)
        with pytest.raises(InputError) as err:
            sync_messages(store, CHAT, [BASE[0], BASE[2]], now_ms=NOW + 10)
        assert (err.value.field, err.value.reason) == (
            "messages[1].floor", "a whole chat holds floors 0 to 1 once each; floor 1 is missing")
        assert store.chat_version(CHAT) == version


def test_a_removal_costs_what_it_moves_not_the_chat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same removal (the fifth message from the end, four later ones moved down) in a chat of 40 messages and
    in one of 1,000, counted in SQLite's virtual-machine steps on every connection of the store: the reads of the
    messages after the floor, of their edges and of the chain around the floor do not grow with the chat (here
    about 2,800 and 2,500 steps; before, when each of the three read the whole chat, about 3,900 and 32,400)."""
    steps = [0]
    connect = Store._connect

    def counting(self: Store, *, write: bool) -> Any:
        conn = connect(self, write=write)
        conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 100)
        return conn

    monkeypatch.setattr(Store, "_connect", counting)

    def removal(n: int) -> int:
        with Store(tmp_path / f"{n}.sqlite3") as s:
            # A speaker per turn and no names in the text: no character's edges grow with the chat (the orphan
            # check reads the edges of the removed message's speaker).
            turns = [ChatMessage(floor=f, role="user" if f % 2 == 0 else "assistant", speaker=f"Guest {f}",
                                 text=f"Turn {f}, by the window.", send_time_ms=T0 + f) for f in range(n)]
            ingest_messages(s, CHAT, turns[:-1], now_ms=NOW)
            ingest_messages(s, CHAT, turns[-1:], now_ms=NOW)  # a turn's event: the store's ingest cache holds the chat
            steps[0] = 0
            remove_message(s, CHAT, n - 5, now_ms=NOW + 1)
            assert [m.id for m in s.get_nodes(CHAT, [message_id(n - 2), message_id(n - 1)])] == [message_id(n - 2)]
            return steps[0]

    small, large = removal(40), removal(1000)
    assert large <= small * 1.25, (small, large)
