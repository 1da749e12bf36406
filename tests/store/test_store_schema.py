"""Opening, migrating and refusing files; the data directory; FTS rebuilds on tokenizer changes."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
from store_helpers import node

from memory_recall.errors import StoreError
from memory_recall.model.graph import Edge, Node
from memory_recall.model.state import HistoryState
from memory_recall.store import Store, default_data_dir
from memory_recall.store.sqlite import APPLICATION_ID, DB_FILENAME, MIGRATIONS, SCHEMA_VERSION


def _j(model: Node | Edge | HistoryState) -> str:
    return json.dumps(model.model_dump(mode="json"), ensure_ascii=False)


def _make_v1(path: Path) -> tuple[list[Node], Edge]:
    """A database at schema version 1 with data written by plain SQL (what an old release left behind)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("BEGIN")
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("COMMIT")
    nodes = [node("n1", title="Bell tower", summary="钟楼入口的守卫"), node("n2", title="Market")]
    e = Edge(id="e1", from_id="n1", to_id="n2", strength=0.25)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("INSERT INTO chats VALUES ('old', 7, 1, 2)")
    for i, n in enumerate(nodes):
        conn.execute(
            "INSERT INTO nodes(chat_id, node_id, ord, type, archived, seq_end, json) "
            "VALUES (?, ?, ?, ?, 0, 1, ?)",
            ("old", n.id, i + 1, n.type, _j(n)),
        )
    conn.execute("INSERT INTO edges VALUES ('old', 'e1', 'n1', 'n2', 1, ?)", (_j(e),))
    vec = np.array([0.5, -1.0, 3.25], dtype="<f4")
    conn.execute("INSERT INTO embeddings VALUES ('old', 'n1', 'm', 3, ?)", (vec.tobytes(),))
    conn.execute(
        "INSERT INTO chat_state VALUES ('old', 'history', ?)", (_j(HistoryState(active_region="钟楼")),)
    )
    conn.close()
    return nodes, e


class TestMigration:
    def test_v1_database_is_upgraded_with_its_data_intact(self, tmp_path: Path) -> None:
        path = tmp_path / "old.sqlite3"
        nodes, e = _make_v1(path)
        with Store(path) as store:
            assert store.schema_version == SCHEMA_VERSION == 6
            assert store.chat_version("old") == 7
            assert store.get_nodes("old") == nodes
            assert store.get_edges("old") == [e]
            assert store.get_history("old") == HistoryState(active_region="钟楼")
            ids, mat = store.get_embeddings("old", "m")
            assert ids == ["n1"] and mat.tolist() == [[0.5, -1.0, 3.25]]
            assert store.embedding_hashes("old", "m") == {"n1": ""}  # v2 column, default for old rows
            # v2 table works.
            store.cache_put("m", {"h": np.ones(3)})
            assert list(store.cache_get("m", ["h"])) == ["h"]
            # The FTS index (empty in the old file) was built from the nodes.
            assert [i for i, _ in store.bm25("old", ["钟楼"])] == ["n1"]
            # Versions continue above the old ones, for this and for new chats.
            store.upsert_nodes("old", [node("n3")])
            assert store.chat_version("old") == 8
            store.upsert_nodes("new", [node("n3")])
            assert store.chat_version("new") == 9
            assert store.check_integrity() == []

    def test_v3_backfills_the_snapshot_columns(self, tmp_path: Path) -> None:
        """v3 adds the denormalised node index and edge columns; old rows are backfilled from their JSON."""
        from memory_recall.store.snapshot import build_snapshot

        path = tmp_path / "old.sqlite3"
        _make_v1(path)
        with Store(path) as store:
            snap = build_snapshot(store.snapshot_source("old", "m"), now_ms=10)
            assert snap.ids == ("n1", "n2")
            assert snap.anchor_index == {"Bell tower": (0,), "Market": (1,)}
            assert snap.adjacency[0, 1] == 0.25 and snap.adjacency[1, 0] == 0.25
            assert snap.has_vector.tolist() == [True, False]

    def test_v3_store_upgrades_to_v4_with_the_same_snapshot(self, tmp_path: Path) -> None:
        """A v3 store (rows as v3 wrote them: node JSON, index JSON, edge columns) upgrades to v4 (packed index,
        compressed JSON, packed edges) and builds exactly the snapshot of the same graph written by v4 code and of
        :func:`snapshot_from_graph`; later writes keep the packed columns in step."""
        from test_snapshot_read import _differences, _graph

        from memory_recall.store.snapshot import build_snapshot, node_index, snapshot_from_graph

        graph, vectors = _graph()
        path = tmp_path / "v3.sqlite3"
        conn = sqlite3.connect(str(path), isolation_level=None)
        conn.execute("BEGIN")
        for migrate in MIGRATIONS[:3]:
            migrate(conn)
        conn.execute("PRAGMA user_version = 3")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("INSERT INTO chats VALUES ('c', 5, 1, 2)")
        for i, n in enumerate(graph.nodes):
            conn.execute(
                "INSERT INTO nodes(chat_id, node_id, ord, type, archived, seq_end, json, idx) "
                "VALUES ('c', ?, ?, ?, ?, ?, ?, ?)",
                (n.id, i + 1, n.type, int(n.archived), n.seq_range[1] if n.seq_range else None,
                 n.model_dump_json(), node_index(n).to_json()),
            )
        for i, e in enumerate(graph.edges):
            conn.execute(
                "INSERT INTO edges(chat_id, edge_id, from_id, to_id, ord, json, relation, strength, edge_type, "
                "invalid_at, expired_at) VALUES ('c', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (e.id, e.from_id, e.to_id, i + 1, e.model_dump_json(), e.relation, e.strength, e.edge_type,
                 e.invalid_at, e.expired_at),
            )
        for nid, vec in vectors.items():
            conn.execute("INSERT INTO embeddings(chat_id, node_id, model_id, dim, vector) VALUES ('c', ?, 'm', ?, ?)",
                         (nid, vec.size, vec.astype("<f4").tobytes()))
        for i, owner in enumerate(graph.knowledge.owners.values()):
            conn.execute("INSERT INTO knowledge_owners VALUES ('c', ?, ?, ?)",
                         (owner.owner_key, i, owner.model_dump_json()))
        conn.execute("COMMIT")
        conn.close()
        with Store(path) as old, Store(tmp_path / "v4.sqlite3") as new:
            assert old.schema_version == 6
            with new.write("c") as w:
                w.replace_graph(graph)
                w.put_embeddings("m", vectors)
            migrated = build_snapshot(old.snapshot_source("c", "m"), now_ms=1_000)
            written = build_snapshot(new.snapshot_source("c", "m"), now_ms=1_000)
            reference = snapshot_from_graph(graph, now_ms=1_000, embeddings=vectors, model_id="m")
            assert _differences(migrated, written) == [] and _differences(migrated, reference) == []
            assert migrated.n == len(graph.nodes) and len(migrated.edge_ids) > 0
            assert [migrated.node(i) for i in range(migrated.n)] == list(graph.nodes)
            assert old.bm25("c", ["node", "Name"]) == new.bm25("c", ["node", "Name"])
            # Writes after the upgrade keep the packed columns current.
            for store in (old, new):
                store.upsert_nodes("c", [node("late", title="Late arrival")])
                store.upsert_edges("c", [Edge(id="e-late", from_id="late", to_id=graph.nodes[0].id, strength=0.5)])
                store.reinforce("c", [graph.nodes[1].id], now_ms=5)
            after = [build_snapshot(s.snapshot_source("c", "m"), now_ms=1_000) for s in (old, new)]
            assert _differences(after[0], after[1]) == []
            assert after[0].ids[-1] == "late" and after[0].adjacency[after[0].n - 1, 0] == 0.5
            assert old.check_integrity() == []

    def test_each_migration_is_one_transaction(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "half.sqlite3"

        def broken(conn: sqlite3.Connection) -> None:
            conn.execute("CREATE TABLE half_done (x)")
            raise sqlite3.OperationalError("simulated failure")

        monkeypatch.setattr("memory_recall.store.sqlite.MIGRATIONS", [MIGRATIONS[0], broken])
        monkeypatch.setattr("memory_recall.store.sqlite.SCHEMA_VERSION", 2)
        with pytest.raises(StoreError, match="simulated failure"):
            Store(path)
        conn = sqlite3.connect(str(path))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0] == 0
        conn.close()
        monkeypatch.undo()
        with Store(path) as store:
            assert store.schema_version == SCHEMA_VERSION

    def test_a_new_file_gets_the_latest_schema_in_wal_mode(self, db_path: Path) -> None:
        Store(db_path).close()
        conn = sqlite3.connect(str(db_path))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
        with Store(db_path) as again:  # reopening is a no-op
            assert again.schema_version == SCHEMA_VERSION


class TestRefusals:
    def test_newer_schema_is_refused(self, db_path: Path) -> None:
        Store(db_path).close()
        conn = sqlite3.connect(str(db_path))
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.close()
        with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than .*upgrade"):
            Store(db_path)

    @pytest.mark.parametrize("content", [b"this is not a database at all\n" * 200, b"\x00\xff" * 3000])
    def test_a_file_that_is_not_sqlite_is_refused(self, db_path: Path, content: bytes) -> None:
        db_path.write_bytes(content)
        with pytest.raises(StoreError, match="not SQLite"):
            Store(db_path)
        assert db_path.read_bytes() == content

    def test_a_foreign_sqlite_database_is_refused_untouched(self, db_path: Path) -> None:
        conn = sqlite3.connect(str(db_path))
        conn.execute("CREATE TABLE notes (x)")
        conn.commit()
        conn.close()
        with pytest.raises(StoreError, match="not a memory-recall store"):
            Store(db_path)
        conn = sqlite3.connect(str(db_path))
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        conn.execute("PRAGMA user_version = 1")
        conn.close()
        with pytest.raises(StoreError, match="another application"):
            Store(db_path)

    def test_a_closed_store_refuses_work(self, db_path: Path) -> None:
        store = Store(db_path)
        store.close()
        store.close()
        with pytest.raises(StoreError, match="closed"):
            store.chat_version("c")
        with pytest.raises(StoreError, match="closed"):
            store.upsert_nodes("c", [node("a")])

    def test_a_missing_directory_is_a_store_error(self, tmp_path: Path) -> None:
        with pytest.raises(StoreError, match="cannot open"):
            Store(tmp_path / "no" / "such" / "dir" / "x.sqlite3")


class TestDataDir:
    def test_precedence(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MEMORY_RECALL_DATA_DIR", str(tmp_path / "env"))
        assert default_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
        assert default_data_dir(str(tmp_path / "s")) == tmp_path / "s"
        assert default_data_dir() == tmp_path / "env"
        monkeypatch.delenv("MEMORY_RECALL_DATA_DIR")
        if sys.platform == "win32":
            monkeypatch.setenv("APPDATA", str(tmp_path / "appdata"))
            assert default_data_dir() == tmp_path / "appdata" / "memory-recall"
        else:
            monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
            assert default_data_dir() == tmp_path / "xdg" / "memory-recall"
            monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
            monkeypatch.setenv("HOME", str(tmp_path / "home"))
            assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "memory-recall"
            monkeypatch.delenv("XDG_DATA_HOME")
            assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "memory-recall"

    def test_open_creates_the_directory_and_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        target = tmp_path / "a" / "b"
        with Store.open(target) as store:
            assert store.path == target / DB_FILENAME
        assert (target / DB_FILENAME).is_file()
        monkeypatch.setenv("MEMORY_RECALL_DATA_DIR", str(tmp_path / "from-env"))
        with Store.open() as store:
            assert store.path == tmp_path / "from-env" / DB_FILENAME


class TestFtsRebuild:
    def test_an_index_built_by_another_tokenizer_version_is_rebuilt(self, db_path: Path) -> None:
        with Store(db_path) as store:
            store.upsert_nodes("c", [node("a", title="castle"), node("b", title="moat")])
            store.upsert_nodes("c", [Node(id="z", type="event", archived=True, fields={"title": "castle"})])
        conn = sqlite3.connect(str(db_path))
        conn.execute("DELETE FROM nodes_fts")
        conn.execute("UPDATE meta SET value = -1 WHERE key = 'tokenizer_version'")
        conn.commit()
        conn.close()
        with Store(db_path) as store:
            assert [i for i, _ in store.bm25("c", ["castle"])] == ["a"]
            assert [i for i, _ in store.bm25("c", ["moat"])] == ["b"]
            version = store.chat_version("c")
        with Store(db_path) as store:  # a rebuild is not a write to the chat
            assert store.chat_version("c") == version

    def test_an_index_with_other_table_options_is_recreated(self, db_path: Path) -> None:
        with Store(db_path) as store:
            store.upsert_nodes("c", [node("a", title="3.14 café")])
        conn = sqlite3.connect(str(db_path))
        conn.execute("DROP TABLE nodes_fts")
        # An old default tokenizer would split "3.14" into two tokens.
        conn.execute(
            "CREATE VIRTUAL TABLE nodes_fts USING fts5(primary_terms, secondary_terms, body_terms, "
            "chat_id UNINDEXED, node_id UNINDEXED)"
        )
        conn.execute("UPDATE meta SET value = 'old' WHERE key = 'fts_tokenize_clause'")
        conn.commit()
        conn.close()
        with Store(db_path) as store:
            assert [i for i, _ in store.bm25("c", ["3.14"])] == ["a"]
            assert store.check_integrity() == []
