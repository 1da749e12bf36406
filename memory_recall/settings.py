"""All settings of memory-recall: one :class:`RecallSettings` with a frozen section per concern and per stage.

Load order (later wins, key by key): defaults of the chosen profile < TOML file < environment (``MEMORY_RECALL_``
prefix, ``__`` between section and key, e.g. ``MEMORY_RECALL_DIFFUSION__DECAY=0.5``) < explicit overrides (command
options, :func:`load_settings` ``overrides``). The profile itself: the ``profile`` argument, else
``MEMORY_RECALL_PROFILE``, else the file's ``profile``, else ``"default"``. ``"default"`` treats each node by
its kind: raw ``message`` nodes with the weights and channels measured best on chat transcripts (LoCoMo, issues 7
and 17), extracted memories with the reference's weights; ``"transcript"`` is an alias of it. Two profiles
reproduce the reference's two default columns (stbme-reference §5.1) for conformance checks: ``"app"`` (what a
normal recall uses; also the field defaults of :class:`RecallSettings`) and ``"fallback"`` (what ``retrieve()``
uses when an option is absent).

A stage receives only its own section. Per-request overrides go through :meth:`RecallSettings.with_overrides`,
which validates them and returns a new object; settings are never mutated.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from memory_recall.errors import ConfigError

__all__ = [
    "AnchorSettings",
    "ContextSettings",
    "ControllerSettings",
    "CooccurrenceSettings",
    "CrossRecallSettings",
    "DiffusionSettings",
    "DiversitySettings",
    "EmbeddingSettings",
    "InjectorSettings",
    "LLMSettings",
    "LexicalSettings",
    "OwnerSettings",
    "ProbabilisticSettings",
    "QueryPlanSettings",
    "RecallSettings",
    "ReinforcementSettings",
    "ResidualSettings",
    "RerankSettings",
    "ScoringSettings",
    "SelectionSettings",
    "ServiceSettings",
    "StoreSettings",
    "VectorSettings",
    "VisibilitySettings",
    "load_settings",
]

_Section = ConfigDict(frozen=True, extra="forbid")
Unit = float  # a value in [0, 1]


class StoreSettings(BaseModel):
    """Where the SQLite store lives."""

    model_config = _Section

    data_dir: str = ""  # empty: MEMORY_RECALL_DATA_DIR or the per-user default
    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000)


class EmbeddingSettings(BaseModel):
    """Embedding provider. ``provider="local"`` uses the packaged multilingual-e5-small engine."""

    model_config = _Section

    provider: Literal["auto", "local", "openai", "none"] = "auto"
    base_url: str = ""  # OpenAI-compatible endpoint root, e.g. http://127.0.0.1:8000/v1
    model: str = ""
    dimensions: int | None = Field(default=None, ge=1, le=8192)
    api_key_env: str = "MEMORY_RECALL_EMBEDDING_API_KEY"
    batch_size: int = Field(default=64, ge=1, le=2048)
    connect_timeout_s: float = Field(default=3.0, gt=0, le=600)
    read_timeout_s: float = Field(default=20.0, gt=0, le=600)
    deadline_s: float = Field(default=30.0, gt=0, le=3600)  # one overall deadline incl. retries
    max_retries: int = Field(default=3, ge=0, le=10)
    query_deadline_s: float = Field(default=5.0, gt=0, le=600)  # per recall query embedding
    strict: bool = False  # raise instead of degrading to lexical_fallback


class LLMSettings(BaseModel):
    """Chat LLM used by the optional rerank (OpenAI-compatible ``/v1/chat/completions``)."""

    model_config = _Section

    base_url: str = ""  # empty: no LLM configured, rerank is skipped with a reason
    model: str = ""
    api_key_env: str = "MEMORY_RECALL_LLM_API_KEY"
    timeout_s: float = Field(default=20.0, gt=0, le=600)  # one attempt within this deadline
    temperature: float = Field(default=0.0, ge=0, le=2)
    strict: bool = False


# ---------------------------------------------------------------------------------------------------------------
# Stage sections (reference §5.1; "app" values are the defaults, the "fallback" profile overrides a few)
# ---------------------------------------------------------------------------------------------------------------


class SelectionSettings(BaseModel):
    """Sizes shared by several stages: ``topK``, ``maxRecallNodes``, the LLM candidate pool."""

    model_config = _Section

    top_k: int = Field(default=20, ge=1, le=1000)
    max_recall_nodes: int = Field(default=12, ge=1, le=200)
    llm_candidate_pool: int = Field(default=30, ge=1, le=500)


class ContextSettings(BaseModel):
    """Context resolution: owners, regions, story context, scope switches (reference §3.1, §5.1)."""

    model_config = _Section

    enable_scoped_memory: bool = True
    enable_pov_memory: bool = True
    enable_region_scoped_objective: bool = True
    enable_cognitive_memory: bool = True
    enable_spatial_adjacency: bool = True
    enable_story_timeline: bool = True
    story_time_soft_directing: bool = True


class VisibilitySettings(BaseModel):
    """Legacy visibility filter on ``fields.visibility`` (reference §3.2)."""

    model_config = _Section

    enabled: bool = True


class QueryPlanSettings(BaseModel):
    """Context query blend and multi-intent split (reference §3.5–§3.6)."""

    model_config = _Section

    enable_context_query_blend: bool = True
    context_assistant_weight: Unit = Field(default=0.2, ge=0, le=1)
    context_previous_user_weight: Unit = Field(default=0.1, ge=0, le=1)
    enable_multi_intent: bool = True
    multi_intent_max_segments: int = Field(default=4, ge=1, le=16)
    recent_context_messages: int = Field(default=4, ge=0, le=20)


class VectorSettings(BaseModel):
    """Vector prefilter (reference §3.7)."""

    model_config = _Section

    enabled: bool = True
    #: Turn context (pipeline.turn_context): a message turn's cosine is averaged with its previous and next turns'
    #: with these weights (0: the reference's plain cosine).
    turn_context_previous: float = Field(default=0.0, ge=0, le=10)
    turn_context_next: float = Field(default=0.0, ge=0, le=10)


class LexicalSettings(BaseModel):
    """Reference field matching plus the BM25 channel (reference §3.12 step 1, recall-spec "BM25 channel")."""

    model_config = _Section

    enable_lexical_boost: bool = True
    lexical_weight: float = Field(default=0.18, ge=0, le=10)
    enable_bm25: bool = True
    bm25_top_k: int = Field(default=30, ge=1, le=1000)
    bm25_max_terms: int = Field(default=64, ge=1, le=64)
    # Scale of the reference field match before it is max-combined with BM25 (1 = the reference).
    field_match_weight: float = Field(default=1.0, ge=0, le=1)
    # Suffix stemming of the BM25 channel's Latin-script terms, index and query alike (not in the reference):
    # "none" = exact terms (FTS5), "s" = plural endings only, "porter" = Porter (1980), "english" = Snowball English.
    stem: Literal["none", "s", "porter", "english"] = "none"
    # Query expansion from the first-pass hits (not in the reference; pipeline.lexical): the terms of the best
    # ``feedback_docs`` BM25 hits (most shared first, at most ``feedback_terms``) are added to the query for a
    # second BM25 pass whose scores, × ``feedback_weight``, are max-combined with the first's. 0 docs = off.
    feedback_docs: int = Field(default=0, ge=0, le=20)
    feedback_terms: int = Field(default=10, ge=1, le=64)
    feedback_weight: Unit = Field(default=0.5, ge=0, le=1)
    #: Turn context (pipeline.turn_context) of the BM25 channel: a message turn's score averaged with its
    #: neighbours' (0: the index's hits as they are).
    turn_context_previous: float = Field(default=0.0, ge=0, le=10)
    turn_context_next: float = Field(default=0.0, ge=0, le=10)


class AnchorSettings(BaseModel):
    """Entity anchors (reference §3.8)."""

    model_config = _Section

    enabled: bool = True
    energy: float = Field(default=2.0, ge=0, le=2)


class DiffusionSettings(BaseModel):
    """PEDSA spreading activation (reference §3.9, §5.3)."""

    model_config = _Section

    enabled: bool = True
    top_k: int = Field(default=100, ge=1, le=100_000)
    max_steps: int = Field(default=2, ge=1, le=10)
    decay: float = Field(default=0.6, ge=0, le=1)
    teleport_alpha: Unit = Field(default=0.15, ge=0, le=1)
    enable_temporal_links: bool = True
    temporal_link_strength: Unit = Field(default=0.2, ge=0, le=1)
    min_energy: float = Field(default=0.01, ge=0, le=1)
    inhibit_multiplier: float = Field(default=2.0, ge=0, le=10)
    # Hub damping (not in the reference): each real edge is scaled by f(a)·f(b), f = min(1, threshold /
    # degree) ** exponent, so a node linked to hundreds of turns (a speaker, a common name) does not flood
    # them all with energy. 0 = off (the reference).
    hub_degree_threshold: int = Field(default=0, ge=0, le=100_000)
    hub_exponent: float = Field(default=1.0, ge=0, le=4)
    # Which neighbours count towards a node's degree for the hub damping: "all", or "message" (chat turns only:
    # a speaker or a name linked to hundreds of turns is damped, an extracted graph without turns never is).
    hub_degree_counts: Literal["all", "message"] = "all"


class CrossRecallSettings(BaseModel):
    """Supplemental anchors and cross-recall re-diffusion (reference §3.10)."""

    model_config = _Section

    enabled: bool = True
    event_energy_factor: float = Field(default=1.5, ge=0, le=2)
    supplemental_anchors: int = Field(default=5, ge=0, le=50)
    # Empty score map (no vector, anchor or BM25 hit): the reference scores the whole active set (§3.10).
    # Kept up to this many active nodes; above it only the top `selection.top_k × 3` by importance, then
    # recency, enter (recall-spec departure 11, reference §7 item 24: the no-vector path must not score the
    # whole graph).
    whole_set_fallback_max_nodes: int = Field(default=2000, ge=0, le=10_000_000)


class CooccurrenceSettings(BaseModel):
    """Co-occurrence boost (reference §3.11)."""

    model_config = _Section

    enabled: bool = False
    scale: float = Field(default=0.1, ge=0, le=10)
    max_neighbors: int = Field(default=10, ge=1, le=1000)
    max_anchors_per_batch: int = Field(default=10, ge=2, le=1000)


class ResidualSettings(BaseModel):
    """Residual recall: NMF novelty and sparse-coding residual (reference §3.10)."""

    model_config = _Section

    enabled: bool = False
    basis_max_nodes: int = Field(default=24, ge=2, le=512)
    nmf_topics: int = Field(default=15, ge=1, le=128)
    nmf_novelty_threshold: Unit = Field(default=0.4, ge=0, le=1)
    residual_threshold: float = Field(default=0.3, ge=0, le=10)
    top_k: int = Field(default=5, ge=1, le=100)


class ScoringSettings(BaseModel):
    """Hybrid score, scope/knowledge/time weights (reference §3.12, §1.4)."""

    model_config = _Section

    graph_weight: float = Field(default=0.6, ge=-10, le=10)
    vector_weight: float = Field(default=0.3, ge=-10, le=10)
    importance_weight: float = Field(default=0.1, ge=-10, le=10)
    character_pov_weight: float = Field(default=1.25, ge=0, le=10)
    user_pov_weight: float = Field(default=1.05, ge=0, le=10)
    objective_current_region_weight: float = Field(default=1.15, ge=0, le=10)
    objective_adjacent_region_weight: float = Field(default=0.9, ge=0, le=10)
    objective_global_weight: float = Field(default=0.75, ge=0, le=10)
    inject_low_confidence_objective_memory: bool = False
    # Reference §1.9 time decay of the hybrid score (off = every node's decay is 1.0).
    time_decay: bool = True
    # How the vector and lexical evidence enter the hybrid score: "hybrid" = their raw scores (the reference);
    # "rrf" = reciprocal-rank values 61 / (60 + rank) among the scored candidates (1 for the best, 0 without
    # evidence), so the two channels count on one scale whatever their score spreads.
    fusion: Literal["hybrid", "rrf"] = "hybrid"
    # Neighbour carry (not in the reference): a candidate's vector and lexical evidence become at least
    # ``neighbour_carry`` × those of its prev/next chain neighbours among the candidates (an answer turn
    # inherits the match of the question it replies to). 0 = off (the reference).
    neighbour_carry: Unit = Field(default=0.0, ge=0, le=1)
    # Per node kind (not in the reference): with ``message_weights`` on, raw ``message`` nodes (chat turns synced
    # from the host, no LLM extraction) score with the ``message_*`` values below instead of the five above and
    # ``lexical.lexical_weight`` / ``lexical.field_match_weight``; every extracted node (event, character, POV
    # memory …) keeps them, i.e. the reference. Off = every node as the reference. The values are the ones
    # measured best on transcripts (LoCoMo dev split, docs/evaluation.md).
    message_weights: bool = False
    message_graph_weight: float = Field(default=0.6, ge=-10, le=10)
    message_vector_weight: float = Field(default=3.0, ge=-10, le=10)
    message_importance_weight: float = Field(default=0.1, ge=-10, le=10)
    message_lexical_weight: float = Field(default=5.0, ge=0, le=10)
    message_field_match_weight: Unit = Field(default=0.0, ge=0, le=1)
    message_time_decay: bool = False
    message_neighbour_carry: Unit = Field(default=0.7, ge=0, le=1)
    # Time cue (not in the reference; memory_recall.pipeline.temporal): a question asking when something
    # happened raises message turns that say when (``last week``, ``yesterday`` …) by ``time_expression_boost``;
    # a question naming a date, month or year of the chat's own timeline raises turns sent then (or up to a
    # fortnight after, when they tell of it) by ``time_range_boost``. Multipliers 1 + boost, message nodes only.
    time_cue: bool = False
    time_expression_boost: float = Field(default=0.3, ge=0, le=10)
    time_range_boost: float = Field(default=0.3, ge=0, le=10)
    # Speaker cue (not in the reference; memory_recall.pipeline.speaker_cue): a question naming a speaker raises
    # that speaker's own message turns by the multiplier 1 + ``speaker_cue_boost``.
    speaker_cue: bool = False
    speaker_cue_boost: float = Field(default=0.3, ge=0, le=10)


class DiversitySettings(BaseModel):
    """Candidate pool and greedy DPP (reference §3.14)."""

    model_config = _Section

    enabled: bool = True
    candidate_multiplier: int = Field(default=3, ge=1, le=100)
    quality_weight: float = Field(default=1.0, ge=0, le=10)


class RerankSettings(BaseModel):
    """Optional LLM rerank (reference §3.15)."""

    model_config = _Section

    enabled: bool = True


class OwnerSettings(BaseModel):
    """Owner finalisation, owner-POV augmentation and scene reconstruction (reference §3.16)."""

    model_config = _Section

    enable_scene_reconstruction: bool = True
    # Departure from §3.16 step 3's crowding: the first N ranked rows of the selection are never cut by scene
    # reconstruction (0 = the reference's behaviour). See memory_recall.pipeline.owners.
    keep_top_ranked: int = Field(default=5, ge=0, le=100)


class ReinforcementSettings(BaseModel):
    """Access reinforcement of finally selected nodes (reference §1.9)."""

    model_config = _Section

    enabled: bool = True
    importance_step: float = Field(default=0.1, ge=0, le=1)


class ProbabilisticSettings(BaseModel):
    """Probabilistic recall (reference §3.18 with recall-spec departure 6)."""

    model_config = _Section

    enabled: bool = False
    chance: float = Field(default=0.15, ge=0, le=1)
    reserved_slots: int = Field(default=1, ge=0, le=10)
    min_importance: float = Field(default=6.0, ge=0, le=10)


class InjectorHeadings(BaseModel):
    """Headings and fixed lines of the injection block; the defaults are the reference's text (§4.1).

    ``character_pov_owner`` is formatted with ``{owner}`` (the owner's label).
    """

    model_config = _Section

    summary: str = Field(default="[Summary - Active Frontier]", max_length=500)
    character_pov: str = Field(default="[Memory - Character POV]", max_length=500)
    character_pov_owner: str = Field(
        default="[Memory - Character POV: {owner}]",
        max_length=500,
        # The schema states the plain form of _has_owner_slot's rule (``{owner}`` at least once, braces doubled).
        json_schema_extra={"pattern": r"^(?:[^{}]|\{\{|\}\})*\{owner\}(?:[^{}]|\{\{|\}\}|\{owner\})*$"},
    )
    user_pov: str = Field(default="[Memory - User POV / Not Character Facts]", max_length=500)
    user_pov_note: str = Field(
        default="这些是用户/玩家侧主观记忆，不等于角色已知事实；只能作为关系、承诺、情绪和长期互动背景参考。",
        max_length=2000,
    )
    objective_current_region: str = Field(default="[Memory - Objective / Current Region]", max_length=500)
    objective_global: str = Field(default="[Memory - Objective / Global]", max_length=500)
    core: str = Field(default="[Memory - Core]", max_length=500)
    recalled: str = Field(default="[Memory - Recalled]", max_length=500)
    group_state: str = Field(default="## 当前状态记忆", max_length=500)
    group_episodic: str = Field(default="## 情景事件记忆", max_length=500)
    group_reflective: str = Field(default="## 反思与长期锚点", max_length=500)
    group_rule: str = Field(default="## 规则与约束", max_length=500)
    group_other: str = Field(default="## 其他关联记忆", max_length=500)

    @field_validator("character_pov_owner")
    @classmethod
    def _has_owner_slot(cls, value: str) -> str:
        if "{owner}" not in value:
            raise ValueError("must contain '{owner}'")
        try:
            value.format(owner="x")
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(f"not a valid format string: {exc}") from None
        return value


class InjectorSettings(BaseModel):
    """Injection block (reference §4, recall-spec departure 5)."""

    model_config = _Section

    headings: InjectorHeadings = Field(default_factory=InjectorHeadings)
    inject_user_pov_memory: bool = True
    inject_objective_global_memory: bool = True
    inject_story_time_label: bool = True
    objective_global_cap: int = Field(default=6, ge=0, le=200)
    core_cap: int = Field(default=24, ge=0, le=1000)
    max_chars: int = Field(default=16_000, ge=200, le=1_000_000)
    max_row_chars: int = Field(default=3_000, ge=50, le=100_000)
    cell_chars: int = Field(default=200, ge=10, le=10_000)
    #: Language of the block's fixed labels (floor marker, POV owner prefixes, unnamed owners, legacy group
    #: headings and user-POV note at their defaults): "zh" the reference's Chinese, "en" English, "auto" the
    #: language of the memories printed (injector.labels).
    language: Literal["auto", "en", "zh"] = "auto"


class ControllerSettings(BaseModel):
    """Recall controller (reference §2.2, §5.2; recall-spec departures 1 and 7)."""

    model_config = _Section

    #: Gate 3 of reference §2.2 (``enabled`` / ``recallEnabled``): False → every recall is skipped.
    enabled: bool = True
    #: ``recallLlmContextMessages`` (reference §5.2: default 4, clamped to 0–20).
    recent_context_messages: int = Field(default=4, ge=0, le=20)
    #: Departure 7: re-recall instead of replaying a record whose graph version is no longer current.
    replay_stale_records: bool = False


class ServiceSettings(BaseModel):
    """HTTP service (``memory-recall serve``): bind address, bearer token, Host check, body and time limits, CORS
    origins, public docs.

    Binding a non-loopback ``host`` requires a token: ``token`` (env ``MEMORY_RECALL_SERVICE__TOKEN``) or
    ``token_file``, a file holding it (``--token-file``; not both); the service refuses to start without one.
    ``allowed_hosts``: host names or IP addresses (no port) accepted in the ``Host`` header besides ``127.0.0.1``,
    ``localhost``, ``[::1]`` and ``host``; ``"*"`` accepts any (see :class:`memory_recall.service.auth.HostCheck`).
    ``cors_origins``: the chat host's page origins (SillyTavern runs in the browser on its own port) allowed to
    call the service. ``public_docs``: ``/docs``, ``/redoc`` and ``/openapi.json`` without the token.
    """

    model_config = _Section

    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: int = Field(default=8765, ge=0, le=65535)
    token: str = Field(default="", max_length=4096)
    #: A file holding the token (one line; ``~`` expanded), so it stays out of ``ps`` and the shell history.
    token_file: str = Field(default="", max_length=4096)
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: Body limit of a whole-chat sync (``POST /v1/chats/{chat_id}/sync``): a long chat in one request.
    max_sync_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: Seconds a client has to send a request head (request line and headers), from the connection opening or
    #: the first byte after the previous response; then the connection is closed.
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    #: Seconds a client has to send a whole request body once its head arrived (else 408 and the connection is
    #: closed), and to finish sending a body the service answered early (401, 413, 421) before it closes.
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: The same for a whole-chat sync, up to ``max_sync_body_bytes``: 64 MiB in 120 s is 4.5 Mbit/s.
    sync_body_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    #: Seconds an idle keep-alive connection stays open after a response (uvicorn's ``timeout_keep_alive``,
    #: whole seconds).
    idle_timeout_s: int = Field(default=5, ge=1, le=3600)
    cors_origins: tuple[str, ...] = ("http://127.0.0.1:8000", "http://localhost:8000")
    #: ``/docs``, ``/docs/assets/*``, ``/redoc`` and ``/openapi.json`` without the token (the API schema is no
    #: secret; False closes them behind the token like every other route).
    public_docs: bool = True
    #: Seconds the shutdown waits for in-flight writes and embedding before closing the store.
    shutdown_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: glibc malloc arenas the service process may use (``mallopt(M_ARENA_MAX)`` at start; 0 keeps glibc's
    #: default of eight per core; ``MALLOC_ARENA_MAX`` in the environment wins). Each arena keeps its own free
    #: space, and the worker threads take turns under the GIL: with glibc's default the service's memory crept up
    #: for minutes under writes (:mod:`memory_recall.heap`).
    malloc_arenas: int = Field(default=2, ge=0, le=1024)
    #: Seconds between two returns of the heaps' free pages to the system while requests come
    #: (:class:`~memory_recall.heap.HeapTrimmer`, glibc's ``malloc_trim``; 0 never). Without it the RSS followed
    #: the heaps' high-water mark, which kept rising for minutes under load with the memory in use flat.
    heap_trim_s: float = Field(default=5.0, ge=0, le=3600)

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for raw in value:
            name = raw.strip().lower()
            bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
            if not name or any(c in name for c in "/@ \t"):
                raise ValueError(f"a host name or IP address without scheme, port or path; got {raw!r}")
            if ":" in bare or bare != name:
                try:
                    ipaddress.IPv6Address(bare)
                except ValueError:
                    raise ValueError(f"a host name or IP address without a port; got {raw!r}") from None
            names.append(name)
        return tuple(names)


_PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "app": {},
    # retrieve() fallbacks of the reference (§5.1 "retrieve fallback" column).
    "fallback": {
        "selection": {"max_recall_nodes": 8},
        "visibility": {"enabled": False},
        "cross_recall": {"enabled": False},
    },
    # Long chat transcripts without extracted memories (every turn a ``message`` node, speakers as hubs): tuned on
    # the LoCoMo dev split (issue 7; figures in the eval report). Vector and BM25 evidence carry the score
    # (the e5 cosines of turns differ by a few hundredths, so the vector weight is 10× the reference's), the
    # field match is halved (a speaker's name matches every turn they spoke), speaker hubs are damped,
    # neighbouring turns share more energy, and the time decay is off (questions ask about any session). A turn
    # inherits 0.8 of its neighbours' vector/BM25 evidence (an answer follows the question it replies to; LoCoMo
    # dev R@10 0.641 → 0.719 with the lexical weight 3 → 5), rank fusion (scoring.fusion "rrf") measured worse.
    # BM25 terms are Porter-stemmed (a question says "paint", the turn "painting"): full dev split through the
    # controller with context, R@10 0.723 → 0.756 (R@5 0.644 → 0.658, R@25 0.808 → 0.827, nDCG@10 0.548 → 0.577);
    # the S-stemmer (plurals only) gave 0.731. With stemmed BM25 the reference field match only adds noise (it
    # matches speaker names and unstemmed words): field_match_weight 0.5 → 0 gave R@10 0.756 → 0.761 (R@5 0.663,
    # R@25 0.837, nDCG@10 0.579, MRR 0.546; 0.25 gave 0.761 with R@5 0.661); same run: rrf baseline 0.616, and
    # without context 0.758. Snowball English ("english") instead of Porter: R@10 0.762, R@5 0.664, R@25 0.835,
    # level with Porter, so Porter stays. Measured and not kept (R@10 with the stemmer, field match 0.5 unless said):
    # lexical_weight 7 0.757, bm25_top_k 200 0.755, neighbour_carry 0.9 0.751, vector_weight 4 0.758 (R@5 0.653;
    # with field match 0: 0.766 but R@5 0.661, nDCG@10 0.577, MRR 0.541, all lower), diversity off 0.757, context
    # blend weights halved 0.755, dropping question words ("kind", "mention", "how long" …) from the BM25 query
    # 0.745.
    # Until issue 17 this profile set these values store-wide ("scoring": vector weight 3, time decay off,
    # neighbour carry 0.8; "lexical": lexical weight 5, field match 0, BM25 pool 100, Porter). The scoring values
    # are now the ``scoring.message_*`` defaults and apply to message nodes only; "transcript" is an alias of
    # "default" (old configs keep working) and the figures above are the history of those values.
    # Issue 17, full dev split (R@5 / R@10 / R@25): the old store-wide profile 0.667 / 0.766 / 0.853; per node kind
    # (anchors back on) 0.669 / 0.767 / 0.854; + time cue 0.683 / 0.771 / 0.856 (temporal R@10 0.858 → 0.881);
    # + speaker cue 1.3 0.685 / 0.785 / 0.860 (multi-hop 0.436 → 0.490, open-domain 0.369 → 0.456, adversarial
    # 0.859 → 0.825: those questions name the other speaker); hub degree over message neighbours only: level;
    # temporal links 0.5 → 0.2 (the reference) 0.688 / 0.788 / 0.862, the committed profile.
    # Measured and not kept: speaker cue 1.8 R@10 0.751, 1.2 0.784 (R@5 0.690); time boosts 1.6 0.784; query
    # expansion from the first-pass hits (lexical.feedback_docs 3) 0.772 with R@25 0.851 (without the speaker cue).
    "transcript": {
        "scoring": {"message_weights": True, "time_cue": True, "speaker_cue": True},
        "lexical": {"bm25_top_k": 100, "stem": "porter", "turn_context_previous": 0.5, "turn_context_next": 0.2},
        # Turn context (pipeline.turn_context, issue 17): a turn is matched with the turns around it, in both
        # channels, and the scoring stage's carry is lowered to match (scoring.message_neighbour_carry 0.8 → 0.7):
        # full dev split R@5 / R@10 / R@25 0.686 / 0.785 / 0.864 → 0.710 / 0.818 / 0.882 (ablation in the eval docs).
        "vector": {"turn_context_previous": 0.5, "turn_context_next": 0.2},
        # Diffusion is on and entity anchors are off. Before the stemmer diffusion cost recall (off: R@10 0.719 →
        # 0.723); with the stemmer it adds it: full dev split with context, diffusion off → on R@10 0.761 → 0.765,
        # R@25 0.837 → 0.854, R@5 0.663 → 0.666 (nDCG@10 0.579 → 0.576, MRR 0.546 → 0.541). Anchors seed it from
        # names, which in a transcript are mostly the two speakers: without them R@10 0.766, R@5 0.667, R@25 0.853,
        # nDCG@10 0.577, MRR 0.543 (cross-recall, co-occurrence and residual recall changed nothing either way).
        # Entity anchors stay on (the reference; an imported graph's characters and places are real anchors): on
        # transcripts they measured level (without them R@10 0.766 against 0.765).
        # The temporal link strength is the reference's 0.2 again (issue 17): 0.5 cost R@10 0.788 → 0.785 and
        # a required memory of a fixture chat (the links of extracted events).
        "diffusion": {"enabled": True, "hub_degree_threshold": 8, "hub_degree_counts": "message"},
    },
}
# The profile of load_settings without one: message nodes as transcripts, extracted memories as the reference.
_PROFILES = {"default": _PROFILES["transcript"], **_PROFILES}


class RecallSettings(BaseSettings):
    """Every setting of memory-recall, one frozen section per concern."""

    model_config = SettingsConfigDict(
        env_prefix="MEMORY_RECALL_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    profile: Literal["default", "app", "fallback", "transcript"] = "app"
    store: StoreSettings = Field(default_factory=StoreSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    visibility: VisibilitySettings = Field(default_factory=VisibilitySettings)
    query_plan: QueryPlanSettings = Field(default_factory=QueryPlanSettings)
    vector: VectorSettings = Field(default_factory=VectorSettings)
    lexical: LexicalSettings = Field(default_factory=LexicalSettings)
    anchors: AnchorSettings = Field(default_factory=AnchorSettings)
    diffusion: DiffusionSettings = Field(default_factory=DiffusionSettings)
    cross_recall: CrossRecallSettings = Field(default_factory=CrossRecallSettings)
    cooccurrence: CooccurrenceSettings = Field(default_factory=CooccurrenceSettings)
    residual: ResidualSettings = Field(default_factory=ResidualSettings)
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)
    diversity: DiversitySettings = Field(default_factory=DiversitySettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    owners: OwnerSettings = Field(default_factory=OwnerSettings)
    reinforcement: ReinforcementSettings = Field(default_factory=ReinforcementSettings)
    probabilistic: ProbabilisticSettings = Field(default_factory=ProbabilisticSettings)
    injector: InjectorSettings = Field(default_factory=InjectorSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit values beat the environment: load_settings passes the file and the environment already merged
        # (the environment over the file) with its overrides on top, and with_overrides passes whole settings.
        return (init_settings, env_settings)

    def with_overrides(self, overrides: dict[str, Any] | None, *, strict: bool = False) -> RecallSettings:
        """A validated copy with ``{"section": {"key": value}}`` overrides applied; raises ConfigError.

        ``strict``: the overrides are JSON values taken as they are (a request body's): ``"3"`` or ``true`` is
        no number, a number no string; without it pydantic's lax conversions apply (TOML, environment).
        """
        if not overrides:
            return self
        if strict:
            _check_strict(self, overrides)
        merged = _deep_merge(self.model_dump(), overrides)
        return _validate(merged, "overrides")


def _check_strict(settings: RecallSettings, overrides: dict[str, Any]) -> None:
    """Validate each overridden section as JSON in strict mode (BaseSettings itself ignores ``strict``)."""
    base = settings.model_dump(mode="json")
    for name, value in overrides.items():
        field = RecallSettings.model_fields.get(name)
        section = field.annotation if field is not None else None
        if not (isinstance(section, type) and issubclass(section, BaseModel)) or not isinstance(value, dict):
            continue  # not a section: the lax validation below names the problem
        try:
            # JSON mode: an array is a tuple there, as in a request body; strict: no other conversion.
            section.model_validate_json(json.dumps(_deep_merge(base[name], value)), strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in (name, *err.get("loc", ())))
            raise ConfigError(str(err.get("msg", "invalid value")), field=f"overrides: {loc}") from None


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _validate(data: dict[str, Any], origin: str) -> RecallSettings:
    try:
        return RecallSettings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise ConfigError(str(err.get("msg", "invalid value")), field=f"{origin}: {loc}" if loc else origin) from None


def load_settings(
    toml_path: str | Path | None = None,
    *,
    profile: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> RecallSettings:
    """Settings from profile defaults, an optional TOML file (``MEMORY_RECALL_CONFIG`` when not given), the
    environment, then ``overrides``, each later one winning key by key (a variable beats the file's value of its
    key, and only that key). The profile: ``profile``, else ``MEMORY_RECALL_PROFILE``, else the file's
    ``profile``, else ``"default"``. Raises :class:`ConfigError` naming the offending key, or the environment
    variable when the value came from one (``MEMORY_RECALL_DIFFUSION__DECAY: Input should be …``).

    Every ``MEMORY_RECALL_*`` variable must be known: a setting (``MEMORY_RECALL_<SECTION>__<KEY>`` or a whole
    section as JSON, ``MEMORY_RECALL_<SECTION>``), one read outside the model (``MEMORY_RECALL_DATA_DIR``,
    ``MEMORY_RECALL_CONFIG``, the API key variables named by ``embedding.api_key_env`` / ``llm.api_key_env``), or
    one of the test suite (``MEMORY_RECALL_E2E*``, ``MEMORY_RECALL_TEST*``, ``MEMORY_RECALL_URL``,
    ``MEMORY_RECALL_FUZZ_EXAMPLES``); a misspelt one is a ConfigError naming it, not silently ignored.
    """
    path = toml_path or os.environ.get("MEMORY_RECALL_CONFIG") or None
    file_data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            file_data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError("file not found", field=str(p)) from None
        except IsADirectoryError:
            raise ConfigError("is a directory, not a TOML file", field=str(p)) from None
        except OSError as exc:
            raise ConfigError(f"cannot read file: {exc.strerror or exc}", field=str(p)) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", field=str(p)) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {exc}", field=str(p)) from None
    env = _environment()
    _check_environment(env, _deep_merge(file_data, overrides or {}))
    try:
        # The environment's values as pydantic-settings reads them (nested by "__", complex values as JSON).
        env_values = EnvSettingsSource(RecallSettings)()
    except SettingsError as exc:  # _check_environment has named every non-JSON complex value already
        raise ConfigError(str(exc), field="environment") from None
    env_values.pop("profile", None)
    explicit = _deep_merge(_deep_merge(file_data, env_values), overrides or {})
    env_profile = env.get("MEMORY_RECALL_PROFILE")
    chosen = profile or (env_profile[1] if env_profile else "") or file_data.get("profile") or "default"
    if not isinstance(chosen, str) or chosen not in _PROFILES:
        origin = env_profile[0] if env_profile and not profile else "profile"
        raise ConfigError(f"unknown profile {chosen!r}; expected one of {', '.join(_PROFILES)}", field=origin)
    # Profile defaults go under the environment: only keys the user set (TOML, overrides) are passed explicitly.
    explicit["profile"] = chosen
    try:
        from_env = RecallSettings(**explicit)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err.get("loc", ()))
        dotted = ".".join(loc)
        variable = _variable_of(loc, overrides or {}, env)
        if variable is not None:
            given = err.get("input")
            reason = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
            if err.get("type") == "extra_forbidden":
                reason = "unknown setting"
            raise ConfigError(f"{reason} (setting {dotted}; got {given!r})", field=variable) from None
        raise ConfigError(str(err.get("msg", "invalid value")), field=dotted or "settings") from None
    except SettingsError as exc:  # a complex value (list, section) that is not JSON: _check_environment names it
        raise ConfigError(str(exc), field="environment") from None
    # Apply profile values only where neither the environment nor explicit values set the key.
    profile_values = _PROFILES[chosen]
    if not profile_values:
        return from_env
    merged = from_env.model_dump()
    for section, values in profile_values.items():
        for key, value in values.items():
            if _explicitly_set(explicit, section, key):  # explicit holds the environment's values too
                continue
            merged[section][key] = value
    return _validate(merged, "settings")


def _explicitly_set(explicit: dict[str, Any], section: str, key: str) -> bool:
    sec = explicit.get(section)
    return isinstance(sec, dict) and key in sec


_ENV_PREFIX = "MEMORY_RECALL_"
#: ``MEMORY_RECALL_*`` variables read outside the settings model: the data directory and the settings file
#: (README "Using it"), and the test suite's (tests/clients, tests/service/test_service_fuzz.py, tests/e2e, .ci).
_ENV_OUTSIDE_MODEL = frozenset({
    "MEMORY_RECALL_DATA_DIR", "MEMORY_RECALL_CONFIG", "MEMORY_RECALL_URL", "MEMORY_RECALL_FUZZ_EXAMPLES",
})
_ENV_TEST_PREFIXES = ("MEMORY_RECALL_E2E", "MEMORY_RECALL_TEST")


def _environment() -> dict[str, tuple[str, str]]:
    """``MEMORY_RECALL_*`` variables by upper-case name → (name as set, value); pydantic-settings reads them
    case-insensitively, so ``memory_recall_diffusion__decay`` counts too."""
    return {k.upper(): (k, v) for k, v in os.environ.items() if k.upper().startswith(_ENV_PREFIX)}


def _setting_variables() -> dict[str, tuple[str, ...]]:
    """Every variable name the settings model reads (upper case) → its settings path: each field, and each
    section (nested models included) as a whole."""
    names: dict[str, tuple[str, ...]] = {}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            here = (*path, name)
            names[_ENV_PREFIX + "__".join(here).upper()] = here
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                walk(info.annotation, here)

    walk(RecallSettings, ())
    return names


def _key_variables(explicit: dict[str, Any], env: dict[str, tuple[str, str]]) -> set[str]:
    """The API key variables the settings name (``embedding.api_key_env``, ``llm.api_key_env``), upper case."""
    out: set[str] = set()
    for section, model in (("embedding", EmbeddingSettings), ("llm", LLMSettings)):
        value: Any = model.model_fields["api_key_env"].default
        whole = env.get(f"{_ENV_PREFIX}{section.upper()}")
        if whole is not None:
            try:
                parsed = json.loads(whole[1])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and isinstance(parsed.get("api_key_env"), str):
                value = parsed["api_key_env"]
        single = env.get(f"{_ENV_PREFIX}{section.upper()}__API_KEY_ENV")
        if single is not None:
            value = single[1]
        given = explicit.get(section)
        if isinstance(given, dict) and isinstance(given.get("api_key_env"), str):
            value = given["api_key_env"]
        out.add(str(value).upper())
    return out


def _is_complex(annotation: Any) -> bool:
    """Whether pydantic-settings reads the field's variable as JSON (models and collections)."""
    from typing import get_origin

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return get_origin(annotation) in (tuple, list, set, frozenset, dict) or annotation in (tuple, list, set, dict)


def _check_environment(env: dict[str, tuple[str, str]], explicit: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming the first unknown ``MEMORY_RECALL_*`` variable (with the closest known
    name), or the first variable of a list or section value that is not JSON."""
    import difflib

    settings_vars = _setting_variables()
    known = set(settings_vars) | _ENV_OUTSIDE_MODEL | _key_variables(explicit, env)
    for upper in sorted(env):
        name, value = env[upper]
        if upper in known or upper.startswith(_ENV_TEST_PREFIXES):
            continue
        # Compared without the shared prefix, which would make every name look close.
        rest = {k[len(_ENV_PREFIX):]: k for k in known if k.startswith(_ENV_PREFIX)}
        close = difflib.get_close_matches(upper[len(_ENV_PREFIX):], sorted(rest), n=1, cutoff=0.85)
        hint = f"; did you mean {rest[close[0]]}?" if close else " (no such settings section or key)"
        raise ConfigError(f"unknown setting{hint}", field=name)
    for upper in sorted(env):
        path = settings_vars.get(upper)
        if path is None:
            continue
        model: Any = RecallSettings
        for part in path[:-1]:
            model = model.model_fields[part].annotation
        annotation = model.model_fields[path[-1]].annotation
        name, value = env[upper]
        if _is_complex(annotation):
            try:
                json.loads(value)
            except ValueError:
                what = "an object" if isinstance(annotation, type) and issubclass(annotation, BaseModel) else "a list"
                raise ConfigError(
                    f"must be JSON ({what}, e.g. {_json_example(annotation)}); got {value!r}", field=name
                ) from None


def _json_example(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "'{\"key\": 1}'"
    return "'[\"a\", \"b\"]'"


def _variable_of(loc: tuple[str, ...], overrides: dict[str, Any], env: dict[str, tuple[str, str]]) -> str | None:
    """The environment variable (as set) the value at settings path ``loc`` came from; ``None`` when it came from
    the overrides (they beat the environment) or from no variable (the TOML file, which the environment beats)."""
    node: Any = overrides
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return None  # the whole path is set explicitly
    for depth in range(len(loc), 0, -1):
        found = env.get(_ENV_PREFIX + "__".join(loc[:depth]).upper())
        if found is not None:
            return found[0]
    return None
