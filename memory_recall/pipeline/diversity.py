"""Diversity stage: the candidate pool and greedy DPP (reference §3.14 ``resolveCandidatePool``).

Runs after scoring (and dedup), before the LLM rerank.

Reads
    ``state.scored`` (ranking order: ``index``, ``final_score``), ``snapshot.embeddings`` / ``has_vector``.
Writes
    * ``state.pool``: node indices of the candidate pool — in **DPP pick order** when DPP was applied, else
      the first ``target`` scored rows in ranking order.
    * meta ``candidatePoolBeforeDpp``, ``candidatePoolAfterDpp``, ``diversityApplied`` (reference §3.21), plus
      ``diversityTarget`` (this project's key).
    * ``state.skip_reasons``: the reference's codes when DPP was not applied.
Pool
    ``target`` = the LLM pool ``max(max_recall_nodes, llm_candidate_pool)`` when the rerank is enabled **and**
    an LLM is configured (``llm_configured``), else ``top_k``. DPP off → the first ``target`` rows. DPP on →
    ``pool`` = the first ``min(rows, target × max(1, candidate_multiplier))`` rows
    (``candidatePoolBeforeDpp``), then ``kernels.diversity.dpp_greedy_select(embeddings, final_score,
    k=target, quality_weight)``: ``len(pool) ≤ target`` → ``candidate-pool-too-small``; a pool node without an
    embedding → ``candidate-embeddings-missing``; a selection shorter than ``target`` →
    ``dpp-selection-incomplete``; in those cases the pool is the first ``target`` rows. Applied →
    ``candidatePoolAfterDpp = target``.
Quality
    As the reference, DPP quality is ``final_score`` (the hybrid score × time decay), not ``weighted_score``:
    scope, knowledge, owner and story-time weights do not enter the DPP (reference §7 item 14 lists this as
    questionable; the reference's choice is kept so a pool matches ST-BME's). The pool also comes back in
    greedy pick order, not score order (§7 item 14), which the rerank's candidate keys ``R1…Rn`` follow.
Settings
    ``DiversitySettings`` (``enabled``, ``candidate_multiplier`` 3, ``quality_weight`` 1.0),
    ``SelectionSettings`` (``top_k``, ``max_recall_nodes``, ``llm_candidate_pool``),
    ``RerankSettings.enabled``.
Skip reasons (trace)
    ``no-candidates`` (empty table: state unchanged), ``diversity-disabled`` (pool cut without DPP; not a
    reference skip reason, so not added to ``state.skip_reasons``), ``candidate-pool-too-small``,
    ``candidate-embeddings-missing``, ``dpp-selection-incomplete``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memory_recall.pipeline.kernels.diversity import dpp_greedy_select
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import DiversitySettings, RerankSettings, SelectionSettings

__all__ = ["DiversityStage"]

_SCORE_KIND = "dpp_quality_final_score"


class DiversityStage(TimedStage):
    """Candidate pool with greedy DPP diversity (reference §3.14); see the module docstring for the contract.

    Usage: ``DiversityStage(settings.diversity, settings.selection, settings.rerank,
    llm_configured=providers.llm is not None).run(state)``.
    """

    name = "diversity"

    def __init__(
        self,
        settings: DiversitySettings,
        selection: SelectionSettings,
        rerank: RerankSettings,
        llm_configured: bool = False,
    ) -> None:
        self.settings = settings
        self.selection = selection
        self.rerank = rerank
        self.llm_configured = llm_configured

    def target(self) -> int:
        """Pool size: the LLM pool when the rerank will run, else ``top_k`` (reference §3.14)."""
        if self.rerank.enabled and self.llm_configured:
            return max(self.selection.max_recall_nodes, self.selection.llm_candidate_pool)
        return self.selection.top_k

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        table = state.scored
        rows = len(table)
        if rows == 0:
            return state, {**base, "skipped": True, "skip_reason": "no-candidates"}
        target = self.target()
        index = np.asarray(table.index, dtype=np.int64)
        fallback = tuple(index[:target].tolist())
        notes: dict[str, Any] = {"target": target, "llm_pool": self.rerank.enabled and self.llm_configured}

        def finish(
            pool: tuple[int, ...], before: int, applied: bool, reason: str
        ) -> tuple[RecallState, dict]:
            meta = state.with_meta(
                candidatePoolBeforeDpp=before,
                candidatePoolAfterDpp=len(pool),
                diversityApplied=applied,
                diversityTarget=target,
            )
            skips = (
                state.with_skip(reason) if reason and reason != "diversity-disabled" else state.skip_reasons
            )
            new_state = state.evolve(pool=pool, meta=meta, skip_reasons=skips)
            fields = {**base, "count_in": rows, "count_out": len(pool), "notes": notes}
            if reason:
                fields.update(skipped=True, skip_reason=reason)
            return new_state, fields

        if not self.settings.enabled:
            return finish(fallback, len(fallback), False, "diversity-disabled")
        size = min(rows, max(target, target * max(1, self.settings.candidate_multiplier)))
        pool_idx = index[:size]
        if size <= target:
            return finish(fallback, size, False, "candidate-pool-too-small")
        has_vector = state.snapshot.has_vector[pool_idx]
        if not bool(has_vector.all()):
            notes["missing_embeddings"] = int((~has_vector).sum())
            return finish(fallback, size, False, "candidate-embeddings-missing")
        picked = dpp_greedy_select(
            state.snapshot.embeddings[pool_idx],
            np.asarray(table.final_score[:size], dtype=np.float64),
            target,
            self.settings.quality_weight,
        )
        if len(picked) != target:
            return finish(fallback, size, False, "dpp-selection-incomplete")
        return finish(tuple(pool_idx[picked].tolist()), size, True, "")
