"""The public surface of ``memory_recall.providers`` is exactly ``__all__`` and every name resolves."""

from __future__ import annotations

import memory_recall.providers as providers

EXPECTED = {
    "CONTEXT_REVIEW_HEADER",
    "LOCAL_DIM",
    "LOCAL_MODEL_ID",
    "TARGET_HEADER",
    "ChatLLM",
    "EmbedReport",
    "Embedder",
    "EmbeddingStore",
    "LocalEmbedder",
    "OpenAIChatLLM",
    "OpenAIEmbedder",
    "OwnerScore",
    "ProviderStatus",
    "QueryEmbedding",
    "RerankAnswer",
    "aembed_query",
    "build_rerank_messages",
    "check_providers",
    "embed_missing",
    "embed_query_or_fallback",
    "extract_json_object",
    "local_engine_available",
    "make_embedder",
    "make_llm",
    "openai_model_id",
    "parse_rerank_answer",
    "request_rerank",
    "text_hash",
}


def test_all_is_the_public_surface() -> None:
    assert set(providers.__all__) == EXPECTED
    for name in providers.__all__:
        assert getattr(providers, name) is not None


def test_model_loads_lazily() -> None:
    # The model loads on first use, not on import (the service starts fast; `providers check` is cheap).
    emb = providers.LocalEmbedder()
    assert emb._model is None
