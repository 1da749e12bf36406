"""``retrieve()``: run the recall pipeline on one graph snapshot and build the :class:`RecallResult`.

Usage::

    result = retrieve(snapshot, RecallQuery(user_message="Where is the key?", now_ms=now, seed=seed),
                      settings, Providers(embedder=embedder, llm=llm, lexical_index=bm25))
    text = json_dumps(result)            # canonical JSON, byte-identical for identical inputs

Stage order (reference §3, with this project's BM25 and dedup stages inserted): context, visibility,
query_plan, vector_prefilter, lexical, anchors, diffusion, residual, cross_recall, cooccurrence, scoring, dedup,
diversity, rerank, owners, probabilistic, reinforcement (:data:`STAGE_ORDER`). Each stage gets its own settings
section(s) and the providers it needs (:func:`build_stages`); its trace is appended to ``state.traces`` and its
elapsed time to ``timings``.

Empty short-circuit (reference §3.4)
    When the visibility stage leaves no active node, the remaining stages are not run (each gets a skipped
    trace ``no-active-nodes``); the selection is empty and ``llm`` is ``{"status": "skipped"}`` (``"disabled"``
    when the rerank is switched off) with reason ``当前没有可参与召回的活跃节点``. Core nodes are still computed
    by the result builder.
Degradation policy (recall-spec departure 3, architecture "Failure policy"), applied here in one place
    * The vector stage turns an embedding failure into ``retrieval_status="lexical_fallback"`` itself; the
      rerank stage turns an LLM failure into its score-order fallback itself. Both raise
      :class:`~memory_recall.errors.StrictModeViolation` in strict mode, which propagates.
    * Any :class:`~memory_recall.errors.EmbeddingUnavailable` or :class:`~memory_recall.errors.LLMUnavailable`
      that still escapes a stage is caught by :func:`run_pipeline`: strict → ``StrictModeViolation``; otherwise
      the stage is recorded as skipped (``embedding-unavailable`` / ``llm-unavailable``) with the failure
      category, its input state is kept, an escaped embedding failure of the vector stage sets
      ``lexical_fallback``, an escaped LLM failure selects the pool head with ``llm.status = "fallback"``.
      Nothing else is caught.
Ablation (for the evaluation)
    ``ablate`` names stages to switch off. A stage with an ``enabled`` switch runs with it off (its own disabled
    path, so later stages see what they would see with the feature off — e.g. ``rerank`` off also makes the
    candidate pool ``topK``): visibility, vector_prefilter, lexical (BM25), anchors, diffusion, residual,
    cross_recall, cooccurrence, diversity, rerank, probabilistic, reinforcement; owners switches scene
    reconstruction off and keeps owner finalisation. The others (context, query_plan, scoring, dedup) are passed
    through unchanged with a skipped trace ``ablated``. Unknown names raise
    :class:`~memory_recall.errors.InputError`.
Determinism
    Given the same snapshot, query (``now_ms``, ``seed``), settings and deterministic providers, two calls give
    equal results except elapsed times; :func:`json_dumps` zeroes those by default.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from memory_recall.errors import EmbeddingUnavailable, InputError, LLMUnavailable, StrictModeViolation
from memory_recall.pipeline._graph_cache import prepare
from memory_recall.pipeline.anchors import AnchorStage
from memory_recall.pipeline.context import ContextStage
from memory_recall.pipeline.cooccurrence import CooccurrenceStage
from memory_recall.pipeline.cross_recall import CrossRecallStage
from memory_recall.pipeline.dedup import DedupStage
from memory_recall.pipeline.diffusion import DiffusionStage
from memory_recall.pipeline.diversity import DiversityStage
from memory_recall.pipeline.lexical import LexicalStage
from memory_recall.pipeline.llm_rerank import FALLBACK_REASONS, RerankStage
from memory_recall.pipeline.owners import OwnerStage
from memory_recall.pipeline.probabilistic import ProbabilisticStage
from memory_recall.pipeline.query_plan import QueryPlanStage
from memory_recall.pipeline.reinforcement import ReinforcementStage
from memory_recall.pipeline.residual import ResidualStage
from memory_recall.pipeline.result import RecallResult, build_result, json_dumps
from memory_recall.pipeline.scoring import ScoringStage
from memory_recall.pipeline.state import (
    Providers,
    RecallQuery,
    RecallState,
    StageResult,
    StageTrace,
    VectorStatus,
)
from memory_recall.pipeline.vector_prefilter import VectorPrefilterStage
from memory_recall.pipeline.visibility import VisibilityStage
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot

__all__ = [
    "ABLATION_OVERRIDES",
    "EMPTY_REASON",
    "STAGE_ORDER",
    "PipelineRun",
    "Stage",
    "build_stages",
    "json_dumps",
    "prepare_snapshot",
    "retrieve",
    "run_pipeline",
]

STAGE_ORDER: tuple[str, ...] = (
    "context", "visibility", "query_plan", "vector_prefilter", "lexical", "anchors", "diffusion", "residual",
    "cross_recall", "cooccurrence", "scoring", "dedup", "diversity", "rerank", "owners", "probabilistic",
    "reinforcement",
)

#: Settings overrides that switch a stage off for an ablation (stages not listed are passed through).
ABLATION_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "visibility": {"visibility": {"enabled": False}},
    "vector_prefilter": {"vector": {"enabled": False}},
    "lexical": {"lexical": {"enable_bm25": False}},
    "anchors": {"anchors": {"enabled": False}},
    "diffusion": {"diffusion": {"enabled": False}},
    "residual": {"residual": {"enabled": False}},
    "cross_recall": {"cross_recall": {"enabled": False}},
    "cooccurrence": {"cooccurrence": {"enabled": False}},
    "diversity": {"diversity": {"enabled": False}},
    "rerank": {"rerank": {"enabled": False}},
    "owners": {"owners": {"enable_scene_reconstruction": False}},
    "probabilistic": {"probabilistic": {"enabled": False}},
    "reinforcement": {"reinforcement": {"enabled": False}},
}

EMPTY_REASON = "当前没有可参与召回的活跃节点"


class Stage(Protocol):
    """What every pipeline stage provides (see :mod:`memory_recall.pipeline.state`)."""

    name: str

    def run(self, state: RecallState) -> StageResult: ...


def build_stages(settings: RecallSettings, providers: Providers) -> list[tuple[str, Stage]]:
    """The stages of :data:`STAGE_ORDER`, each given its settings section(s) and the providers it needs."""
    s = settings
    stages: list[tuple[str, Stage]] = [
        ("context", ContextStage(s.context)),
        ("visibility", VisibilityStage(s.visibility)),
        ("query_plan", QueryPlanStage(s.query_plan)),
        ("vector_prefilter", VectorPrefilterStage(s.vector, s.selection, providers)),
        ("lexical", LexicalStage(s.lexical, providers)),
        ("anchors", AnchorStage(s.anchors)),
        ("diffusion", DiffusionStage(s.diffusion, s.anchors)),
        ("residual", ResidualStage(s.residual, providers)),
        ("cross_recall", CrossRecallStage(s.cross_recall, s.diffusion, s.anchors, s.selection)),
        ("cooccurrence", CooccurrenceStage(s.cooccurrence)),
        ("scoring", ScoringStage(s.scoring, s.lexical, s.context)),
        ("dedup", DedupStage(s.selection, s.diversity)),
        ("diversity", DiversityStage(s.diversity, s.selection, s.rerank, llm_configured=providers.llm is not None)),
        ("rerank", RerankStage(s.rerank, s.selection, providers, s.llm)),
        ("owners", OwnerStage(s.owners, s.selection, s.context, s.scoring)),
        ("probabilistic", ProbabilisticStage(s.probabilistic, s.selection, s.context, s.scoring)),
        ("reinforcement", ReinforcementStage(s.reinforcement)),
    ]
    return stages


@dataclass(frozen=True)
class PipelineRun:
    """The final state of a pipeline run, the settings it ran with (ablations applied) and stage timings."""

    state: RecallState
    settings: RecallSettings
    timings: dict[str, float]


def _ablated_settings(settings: RecallSettings, ablate: frozenset[str]) -> RecallSettings:
    unknown = sorted(set(ablate) - set(STAGE_ORDER))
    if unknown:
        raise InputError("ablate", f"unknown stage(s) {', '.join(unknown)}; expected names from {STAGE_ORDER}")
    overrides: dict[str, dict[str, Any]] = {}
    for name in sorted(ablate):
        for section, values in ABLATION_OVERRIDES.get(name, {}).items():
            overrides.setdefault(section, {}).update(values)
    return settings.with_overrides(overrides) if overrides else settings


def _append(state: RecallState, trace: StageTrace) -> RecallState:
    return state.evolve(traces=(*state.traces, trace))


def _degraded(
    name: str, state: RecallState, exc: EmbeddingUnavailable | LLMUnavailable, settings: RecallSettings
) -> StageResult:
    """The stage's input state, marked as degraded (see the module docstring)."""
    if isinstance(exc, EmbeddingUnavailable):
        reason = "embedding-unavailable"
        new = state.evolve(skip_reasons=state.with_skip(reason))
        if name == "vector_prefilter":
            new = new.evolve(vector_status=VectorStatus("lexical_fallback", False, exc.category, exc.detail))
    else:
        reason = "llm-unavailable"
        new = state.evolve(skip_reasons=state.with_skip(reason))
        if name == "rerank":
            pool = list(dict.fromkeys(state.pool))
            text = FALLBACK_REASONS.get(exc.category, "LLM 精排失败，已回退到评分排序")
            new = new.evolve(
                selection=tuple(pool[: settings.selection.max_recall_nodes]),
                llm={
                    "enabled": True, "status": "fallback", "reason": text, "fallbackReason": text,
                    "fallbackType": exc.category, "failureCategory": exc.category, "failureDetail": exc.detail,
                    "candidatePool": len(pool), "activeOwnerKeys": [], "activeOwnerScores": [],
                },
            )
    trace = StageTrace(
        name=name, skipped=True, skip_reason=reason, count_in=0, count_out=0,
        notes={"failure_category": exc.category, "detail": exc.detail},
    )
    return StageResult(new, trace)


def _short_circuit(state: RecallState, settings: RecallSettings, remaining: Iterable[str]) -> RecallState:
    """Reference §3.4: no active node → no selection, llm skipped/disabled, skipped traces for the rest."""
    enabled = bool(settings.rerank.enabled)
    llm = {
        "enabled": enabled,
        "status": "skipped" if enabled else "disabled",
        "reason": EMPTY_REASON,
        "fallbackReason": "",
        "fallbackType": "",
        "selectionProtocol": "",
        "candidatePool": 0,
    }
    state = state.evolve(selection=(), pool=(), llm=llm, skip_reasons=state.with_skip("no-active-nodes"))
    for name in remaining:
        state = _append(state, StageTrace(name=name, skipped=True, skip_reason="no-active-nodes"))
    return state


def run_pipeline(
    snapshot: GraphSnapshot,
    query: RecallQuery,
    settings: RecallSettings,
    providers: Providers | None = None,
    *,
    ablate: Iterable[str] = frozenset(),
    stop_before: str | None = None,
) -> PipelineRun:
    """Run the stages in order and return the final state (see the module docstring). ``stop_before`` ends the
    run before the named stage (used by the contract tests to get each stage's real input state)."""
    providers = providers or Providers()
    ablated = frozenset(ablate)
    effective = _ablated_settings(settings, ablated)
    state = RecallState(snapshot=snapshot, query=query)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    stages = build_stages(effective, providers)
    for pos, (name, stage) in enumerate(stages):
        if name == stop_before:
            break
        if name in ablated and name not in ABLATION_OVERRIDES:
            result = StageResult(state, StageTrace(name=name, skipped=True, skip_reason="ablated"))
        else:
            try:
                result = stage.run(state)
            except StrictModeViolation:
                raise
            except (EmbeddingUnavailable, LLMUnavailable) as exc:
                if providers.strict:
                    raise StrictModeViolation(exc) from exc
                result = _degraded(name, state, exc, effective)
            if name in ablated:
                notes = {**result.trace.notes, "ablated": True}
                result = StageResult(result.state, dataclasses.replace(result.trace, notes=notes))
        state = _append(result.state, result.trace)
        timings[name] = result.trace.elapsed_ms
        if name == "visibility" and not bool(state.active.any()):
            rest = [n for n, _ in stages[pos + 1:]]
            if stop_before in rest:
                rest = rest[: rest.index(stop_before)]
            state = _short_circuit(state, effective, rest)
            break
    timings["total"] = (time.perf_counter() - start) * 1000.0
    return PipelineRun(state=state, settings=effective, timings=timings)


def retrieve(
    snapshot: GraphSnapshot,
    query: RecallQuery,
    settings: RecallSettings,
    providers: Providers | None = None,
    *,
    ablate: Iterable[str] = frozenset(),
) -> RecallResult:
    """Run the recall pipeline and build its :class:`RecallResult` (see the module docstring).

    Raises :class:`~memory_recall.errors.StrictModeViolation` when a provider fails in strict mode and
    :class:`~memory_recall.errors.InputError` for an unknown ablation name; nothing else is caught.
    """
    run = run_pipeline(snapshot, query, settings, providers, ablate=ablate)
    return build_result(run.state, run.settings, timings=run.timings)


def prepare_snapshot(snapshot: GraphSnapshot) -> list[Hashable]:
    """After a write: derive the stages' per-structure values for ``snapshot`` from those of the structure it was
    updated from (:func:`memory_recall.pipeline._graph_cache.prepare`), so the recall after the write does not.
    Never builds a value; returns the cache keys derived."""
    return prepare(snapshot)
