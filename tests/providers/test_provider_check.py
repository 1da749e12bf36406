"""``check_providers``: reports configuration and health, never raises for a provider that is down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import ChatServer, EmbeddingServer, Step, free_port

from memory_recall.providers.check import ProviderStatus, check_providers
from memory_recall.settings import EmbeddingSettings, LLMSettings, RecallSettings


def _settings(**sections: object) -> RecallSettings:
    return RecallSettings(**sections)  # type: ignore[arg-type]


@pytest.fixture()
def no_models_server() -> Iterator[ChatServer]:
    server = ChatServer(models_route=False)
    yield server
    server.close()


class TestCheckProviders:
    def test_defaults_local_engine_and_no_llm(self) -> None:
        emb, llm = check_providers(_settings())
        assert (emb.name, emb.kind, emb.configured, emb.ok) == ("embedding", "local", True, True)
        assert emb.model_id == "local:multilingual-e5-small-q4"
        assert emb.facts["local_engine_available"] is True and emb.facts["dim"] == 384
        assert emb.latency_ms is not None and emb.latency_ms >= 0
        assert (llm.name, llm.kind, llm.configured, llm.ok) == ("llm", "none", False, None)
        assert "not configured" in llm.line()

    def test_endpoints_up(self, embed_server: EmbeddingServer, chat_server: ChatServer) -> None:
        settings = _settings(
            embedding=EmbeddingSettings(provider="openai", base_url=embed_server.base_url, model="e5-test"),
            llm=LLMSettings(base_url=chat_server.base_url, model="scripted"),
        )
        emb, llm = check_providers(settings)
        assert emb.ok is True and emb.kind == "openai" and emb.endpoint.endswith("/v1/embeddings")
        assert emb.facts["dim"] == 384
        assert llm.ok is True and llm.endpoint.endswith("/v1/models") and llm.facts["models"] == ["scripted"]
        assert chat_server.post_count == 0  # the model list answered: no chat call spent
        assert "ok" in llm.line()

    def test_llm_without_model_list_gets_one_chat_call(self, no_models_server: ChatServer) -> None:
        no_models_server.push(Step("content", content="p"))
        (_, llm) = check_providers(_settings(llm=LLMSettings(base_url=no_models_server.base_url, model="m")))
        assert llm.ok is True and llm.endpoint.endswith("/chat/completions")
        assert no_models_server.post_count == 1
        assert no_models_server.posts()[0].body["max_tokens"] == 1

    def test_down_endpoints_reported_not_raised(self) -> None:
        port = free_port()
        settings = _settings(
            embedding=EmbeddingSettings(
                provider="openai", base_url=f"http://127.0.0.1:{port}/v1", model="e5"
            ),
            llm=LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m"),
        )
        emb, llm = check_providers(settings, deadline_s=1.0)
        assert (emb.ok, emb.failure_category) == (False, "connect")
        assert (llm.ok, llm.failure_category) == (False, "connect")
        assert "FAILED" in emb.line()

    def test_slow_endpoint_times_out(self, embed_server: EmbeddingServer) -> None:
        embed_server.push(Step("slow", delay_s=3.0))
        settings = _settings(embedding=EmbeddingSettings(base_url=embed_server.base_url, model="e5-test"))
        emb, _ = check_providers(settings, deadline_s=0.5)
        assert (emb.ok, emb.failure_category) == (False, "timeout")
        assert emb.latency_ms is not None and emb.latency_ms < 1500

    def test_misconfiguration_reported(self) -> None:
        settings = _settings(embedding=EmbeddingSettings(provider="openai"), llm=LLMSettings(model="m"))
        emb, llm = check_providers(settings)
        assert (emb.ok, emb.failure_category) == (False, "config")
        assert "embedding.base_url" in emb.detail
        assert (llm.ok, llm.failure_category) == (False, "config")
        assert "llm.base_url" in llm.detail

    def test_embeddings_off(self) -> None:
        emb, _ = check_providers(_settings(embedding=EmbeddingSettings(provider="none")))
        assert isinstance(emb, ProviderStatus)
        assert (emb.kind, emb.configured, emb.ok) == ("none", False, None)
