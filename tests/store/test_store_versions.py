"""Chat versions, transactions and rollback: one bump per committed write, nothing left by a failed one."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
from store_helpers import dump_database, edge, node

from memory_recall.errors import InputError, StoreError
from memory_recall.model.records import PersistedRecall
from memory_recall.model.state import HistoryState, JournalEntry, KnowledgeState, RegionState
from memory_recall.store import ChatInfo, Store, StoreWriter


def _seed(store: Store) -> None:
    with store.write("c") as w:
        w.upsert_nodes([node("a", title="castle"), node("b", title="moat"), node("c", title="tower")])
        w.upsert_edges([edge("ab", "a", "b"), edge("bc", "b", "c")])
        w.put_embeddings("m", {"a": np.ones(4), "b": np.zeros(4)})
        w.set_history(HistoryState(active_region="here"))
        w.put_record(PersistedRecall(chat_id="c", user_floor=1, injection_text="x"))
    store.cache_put("m", {"h1": np.ones(4)})


# Each writes a lot and then fails in its middle or at its end.
FAILING_BATCHES: dict[str, Callable[[StoreWriter], object]] = {
    "bad edge after node writes": lambda w: (
        w.upsert_nodes([node("d", title="new"), node("a", title="changed")]),
        w.delete_nodes(["b"]),
        w.upsert_edges([edge("da", "d", "a"), edge("dx", "d", "ghost")]),
    ),
    "dimension mismatch after deletes": lambda w: (
        w.delete_edges(["ab", "bc"]),
        w.set_history(HistoryState(active_region="elsewhere")),
        w.delete_records_from(0),
        w.put_embeddings("m", {"c": np.ones(5)}),
    ),
    "nan vector after state writes": lambda w: (
        w.set_knowledge(KnowledgeState()),
        w.set_regions(RegionState(manual_active_region="x")),
        w.set_journal([JournalEntry(processed_range=(1, 2))]),
        w.reinforce(["a", "c"], 99),
        w.put_embeddings("m", {"c": np.array([1.0, np.nan, 0.0, 0.0])}),
    ),
    "invalid node late in a batch": lambda w: (
        w.upsert_nodes([node("e", title="fine")]),
        w.upsert_nodes([node("f"), {"id": "g", "type": "event", "seq": -5}]),
    ),
    "caller exception": lambda w: (w.delete_nodes(["a", "b", "c"]), _raise(RuntimeError("caller failed"))),
}


def _raise(exc: BaseException) -> NoReturn:
    raise exc


class TestVersions:
    def test_unknown_chat_is_version_zero(self, store: Store) -> None:
        assert store.chat_version("nobody") == 0
        assert store.list_chats() == []

    def test_every_write_bumps_exactly_once_and_reads_never(self, store: Store) -> None:
        versions = [store.chat_version("c")]
        store.upsert_nodes("c", [node("a"), node("b")])
        versions.append(store.chat_version("c"))
        with store.write("c") as w:
            for i in range(5):  # many operations, one bump
                w.upsert_nodes([node(f"n{i}")])
            w.upsert_edges([edge("e", "a", "b")])
            w.reinforce(["a"], 5)
            assert w.version == versions[-1] + 1
        versions.append(store.chat_version("c"))
        for write in (
            lambda: store.set_history("c", HistoryState()),
            lambda: store.delete_edges("c", ["e"]),
            lambda: store.put_embeddings("c", "m", {"a": np.ones(2)}),
            lambda: store.delete_nodes("c", ["nope"]),  # a committed no-op still commits a version
            lambda: store.put_record("c", PersistedRecall(chat_id="c", user_floor=0, injection_text="t")),
        ):
            write()
            versions.append(store.chat_version("c"))
        assert versions == list(range(len(versions)))
        for read in (
            lambda: store.get_nodes("c"),
            lambda: store.get_edges("c"),
            lambda: store.load_graph("c"),
            lambda: store.bm25("c", ["a"]),
            lambda: store.stats("c"),
            lambda: store.list_chats(),
            lambda: store.get_embeddings("c", "m"),
            lambda: store.list_records("c"),
        ):
            read()
        assert store.chat_version("c") == versions[-1]

    def test_chats_have_independent_strictly_increasing_versions(self, store: Store) -> None:
        store.upsert_nodes("a", [node("x")])
        store.upsert_nodes("b", [node("x")])
        store.upsert_nodes("a", [node("y")])
        va, vb = store.chat_version("a"), store.chat_version("b")
        assert (va, vb) == (3, 2)
        store.cache_put("m", {"h": np.ones(2)})  # global cache: no chat version changes
        assert (store.chat_version("a"), store.chat_version("b")) == (va, vb)

    def test_a_recreated_chat_never_reuses_a_version(self, store: Store) -> None:
        for _ in range(3):
            store.upsert_nodes("c", [node("x")])
        old = store.chat_version("c")
        assert store.delete_chat("c") is True
        assert store.delete_chat("c") is False
        assert store.chat_version("c") == 0
        store.upsert_nodes("c", [node("x")])
        assert store.chat_version("c") > old

    def test_list_chats_and_stats(self, store: Store) -> None:
        clock = iter(range(1000, 2000, 10))
        s = Store(store.path, clock=lambda: next(clock))
        try:
            s.upsert_nodes("b", [node("x"), node("y", "character"), node("z", "character")])
            s.upsert_edges("b", [edge("e", "x", "y")])
            s.upsert_nodes("a", [node("x")])
            s.upsert_nodes("b", [node("w")])
            assert s.list_chats() == [
                ChatInfo(
                    chat_id="a", version=3, node_count=1, edge_count=0, created_at=1020, updated_at=1020
                ),
                ChatInfo(
                    chat_id="b", version=4, node_count=4, edge_count=1, created_at=1000, updated_at=1030
                ),
            ]
            s.put_embeddings("b", "m1", {"x": np.ones(2)})
            s.put_embeddings("b", "m2", {"x": np.ones(3), "y": np.ones(3)})
            assert s.stats("b") == {
                "chat_id": "b",
                "version": 6,
                "node_count": 4,
                "nodes_by_type": {"character": 2, "event": 2},
                "archived_count": 0,
                "edge_count": 1,
                "embedded": {"m1": 1, "m2": 2},
                "record_count": 0,
            }
        finally:
            s.close()


class TestRollback:
    @pytest.mark.parametrize("name", list(FAILING_BATCHES))
    def test_a_failing_batch_leaves_the_store_exactly_as_before(
        self, store: Store, db_path: Path, name: str
    ) -> None:
        _seed(store)
        before = dump_database(db_path)
        version = store.chat_version("c")
        graph = store.load_graph("c")
        with pytest.raises((InputError, RuntimeError)), store.write("c") as w:
            FAILING_BATCHES[name](w)
        assert dump_database(db_path) == before
        assert store.chat_version("c") == version
        assert store.load_graph("c") == graph
        assert [i for i, _ in store.bm25("c", ["castle"])] == ["a"]
        assert store.check_integrity() == []
        store.upsert_nodes("c", [node("after")])  # the store is still writable
        assert store.chat_version("c") == version + 1

    def test_a_failing_first_write_does_not_create_the_chat(self, store: Store) -> None:
        with pytest.raises(InputError):
            store.upsert_edges("new", [edge("e", "a", "b")])
        assert store.list_chats() == []

    def test_one_shot_writes_are_atomic(self, store: Store, db_path: Path) -> None:
        _seed(store)
        before = dump_database(db_path)
        with pytest.raises(InputError) as info:
            store.upsert_nodes("c", [node("p"), node("q"), {"id": "r", "type": "event", "importance": -1}])
        assert info.value.field == "nodes[2].importance"
        with pytest.raises(InputError):
            store.put_embeddings("c", "m", {"a": np.ones(4), "ghost": np.ones(4)})
        with pytest.raises(InputError):
            store.cache_put("m", {"h2": np.ones(4), "h3": np.ones(7)})
        assert dump_database(db_path) == before


class TestWriterDiscipline:
    def test_nested_write_on_one_thread_raises_instead_of_deadlocking(self, store: Store) -> None:
        with store.write("c") as w:
            w.upsert_nodes([node("a")])
            with pytest.raises(StoreError, match="nested write"):
                store.upsert_nodes("c", [node("b")])
            with pytest.raises(StoreError, match="inside one of its write batches"):
                store.close()
        assert [n.id for n in store.get_nodes("c")] == ["a"]

    def test_reads_inside_a_batch(self, store: Store) -> None:
        store.upsert_nodes("c", [node("a")])
        with store.write("c") as w:
            w.upsert_nodes([node("b")])
            assert [n.id for n in w.get_nodes("c")] == ["a", "b"]  # the batch sees itself
            assert [n.id for n in store.get_nodes("c")] == ["a"]  # other readers see the last commit
            assert store.chat_version("c") == 1

    def test_a_writer_is_dead_after_its_block(self, store: Store) -> None:
        with store.write("c") as w:
            pass
        with pytest.raises(StoreError, match="after its"):
            w.upsert_nodes([node("a")])

    def test_writes_from_threads_are_serialised(self, store: Store) -> None:
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(10):
                    with store.write("c") as w:
                        w.upsert_nodes([node(f"t{k}-{i}-{j}") for j in range(5)])
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.chat_version("c") == 40
        assert len(store.get_nodes("c")) == 200


class TestBusyTimeout:
    def _hold_write_lock(self, db_path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        return conn

    def test_a_write_waits_for_another_connection_to_commit(self, store: Store, db_path: Path) -> None:
        other = self._hold_write_lock(db_path)
        timer = threading.Timer(0.3, lambda: other.execute("COMMIT"))
        timer.start()
        try:
            store.upsert_nodes("c", [node("a")])  # blocks ~0.3 s inside the 5 s busy timeout
        finally:
            timer.join()
            other.close()
        assert store.chat_version("c") == 1

    def test_a_lock_held_past_the_timeout_is_a_store_error(self, db_path: Path) -> None:
        Store(db_path).close()
        other = self._hold_write_lock(db_path)
        try:
            with Store(db_path, busy_timeout=0.1) as store:
                with pytest.raises(StoreError, match="locked"):
                    store.upsert_nodes("c", [node("a")])
                assert store.get_nodes("c") == []  # readers are not blocked by the writer
        finally:
            other.close()
