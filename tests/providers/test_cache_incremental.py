"""embed_missing on the store's ``embedding_status`` read and digest memo: same result as the whole-chat path."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory_recall.model.graph import Node, embedding_text
from memory_recall.providers import cache
from memory_recall.providers.cache import embed_missing, text_hash
from memory_recall.providers.embedding import LocalEmbedder
from memory_recall.store.sqlite import Store

CHAT = "chat-emb"


def _nodes() -> list[Node]:
    texts = ("The lantern went out.", "Mara paid the debt.", "风暴在午夜到来。", "The lantern went out.", "Tobin left.")
    return [Node(id=f"n{i}", type="event", seq=i, fields={"summary": t}) for i, t in enumerate(texts)]


class _Generic:
    """The store through the generic protocol only (no ``embedding_status``): the whole-chat path."""

    def __init__(self, store: Store) -> None:
        self._s = store

    def __getattr__(self, name: str) -> Any:
        if name == "embedding_status":
            raise AttributeError(name)
        return getattr(self._s, name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "emb.sqlite3")
    with s.write(CHAT) as w:
        w.upsert_nodes(_nodes())
    yield s
    s.close()


def _both(store: Store, model_id: str) -> tuple[Any, Any]:
    return cache._todo_full(store, CHAT, model_id), cache._todo_targeted(store, CHAT, model_id)


def _report(rep: cache.EmbedReport) -> dict[str, Any]:
    out = dataclasses.asdict(rep)
    del out["elapsed_ms"]
    return out


class TestEmbeddingStatus:
    def test_rows_exact(self, store: Store) -> None:
        with store.write(CHAT) as w:
            w.upsert_nodes([_nodes()[1].model_copy(update={"archived": True})])
            w.put_embeddings("m", [("n0", np.ones(3, np.float32), "h0"), ("n2", np.ones(3, np.float32), "")])
            w.put_embeddings("other", [("n4", np.ones(3, np.float32), "h4")])
        rows = store.embedding_status(CHAT, "m")
        stored = {n.id: n for n in store.get_nodes(CHAT)}
        assert [(r[0], r[1], r[3]) for r in rows] == [
            ("n0", False, "h0"), ("n1", True, None), ("n2", False, ""), ("n3", False, None), ("n4", False, None),
        ]
        assert rows[1][2] is None  # archived: JSON not read
        for node_id, archived, doc, _ in rows:
            if not archived:
                assert Node.model_validate_json(doc) == stored[node_id]
        assert store.embedding_status("no-such-chat", "m") == []


class TestSameTodo:
    def test_states_agree(self, store: Store, local_embedder: LocalEmbedder) -> None:
        model = local_embedder.model_id
        full, targeted = _both(store, model)
        assert targeted == full
        assert [t[0] for t in full[0]] == ["n0", "n1", "n2", "n3", "n4"]
        embed_missing(store, CHAT, local_embedder)
        full, targeted = _both(store, model)
        assert targeted == full == ([], next(iter(store.embedding_hashes(CHAT, model).values())), 5, 0)
        edited = _nodes()[2].model_copy(update={"fields": {"summary": "风暴停了。"}})
        same_text = _nodes()[4].model_copy(update={"importance": 9.0})  # JSON changes, embedding text does not
        with store.write(CHAT) as w:
            w.upsert_nodes([edited, same_text, _nodes()[0].model_copy(update={"archived": True})])
            w.put_embeddings(model, [("n3", np.ones(local_embedder.dim, np.float32), "")])
        full, targeted = _both(store, model)
        assert targeted == full
        assert [(t[0], t[1], t[2]) for t in full[0]] == [
            ("n2", embedding_text(edited), text_hash(embedding_text(edited))),
            ("n3", embedding_text(_nodes()[3]), text_hash(embedding_text(_nodes()[3]))),
        ]
        assert (full[2], full[3]) == (2, 1)
        # Another model id: everything active again, digests served from the memo.
        assert _both(store, "another-model")[1] == _both(store, "another-model")[0]

    def test_edit_and_revert_follow_the_text(self, store: Store, local_embedder: LocalEmbedder) -> None:
        # A → B → A: the memo keys on the JSON text, so the revert is seen as a change again.
        model = local_embedder.model_id
        embed_missing(store, CHAT, local_embedder)
        original = _nodes()[1]
        edited = original.model_copy(update={"fields": {"summary": "Mara still owes."}})
        for node, want in ((edited, "Mara still owes."), (original, "Mara paid the debt.")):
            with store.write(CHAT) as w:
                w.upsert_nodes([node])
            rep = embed_missing(store, CHAT, local_embedder)
            assert (rep.total, rep.up_to_date) == (1, 4)
            assert store.embedding_hashes(CHAT, model)["n1"] == text_hash(embedding_text(node))
            assert want in embedding_text(node)


class TestSameResult:
    def test_reports_and_vectors_equal(self, tmp_path: Path, local_embedder: LocalEmbedder) -> None:
        a, b = Store(tmp_path / "a.sqlite3"), Store(tmp_path / "b.sqlite3")
        try:
            steps = [
                _nodes(),
                [_nodes()[0].model_copy(update={"fields": {"summary": "The lantern burns."}})],
                [
                    _nodes()[3].model_copy(update={"archived": True}),
                    Node(id="n9", type="event", fields={"summary": "New."}),
                ],
            ]
            for nodes in steps:
                for s in (a, b):
                    with s.write(CHAT) as w:
                        w.upsert_nodes(nodes)
                rep_a = embed_missing(_Generic(a), CHAT, local_embedder, batch_size=2)  # type: ignore[arg-type]
                rep_b = embed_missing(b, CHAT, local_embedder, batch_size=2)
                assert _report(rep_b) == _report(rep_a)
                ids_a, m_a = a.get_embeddings(CHAT, local_embedder.model_id)
                ids_b, m_b = b.get_embeddings(CHAT, local_embedder.model_id)
                assert ids_b == ids_a
                np.testing.assert_array_equal(m_b, m_a)
                assert b.embedding_hashes(CHAT, local_embedder.model_id) == a.embedding_hashes(
                    CHAT, local_embedder.model_id
                )
            assert _report(rep_b)["total"] == 1  # the last step embedded exactly the new node
        finally:
            a.close()
            b.close()


class TestDigestMemo:
    def test_only_changed_nodes_parsed(self, store: Store, local_embedder: LocalEmbedder,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
        parsed: list[str] = []
        real = cache._parse

        def counting(node_id: str, text: str) -> Node:
            parsed.append(node_id)
            return real(node_id, text)

        monkeypatch.setattr(cache, "_parse", counting)
        embed_missing(store, CHAT, local_embedder)
        assert parsed == ["n0", "n1", "n2", "n3", "n4"]  # each once: the text serves digest and embedding
        parsed.clear()
        with store.write(CHAT) as w:
            w.upsert_nodes([_nodes()[3].model_copy(update={"fields": {"summary": "Changed."}})])
        rep = embed_missing(store, CHAT, local_embedder)
        assert rep.total == 1 and parsed == ["n3"]
        parsed.clear()
        # A second Store object on the same file starts with its own (empty) memo: parses everything once.
        other = Store(store.path)
        try:
            assert embed_missing(other, CHAT, local_embedder).total == 0
            assert sorted(parsed) == ["n0", "n1", "n2", "n3", "n4"]
        finally:
            other.close()


class _EditingEmbedder:
    """The local embedder, but each ``embed_passages`` call first runs ``during`` (another writer's change that
    lands while the chunk is being embedded)."""

    def __init__(self, inner: LocalEmbedder, during: Any) -> None:
        self.inner = inner
        self.during = during
        self.model_id = inner.model_id
        self.dim = inner.dim

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        self.during()
        self.during = lambda: None
        return self.inner.embed_passages(texts)


class TestOverlappingWrites:
    def test_a_node_edited_while_embedded_is_skipped_and_redone(self, store: Store,
                                                                 local_embedder: LocalEmbedder) -> None:
        edited = _nodes()[1].model_copy(update={"fields": {"summary": "Mara still owes."}})

        def edit() -> None:
            with store.write(CHAT) as w:
                w.upsert_nodes([edited])

        rep = embed_missing(store, CHAT, _EditingEmbedder(local_embedder, edit))
        hashes = store.embedding_hashes(CHAT, local_embedder.model_id)
        # n3 repeats n0's text; n1 changed under the run: not written with the old text's vector.
        assert sorted(hashes) == ["n0", "n2", "n3", "n4"]
        assert rep.total == 4
        again = embed_missing(store, CHAT, local_embedder)
        assert (again.total, again.embedded) == (1, 1)
        assert store.embedding_hashes(CHAT, local_embedder.model_id)["n1"] == text_hash(embedding_text(edited))

    def test_a_chunk_whose_nodes_all_vanished_writes_nothing(self, store: Store,
                                                             local_embedder: LocalEmbedder) -> None:
        version = store.chat_version(CHAT)

        def delete() -> None:
            with store.write(CHAT) as w:
                w.delete_nodes(["n0", "n1"])

        rep = embed_missing(store, CHAT, _EditingEmbedder(local_embedder, delete), batch_size=2)
        assert rep.total == 3  # n2, n3, n4; the first chunk (n0, n1) rolled back
        assert sorted(store.embedding_hashes(CHAT, local_embedder.model_id)) == ["n2", "n3", "n4"]
        # One version for the deletion and one per written chunk (n2+n3, n4); none for the empty chunk.
        assert store.chat_version(CHAT) == version + 3


class TestSubsetAndStop:
    def test_node_ids_limit_the_work(self, store: Store, local_embedder: LocalEmbedder) -> None:
        rep = embed_missing(store, CHAT, local_embedder, node_ids=["n4", "n2", "missing"])
        assert (rep.total, rep.embedded) == (2, 2)
        assert sorted(store.embedding_hashes(CHAT, local_embedder.model_id)) == ["n2", "n4"]

    def test_stop_ends_before_the_next_chunk(self, store: Store, local_embedder: LocalEmbedder) -> None:
        asked: list[int] = []

        def stop() -> bool:
            asked.append(1)
            return len(asked) > 2

        seen: list[tuple[int, int]] = []
        rep = embed_missing(store, CHAT, local_embedder, batch_size=2, stop=stop,
                            progress=lambda done, total: seen.append((done, total)))
        assert seen == [(2, 5), (4, 5)]
        assert rep.total == 4
        assert sorted(store.embedding_hashes(CHAT, local_embedder.model_id)) == ["n0", "n1", "n2", "n3"]


class TestNodeIds:
    def test_status_rows_of_the_given_nodes_only(self, store: Store) -> None:
        with store.write(CHAT) as w:
            w.put_embeddings("m", [("n3", np.ones(3, np.float32), "h3")])
        every = store.embedding_status(CHAT, "m")
        assert store.embedding_status(CHAT, "m", ["n4", "n1", "nope", "n3"]) == [every[1], every[3], every[4]]
        assert store.embedding_status(CHAT, "m", []) == []
        assert store.stored_text_hash(CHAT, "m") == "h3" and store.stored_text_hash(CHAT, "other") is None

    def test_a_write_embeds_its_nodes_from_their_rows(self, store: Store, local_embedder: LocalEmbedder,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
        """``node_ids`` (what the service passes after a write): only those rows are read, the same vectors are
        written as a whole-chat run would write for them, and the dimension probe still finds a stored vector."""
        model = local_embedder.model_id
        embed_missing(store, CHAT, local_embedder, node_ids=["n0"])
        assert sorted(store.embedding_hashes(CHAT, model)) == ["n0"]
        read: list[Any] = []
        real = store.embedding_status

        def counted(chat_id: str, model_id: str, node_ids: Any = None) -> Any:
            read.append(None if node_ids is None else sorted(node_ids))
            return real(chat_id, model_id, node_ids)

        monkeypatch.setattr(store, "embedding_status", counted)
        rep = embed_missing(store, CHAT, local_embedder, node_ids=["n2", "n4"])
        assert read == [["n2", "n4"]]
        assert (rep.total, rep.embedded, rep.up_to_date, rep.archived) == (2, 2, 0, 0)
        ids, matrix = store.get_embeddings(CHAT, model)
        got = dict(zip(ids, matrix, strict=True))
        want = local_embedder.embed_passages([embedding_text(_nodes()[2]), embedding_text(_nodes()[4])])
        np.testing.assert_array_equal(np.stack([got["n2"], got["n4"]]), want)
        assert sorted(got) == ["n0", "n2", "n4"]
        monkeypatch.undo()
        full = embed_missing(store, CHAT, local_embedder)  # the memo holds the partial reads' digests too
        assert (full.total, full.up_to_date) == (2, 3)
