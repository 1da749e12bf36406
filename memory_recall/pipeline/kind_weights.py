"""Hybrid-score weights per node kind (not in the reference; issue 17).

Contract
    With ``ScoringSettings.message_weights`` on, a raw ``message`` node (a chat turn synced from the host, no LLM
    extraction) is scored with the ``scoring.message_*`` weights, time decay, neighbour carry and field-match
    scale; every other node (events, characters, POV memories … of an extracted or imported graph) with the
    reference's (``scoring.graph_weight`` … ``lexical.lexical_weight``, ``lexical.field_match_weight``,
    ``scoring.time_decay``, ``scoring.neighbour_carry``). With it off every node takes the reference's values, so
    the result is bit for bit the reference's hybrid score. One store can hold both kinds (a chat synced as raw
    messages, later extracted or imported): each row is scored by what it is, no store-wide switch.

Why
    The e5 cosines of chat turns differ by a few hundredths and a speaker's name matches every turn they spoke,
    so turns need a heavy vector and BM25 weight and no name field match (measured on LoCoMo,
    docs/evaluation.md); extracted memories are short, named and typed, and the reference's weights, POV and
    conformance scenarios are defined on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memory_recall.model.graph import NODE_TYPES
from memory_recall.pipeline.kernels.scoring import HybridParts, hybrid_score
from memory_recall.settings import LexicalSettings, ScoringSettings
from memory_recall.store.snapshot import GraphSnapshot

__all__ = ["KindWeights", "MESSAGE_TYPE_CODE", "kind_weights", "message_rows", "per_kind_hybrid", "scale_hybrid"]

#: ``type_code`` of message nodes in a snapshot.
MESSAGE_TYPE_CODE = NODE_TYPES.index("message")


@dataclass(frozen=True)
class KindWeights:
    """The hybrid weights, time decay switch, neighbour carry and field-match scale of one node kind."""

    graph: float
    vector: float
    lexical: float  # the lexical delta (0 when the lexical boost is off)
    importance: float
    field_match: float
    time_decay: bool
    neighbour_carry: float

    @property
    def raw(self) -> tuple[float, float, float, float]:
        """Graph, vector, lexical, importance: the order of the explanation parts."""
        return (self.graph, self.vector, self.lexical, self.importance)


def kind_weights(scoring: ScoringSettings, lexical: LexicalSettings, *, message: bool) -> KindWeights:
    """The weights a node of the given kind scores with (``message`` only matters with ``message_weights``).

    >>> from memory_recall.settings import load_settings
    >>> s = load_settings(profile="default")
    >>> kind_weights(s.scoring, s.lexical, message=True).raw, kind_weights(s.scoring, s.lexical, message=False).raw
    ((0.6, 3.0, 5.0, 0.1), (0.6, 0.3, 0.18, 0.1))
    """
    boost = lexical.enable_lexical_boost
    if message and scoring.message_weights:
        return KindWeights(
            graph=float(scoring.message_graph_weight),
            vector=float(scoring.message_vector_weight),
            lexical=float(scoring.message_lexical_weight) if boost else 0.0,
            importance=float(scoring.message_importance_weight),
            field_match=float(scoring.message_field_match_weight),
            time_decay=bool(scoring.message_time_decay),
            neighbour_carry=float(scoring.message_neighbour_carry),
        )
    return KindWeights(
        graph=float(scoring.graph_weight),
        vector=float(scoring.vector_weight),
        lexical=float(lexical.lexical_weight) if boost else 0.0,
        importance=float(scoring.importance_weight),
        field_match=float(lexical.field_match_weight),
        time_decay=bool(scoring.time_decay),
        neighbour_carry=float(scoring.neighbour_carry),
    )


def message_rows(snapshot: GraphSnapshot, idx: np.ndarray, scoring: ScoringSettings) -> np.ndarray | None:
    """Boolean mask of the rows ``idx`` that are message nodes, or ``None`` when ``message_weights`` is off
    (every row then scores with the reference's weights)."""
    if not scoring.message_weights or idx.size == 0:
        return None
    return np.asarray(snapshot.type_code[idx] == MESSAGE_TYPE_CODE)


def per_kind_hybrid(
    graph: np.ndarray,
    vector: np.ndarray,
    lexical: np.ndarray,
    importance: np.ndarray,
    created_ms: np.ndarray,
    now_ms: float,
    is_message: np.ndarray | None,
    reference: KindWeights,
    message: KindWeights,
) -> HybridParts:
    """The hybrid score of each row with its kind's weights: rows where ``is_message`` use ``message``, the
    others ``reference`` (all of them when ``is_message`` is ``None``). A kind's time decay off gives its rows a
    decay of 1. Each kind is one vectorised :func:`hybrid_score` call over its rows only."""
    m = graph.shape[0]

    def run(w: KindWeights, rows: np.ndarray | slice) -> HybridParts:
        created = created_ms[rows] if w.time_decay else np.full(graph[rows].shape[0], np.nan)  # NaN → decay 1.0
        return hybrid_score(graph[rows], vector[rows], lexical[rows], importance[rows], created, now_ms,
                            graph_weight=w.graph, vector_weight=w.vector, importance_weight=w.importance,
                            lexical_weight=w.lexical)

    if is_message is None or not is_message.any():
        return run(reference, slice(None))
    if is_message.all():
        return run(message, slice(None))
    ref_rows = np.flatnonzero(~is_message)
    msg_rows = np.flatnonzero(is_message)
    ref, msg = run(reference, ref_rows), run(message, msg_rows)
    stacked = np.empty((4, m))
    score = np.empty(m)
    decay = np.empty(m)
    for rows, hp in ((ref_rows, ref), (msg_rows, msg)):
        assert hp.stacked is not None  # hybrid_score always returns the stacked parts
        stacked[:, rows] = hp.stacked
        score[rows] = hp.score
        decay[rows] = hp.decay
    return HybridParts(score, stacked[0], stacked[1], stacked[2], stacked[3], decay, stacked=stacked)


def scale_hybrid(hp: HybridParts, factor: np.ndarray) -> HybridParts:
    """``hp`` with each row's score and parts multiplied by ``factor`` (the decay column unchanged): a per-row
    multiplier that enters the hybrid score itself (the time cue, pipeline.temporal)."""
    stacked = (hp.stacked if hp.stacked is not None else np.stack([hp.graph, hp.vector, hp.lexical, hp.importance]))
    stacked = stacked * factor
    score = ((stacked[0] + stacked[1]) + stacked[2]) + stacked[3]
    return HybridParts(score, stacked[0], stacked[1], stacked[2], stacked[3], hp.decay, stacked=stacked)
