"""Failure policy for query embeddings (recall-spec departure 3): degrade to lexical, or raise when strict."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from servers import EmbeddingServer, Step, free_port

from memory_recall.errors import EmbeddingUnavailable, StrictModeViolation
from memory_recall.providers.embedding import LocalEmbedder, OpenAIEmbedder, embed_query_or_fallback


@pytest.fixture()
def remote(embed_server: EmbeddingServer) -> Iterator[OpenAIEmbedder]:
    emb = OpenAIEmbedder(
        base_url=embed_server.base_url,
        model="e5-test",
        read_timeout_s=0.3,
        query_deadline_s=1.0,
        max_retries=0,
    )
    yield emb
    emb.close()


FAULTS = [
    (Step("slow", delay_s=3.0), "timeout"),
    (Step("status", status=503), "http_status"),
    (Step("malformed"), "bad_payload"),
    (Step("nan"), "bad_payload"),
    (Step("wrong_dim", dim=64), "dimension_mismatch"),
]


class TestEmbedQueryOrFallback:
    def test_success(self, local_embedder: LocalEmbedder) -> None:
        q = embed_query_or_fallback(local_embedder, "where is the key?", strict=True)
        assert q.ok and q.retrieval_status == "semantic" and q.semantic_search_used
        assert q.vector is not None and q.vector.shape == (384,)
        assert q.failure_category is None and q.model_id == local_embedder.model_id
        np.testing.assert_allclose(q.vector, local_embedder.embed_query("where is the key?"), atol=1e-6)

    @pytest.mark.parametrize(("step", "category"), FAULTS, ids=[c for _, c in FAULTS])
    def test_non_strict_degrades(
        self, embed_server: EmbeddingServer, remote: OpenAIEmbedder, step: Step, category: str
    ) -> None:
        if category == "dimension_mismatch":
            remote.dimensions = 384
        embed_server.push(step)
        q = embed_query_or_fallback(remote, "q", strict=False)
        assert not q.ok and q.vector is None
        assert q.meta() == {
            "retrieval_status": "lexical_fallback",
            "semantic_search_used": False,
            "failure_category": category,
            "detail": q.detail,
            "model_id": remote.model_id,
            "elapsed_ms": round(q.elapsed_ms, 3),
        }
        assert q.detail

    @pytest.mark.parametrize(("step", "category"), FAULTS, ids=[c for _, c in FAULTS])
    def test_strict_raises(
        self, embed_server: EmbeddingServer, remote: OpenAIEmbedder, step: Step, category: str
    ) -> None:
        if category == "dimension_mismatch":
            remote.dimensions = 384
        embed_server.push(step)
        with pytest.raises(StrictModeViolation) as info:
            embed_query_or_fallback(remote, "q", strict=True)
        assert isinstance(info.value.cause, EmbeddingUnavailable)
        assert info.value.cause.category == category

    def test_refused_connection(self) -> None:
        with OpenAIEmbedder(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m") as dead:
            q = embed_query_or_fallback(dead, "q", strict=False)
            assert (q.retrieval_status, q.failure_category) == ("lexical_fallback", "connect")
            with pytest.raises(StrictModeViolation):
                embed_query_or_fallback(dead, "q", strict=True)

    def test_caller_bugs_are_not_degraded(self, local_embedder: LocalEmbedder) -> None:
        with pytest.raises(TypeError):
            embed_query_or_fallback(local_embedder, None, strict=False)  # type: ignore[arg-type]
