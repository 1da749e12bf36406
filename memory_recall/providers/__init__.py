"""Providers: embedding (local engine or OpenAI-compatible API), the embedding cache and the rerank chat LLM.

Every provider failure is typed (:class:`~memory_recall.errors.EmbeddingUnavailable`,
:class:`~memory_recall.errors.LLMUnavailable`, each with a ``category``); the retrieve runner decides
whether to degrade (recall-spec departure 3) or, in strict mode, to raise.

Usage::

    from memory_recall.providers import make_embedder, embed_missing, embed_query_or_fallback

    embedder = make_embedder(settings.embedding)   # the packaged local model by default
    embed_missing(store, chat_id, embedder)          # each distinct text embedded once per model
    q = embed_query_or_fallback(embedder, query, strict=settings.embedding.strict)
"""

from __future__ import annotations

from memory_recall.providers.cache import EmbeddingStore, EmbedReport, embed_missing, text_hash
from memory_recall.providers.check import ProviderStatus, check_providers
from memory_recall.providers.embedding import (
    LOCAL_DIM,
    LOCAL_MODEL_ID,
    Embedder,
    LocalEmbedder,
    OpenAIEmbedder,
    QueryEmbedding,
    aembed_query,
    embed_query_or_fallback,
    local_engine_available,
    make_embedder,
    openai_model_id,
)
from memory_recall.providers.llm import (
    CONTEXT_REVIEW_HEADER,
    TARGET_HEADER,
    ChatLLM,
    OpenAIChatLLM,
    OwnerScore,
    RerankAnswer,
    build_rerank_messages,
    extract_json_object,
    make_llm,
    parse_rerank_answer,
    request_rerank,
)

__all__ = [
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
]
