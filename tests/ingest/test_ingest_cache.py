"""The store's ingest cache (``IngestCache``): cached ingestion ends in the same graph, byte for byte, as ingestion
without it and as the whole-chat read path, including writes from a second ``Store`` object in between."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ingest_helpers import write_plan

from memory_recall.ingest.messages import (
    IngestPlan,
    delete_message,
    edit_message,
    ingest_messages,
    load_view,
    plan_deletions,
    plan_messages,
    remove_message,
)
from memory_recall.model import ChatMessage
from memory_recall.model.graph import Node
from memory_recall.store import sqlite as sqlite_module
from memory_recall.store.sqlite import Store, StoreReader

CHAT = "chat-cache"
NOW = 1_767_225_600_000
SPEAKERS = ("Ash", "Mara Vell", "Tobin Reed", "林晚", "Oscar")
MENTIONS = ("Saltmere", "the Gull Inn", "Oscar", "Mara", "“苏晚”", "林晚", '"Item 7"', '"Item 9"', "Captain Reyes")
WORDS = "the tide turned and we walked along quiet docks talking about ships debts storms".split()


def _dump(store: Store) -> str:
    nodes = sorted(n.model_dump_json() for n in store.get_nodes(CHAT))
    edges = sorted(e.model_dump_json() for e in store.get_edges(CHAT))
    return "\n".join(nodes + edges)


def _text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
    for _ in range(rng.randint(0, 2)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(MENTIONS))
    return " ".join(words).capitalize() + "."


def _message(rng: random.Random, floor: int, step: int, speakers: int) -> ChatMessage:
    role = "user" if floor % 2 == 0 else "assistant"
    if rng.random() < 0.05:
        return ChatMessage(floor=floor, role="system", text="[note]")
    return ChatMessage(floor=floor, role=role, speaker=rng.choice(SPEAKERS[:speakers]), text=_text(rng),
                       send_time_ms=NOW - 10**8 + floor * 1000 + step, hidden=rng.random() < 0.1)


def _reference_apply(store: Store, make_plan: Callable[[Any], IngestPlan], **view_args: Any) -> None:
    """The whole-chat read path (``load_view``): what every cached write must equal."""
    with store.read() as r:
        plan = make_plan(load_view(r, CHAT, **view_args))
    write_plan(store, CHAT, plan)


class _WholeChain:
    """A store without its reader (``read``): :func:`remove_message` then reads the whole message chain from its
    writer instead of the links around the floor from the ingest cache (the reference for that cut)."""

    def __init__(self, store: Store) -> None:
        self.write = store.write


class _Three:
    """One chat in three stores: ``cached`` (one long-lived ``Store``: the ingest cache serves every event after
    the first), ``cold`` (a new ``Store`` per operation: no cache) and ``full`` (the whole-chat read path)."""

    def __init__(self, tmp: Path) -> None:
        self.paths = {k: tmp / f"{k}.sqlite3" for k in ("cached", "cold", "full")}
        self.cached = Store(self.paths["cached"])

    def close(self) -> None:
        self.cached.close()

    def ingest(self, batch: list[ChatMessage], now: int) -> None:
        ingest_messages(self.cached, CHAT, batch, now_ms=now)
        with Store(self.paths["cold"]) as s:
            ingest_messages(s, CHAT, batch, now_ms=now)
        with Store(self.paths["full"]) as s:
            _reference_apply(s, lambda v: plan_messages(batch, v, now), messages=batch)

    def delete(self, floor: int, now: int) -> None:
        delete_message(self.cached, CHAT, floor, now_ms=now)
        with Store(self.paths["cold"]) as s:
            delete_message(s, CHAT, floor, now_ms=now)
        with Store(self.paths["full"]) as s:
            _reference_apply(s, lambda v: plan_deletions([floor], v, now), floors=[floor])

    def edit(self, message: ChatMessage, now: int) -> None:
        edit_message(self.cached, CHAT, message, now_ms=now)
        with Store(self.paths["cold"]) as s:
            edit_message(s, CHAT, message, now_ms=now)
        with Store(self.paths["full"]) as s:
            _reference_apply(s, lambda v: plan_messages([message], v, now), messages=[message])

    def remove(self, floor: int, now: int) -> None:
        remove_message(self.cached, CHAT, floor, now_ms=now)
        with Store(self.paths["cold"]) as s:
            remove_message(s, CHAT, floor, now_ms=now)
        with Store(self.paths["full"]) as s:
            remove_message(_WholeChain(s), CHAT, floor, now_ms=now)

    def other_process(self, fn: Callable[[Store], None]) -> None:
        """The same write through a second ``Store`` object on each file (for ``cached``: another process)."""
        for path in self.paths.values():
            with Store(path) as s:
                fn(s)

    def dumps(self) -> dict[str, str]:
        out = {"cached": _dump(self.cached)}
        for k in ("cold", "full"):
            with Store(self.paths[k]) as s:
                out[k] = _dump(s)
        return out


def _active_floors(store: Store) -> list[int]:
    return [seq for seq, _, _, _ in store.message_chain(CHAT)]


def _break_link(s: Store) -> None:
    chain = s.message_chain(CHAT)
    if len(chain) > 3:
        node = s.get_node(CHAT, chain[1][1])
        assert node is not None
        s.upsert_nodes(CHAT, [node.model_copy(update={"next_id": chain[3][1]})])


def _other_speaker_turn(floor: int) -> Callable[[Store], None]:
    def write(s: Store) -> None:
        message = ChatMessage(floor=floor, role="assistant", speaker="Captain Reyes", text="Saltmere! I said.",
                              send_time_ms=NOW - 5)
        ingest_messages(s, CHAT, [message], now_ms=NOW + 7)

    return write


@pytest.fixture
def three(tmp_path: Path) -> Iterator[_Three]:
    t = _Three(tmp_path)
    yield t
    t.close()


class TestCachedEqualsUncached:
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_random_sequence(self, three: _Three, seed: int) -> None:
        rng = random.Random(seed)
        three.ingest([_message(rng, f, 0, 3) for f in range(6)], NOW)
        next_floor = 6
        kinds: dict[str, int] = {}
        for step in range(1, 70):
            now = NOW + step * 1000
            floors = _active_floors(three.cached)
            speakers = 3 if step < 25 else len(SPEAKERS)  # later: new speakers take over their entities
            r = rng.random()
            if step % 17 == 0:
                kind = "other-process"
                three.other_process(_other_speaker_turn(next_floor))
                next_floor += 1
            elif step % 23 == 0:
                kind = "broken-link"
                three.other_process(_break_link)
            elif r < 0.55 or len(floors) < 4:
                kind = "add"
                batch = [_message(rng, next_floor + i, step, speakers) for i in range(1 + (rng.random() < 0.2))]
                next_floor += len(batch)
                three.ingest(batch, now)
            elif r < 0.75:
                kind = "edit"
                floor = rng.choice(floors)
                msg = _message(rng, floor, step, speakers)
                if msg.role == "system":
                    three.ingest([msg], now)  # a system message retires the floor
                else:
                    three.edit(msg, now)
            elif r < 0.9:
                kind = "delete"
                three.delete(rng.choice(floors), now)
            else:
                kind = "remove"
                three.remove(rng.choice(floors), now)
                next_floor -= 1
            kinds[kind] = kinds.get(kind, 0) + 1
            dumps = three.dumps()
            assert dumps["cached"] == dumps["full"], (step, kind)
            assert dumps["cold"] == dumps["full"], (step, kind)
        assert set(kinds) == {"add", "edit", "delete", "remove", "other-process", "broken-link"}
        # The sequence did build what it should: characters taken over, mentions, several speakers.
        types = three.cached.stats(CHAT)["nodes_by_type"]
        assert types["character"] >= 4 and types["entity"] >= 3

    @pytest.mark.parametrize("floor", [0, 2, 5, 9])
    def test_removal_over_a_broken_chain(self, three: _Three, floor: int) -> None:
        # Stored links that disagree with the order (another writer's): the removal takes the whole chain the
        # cache holds, and ends as one that reads the whole chain from the store.
        rng = random.Random(floor)
        three.ingest([_message(rng, f, 0, 3) for f in range(10)], NOW)
        three.other_process(_break_link)
        three.remove(floor, NOW + 1000)
        dumps = three.dumps()
        assert dumps["cached"] == dumps["full"] and dumps["cold"] == dumps["full"]
        with Store(three.paths["full"]) as full:
            assert _active_floors(three.cached) == _active_floors(full)


class _Counting:
    """Counts the whole-chat ingest reads (owner rows and the chain) of every ``StoreReader``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("get_nodes_by_type", "message_chain"):
            original = getattr(StoreReader, name)

            def counted(reader: StoreReader, *args: Any, _name: str = name, _orig: Any = original) -> Any:
                self.calls.append(_name)
                return _orig(reader, *args)

            monkeypatch.setattr(StoreReader, name, counted)


def _turn(floor: int, text: str = "Saltmere and Oscar.") -> ChatMessage:
    return ChatMessage(floor=floor, role="user" if floor % 2 == 0 else "assistant",
                       speaker="Ash" if floor % 2 == 0 else "Mara Vell", text=text, send_time_ms=NOW + floor)


class TestCacheUse:
    def test_warm_event_reads_no_whole_chat_rows(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        ingest_messages(store, CHAT, [_turn(f) for f in range(8)], now_ms=NOW)
        counting = _Counting(monkeypatch)
        ingest_messages(store, CHAT, [_turn(8)], now_ms=NOW + 1)
        delete_message(store, CHAT, 3, now_ms=NOW + 2)
        ingest_messages(store, CHAT, [_turn(9, "Oscar went to the Gull Inn.")], now_ms=NOW + 3)
        assert counting.calls == []

    def test_warm_removal_reads_no_whole_chat_rows(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        # A message taken out of the middle (the later ones move down a floor) reads the links around it from
        # the cache, at the floor's start and at the end of the chat, and they come out as the whole chain's.
        ingest_messages(store, CHAT, [_turn(f) for f in range(12)], now_ms=NOW)
        counting = _Counting(monkeypatch)
        remove_message(store, CHAT, 5, now_ms=NOW + 1)
        remove_message(store, CHAT, 0, now_ms=NOW + 2)
        remove_message(store, CHAT, 9, now_ms=NOW + 3)
        assert counting.calls == []
        assert [link[1:] for link in store.message_chain(CHAT)] == [
            (f"msg:{f}", f"msg:{f - 1}" if f else None, f"msg:{f + 1}" if f < 8 else None) for f in range(9)
        ]

    def test_removal_over_a_broken_chain_reads_the_chain_once(self, db_path: Path, store: Store,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
        # Another writer left links that disagree with the order: the cache is read anew (once), and the removal
        # takes the whole chain from it instead of reading the chain again.
        ingest_messages(store, CHAT, [_turn(f) for f in range(8)], now_ms=NOW)
        with Store(db_path) as other:
            _break_link(other)
        counting = _Counting(monkeypatch)
        remove_message(store, CHAT, 2, now_ms=NOW + 1)
        assert counting.calls == ["get_nodes_by_type", "message_chain"]

    def test_other_store_write_forces_one_reread(self, db_path: Path, store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        ingest_messages(store, CHAT, [_turn(f) for f in range(8)], now_ms=NOW)
        ingest_messages(store, CHAT, [_turn(8)], now_ms=NOW + 1)
        with Store(db_path) as other:
            ingest_messages(other, CHAT, [_turn(9, "Lady Orsolya arrived.")], now_ms=NOW + 2)
        counting = _Counting(monkeypatch)
        report = ingest_messages(store, CHAT, [_turn(10, "Lady Orsolya waved.")], now_ms=NOW + 3)
        assert counting.calls == ["get_nodes_by_type", "message_chain"]
        # The other store's entity is seen (not re-created): the new mention is its only added edge besides ours.
        assert report.nodes_added == 1
        assert store.get_node(CHAT, "msg:10") is not None
        ingest_messages(store, CHAT, [_turn(11)], now_ms=NOW + 4)
        assert counting.calls == ["get_nodes_by_type", "message_chain"]

    def test_reorder_drops_the_entry(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        ingest_messages(store, CHAT, [_turn(f) for f in range(4)], now_ms=NOW)
        graph = store.load_graph(CHAT)
        store.replace_graph(CHAT, graph.model_copy(update={"nodes": list(reversed(graph.nodes))}))
        counting = _Counting(monkeypatch)
        ingest_messages(store, CHAT, [_turn(4)], now_ms=NOW + 1)
        assert counting.calls == ["get_nodes_by_type", "message_chain"]

    def test_owner_rows_match_a_fresh_read(self, store: Store, db_path: Path) -> None:
        ingest_messages(store, CHAT, [_turn(f) for f in range(6)], now_ms=NOW)
        store.upsert_nodes(CHAT, [Node(id="ent:late", type="entity", fields={"name": "Late"})])
        ingest_messages(store, CHAT, [_turn(6, "Saltmere again, Late.")], now_ms=NOW + 1)
        with store.read() as r:
            cached = r.ingest_base(CHAT, [(7, "msg:7")])
        with Store(db_path) as fresh, fresh.read() as r:
            rows = r.get_nodes_by_type(CHAT, ("character", "entity"))
            chain = r.message_chain(CHAT)
        assert [n.model_dump_json() for n in cached.owners.values()] == [n.model_dump_json() for n in rows]
        assert list(cached.owners) == [n.id for n in rows]
        assert cached.chain is None and cached.runs is not None
        assert [run.links for run in cached.runs] == [tuple(chain[-2:])]  # two before the new floor, none after
        assert (cached.runs[0].at_start, cached.runs[0].at_end) == (False, True)

    def test_parse_memo_holds_owners_once_and_no_messages(self, store: Store,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """The process-wide parse memo keeps the owner nodes, one version each (a rewritten owner replaces its
        older text), and none of the message nodes every event writes: its size follows the owners, not the
        length of the chat."""
        memo = sqlite_module._NodeParseMemo(1000)
        monkeypatch.setattr(sqlite_module, "_PARSED_NODES", memo)
        ingest_messages(store, CHAT, [_turn(f) for f in range(4)], now_ms=NOW)
        for f in range(4, 40):
            ingest_messages(store, CHAT, [_turn(f, f"Saltmere and Oscar, turn {f}.")], now_ms=NOW + f)
        with store.read() as r:
            owners = r.get_nodes_by_type(CHAT, ("character", "entity"))
        held = {node.id: text for text, node in memo._items.items()}
        assert len(held) == len(memo._items) == len(memo._text_of)
        assert sorted(held) == sorted(n.id for n in owners)
        assert {held[n.id] for n in owners} == {n.model_dump_json() for n in owners}  # the newest version each
        assert all(node.type in ("character", "entity") for node in memo._items.values())
