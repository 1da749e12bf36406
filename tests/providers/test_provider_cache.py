"""Embedding cache: a real Store in tmp_path, embeddings counted on a real server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from servers import EmbeddingServer, Step

from memory_recall.errors import EmbeddingUnavailable, InputError
from memory_recall.model.graph import Node, embedding_text
from memory_recall.providers.cache import EmbedReport, embed_missing, text_hash
from memory_recall.providers.embedding import LocalEmbedder, OpenAIEmbedder
from memory_recall.store.sqlite import Store

N_NODES = 30


def _nodes(prefix: str = "n") -> list[Node]:
    out = []
    for i in range(N_NODES):
        lang = "The caravan reached the ford on day" if i % 2 else "商队在第几天到达了渡口"
        out.append(
            Node(
                id=f"{prefix}{i:02d}",
                type="event",
                seq=i,
                fields={"title": f"event {i}", "summary": f"{lang} {i}."},
            )
        )
    return out


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.sqlite3")
    with s.write("chat-a") as w:
        w.upsert_nodes(_nodes())
    yield s
    s.close()


_OPEN: list[OpenAIEmbedder] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _embedder(server: EmbeddingServer, model: str = "e5-test") -> OpenAIEmbedder:
    emb = OpenAIEmbedder(base_url=server.base_url, model=model, batch_size=16)
    _OPEN.append(emb)
    return emb


class TestTextHash:
    def test_sha256_of_utf8(self) -> None:
        assert text_hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        assert text_hash("记忆") == text_hash("记忆") != text_hash("记忆 ")
        assert len(text_hash("")) == 64


class TestEmbedMissing:
    def test_first_run_embeds_all_second_run_nothing(
        self, store: Store, embed_server: EmbeddingServer
    ) -> None:
        emb = _embedder(embed_server)
        progress: list[tuple[int, int]] = []
        first = embed_missing(
            store, "chat-a", emb, progress=lambda d, t: progress.append((d, t)), batch_size=8
        )
        assert (first.total, first.from_cache, first.embedded, first.calls) == (N_NODES, 0, N_NODES, 4)
        assert embed_server.texts_embedded() == N_NODES
        assert embed_server.embed_count() == 4  # 4 chunks of <= 8 texts, each one request (batch_size 16)
        assert progress == [(8, 30), (16, 30), (24, 30), (30, 30)]
        ids, matrix = store.get_embeddings("chat-a", emb.model_id)
        assert ids == [n.id for n in _nodes()]
        assert matrix.shape == (N_NODES, 384)
        assert store.embedding_hashes("chat-a", emb.model_id)["n00"] == text_hash(embedding_text(_nodes()[0]))

        before = embed_server.embed_count()
        second = embed_missing(store, "chat-a", emb)
        assert embed_server.embed_count() == before  # ZERO calls reach the server
        assert second == EmbedReport(model_id=emb.model_id, up_to_date=N_NODES, elapsed_ms=second.elapsed_ms)

    def test_second_chat_same_texts_hits_cache(self, store: Store, embed_server: EmbeddingServer) -> None:
        emb = _embedder(embed_server)
        embed_missing(store, "chat-a", emb)
        with store.write("chat-b") as w:
            w.upsert_nodes(_nodes())
        before = embed_server.embed_count()
        report = embed_missing(store, "chat-b", emb)
        assert embed_server.embed_count() == before
        assert (report.total, report.from_cache, report.embedded, report.calls) == (N_NODES, N_NODES, 0, 0)
        _, a = store.get_embeddings("chat-a", emb.model_id)
        _, b = store.get_embeddings("chat-b", emb.model_id)
        np.testing.assert_array_equal(a, b)

    def test_edit_reembeds_exactly_one(self, store: Store, embed_server: EmbeddingServer) -> None:
        emb = _embedder(embed_server)
        embed_missing(store, "chat-a", emb)
        _, old = store.get_embeddings("chat-a", emb.model_id)
        edited = _nodes()[5].model_copy(
            update={"fields": {"title": "event 5", "summary": "The ford flooded."}}
        )
        with store.write("chat-a") as w:
            w.upsert_nodes([edited])
        embed_server.reset()
        report = embed_missing(store, "chat-a", emb)
        assert (report.total, report.embedded, report.calls, report.up_to_date) == (1, 1, 1, N_NODES - 1)
        assert embed_server.texts_embedded() == 1
        assert embed_server.posts()[0].body["input"] == [embedding_text(edited)]
        _, new = store.get_embeddings("chat-a", emb.model_id)
        changed = [i for i in range(N_NODES) if not np.array_equal(old[i], new[i])]
        assert changed == [5]

    def test_archived_nodes_skipped(self, store: Store, embed_server: EmbeddingServer) -> None:
        with store.write("chat-a") as w:
            w.upsert_nodes([_nodes()[0].model_copy(update={"archived": True})])
        report = embed_missing(store, "chat-a", _embedder(embed_server))
        assert (report.total, report.archived) == (N_NODES - 1, 1)
        ids, _ = store.get_embeddings("chat-a", _embedder(embed_server).model_id)
        assert "n00" not in ids

    def test_duplicate_texts_embedded_once(self, tmp_path: Path, embed_server: EmbeddingServer) -> None:
        with Store(tmp_path / "dup.sqlite3") as s:
            same = {"summary": "Same words."}
            with s.write("c") as w:
                w.upsert_nodes([Node(id=f"d{i}", type="event", fields=same) for i in range(5)])
            report = embed_missing(s, "c", _embedder(embed_server), batch_size=2)
        assert report.total == 5
        assert report.embedded == 1  # later chunks find it in the cache
        assert embed_server.texts_embedded() == 1

    def test_switching_model_reembeds_and_never_mixes(
        self, store: Store, embed_server: EmbeddingServer, local_embedder: LocalEmbedder
    ) -> None:
        http = _embedder(embed_server)
        embed_missing(store, "chat-a", http)
        old_ids, old = store.get_embeddings("chat-a", http.model_id)
        calls = embed_server.embed_count()

        other = _embedder(embed_server, model="e5-other")
        report = embed_missing(store, "chat-a", other)
        assert (report.total, report.from_cache, report.embedded) == (N_NODES, 0, N_NODES)
        after_switch = embed_server.embed_count()
        assert after_switch > calls

        local = embed_missing(store, "chat-a", local_embedder)  # the in-process engine: a third model id
        assert local.embedded == N_NODES
        assert embed_server.embed_count() == after_switch

        ids_after, old_after = store.get_embeddings("chat-a", http.model_id)
        assert ids_after == old_ids
        np.testing.assert_array_equal(old_after, old)
        for model_id in (other.model_id, local_embedder.model_id):
            ids, matrix = store.get_embeddings("chat-a", model_id)
            assert ids == old_ids and matrix.shape == (N_NODES, 384)

    def test_failure_keeps_committed_chunks_and_resumes(
        self, store: Store, embed_server: EmbeddingServer
    ) -> None:
        emb = _embedder(embed_server)
        emb.max_retries = 0
        embed_server.push(Step("ok"), Step("status", status=500))
        with pytest.raises(EmbeddingUnavailable) as info:
            embed_missing(store, "chat-a", emb, batch_size=10)
        assert info.value.category == "http_status"
        assert len(store.embedding_hashes("chat-a", emb.model_id)) == 10
        embed_server.reset()
        report = embed_missing(store, "chat-a", emb, batch_size=10)
        assert (report.total, report.up_to_date, report.embedded) == (20, 10, 20)

    def test_dimension_change_under_one_model_id(self, store: Store, embed_server: EmbeddingServer) -> None:
        embed_missing(store, "chat-a", _embedder(embed_server))
        with store.write("chat-a") as w:
            w.upsert_nodes([Node(id="new", type="event", fields={"summary": "A new turn."})])
        embed_server.push(Step("wrong_dim", dim=128))
        with pytest.raises(EmbeddingUnavailable) as info:
            embed_missing(store, "chat-a", _embedder(embed_server))  # a fresh client: no dimension seen yet
        assert info.value.category == "dimension_mismatch"
        assert "new" not in store.embedding_hashes("chat-a", _embedder(embed_server).model_id)

    @pytest.mark.parametrize("bad", [0, -3, True])
    def test_invalid_batch_size(self, store: Store, local_embedder: LocalEmbedder, bad: int) -> None:
        with pytest.raises(InputError, match="batch_size"):
            embed_missing(store, "chat-a", local_embedder, batch_size=bad)
