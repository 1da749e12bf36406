"""Pure numeric kernels of the retrieve pipeline: plain functions on numpy/scipy arrays, no settings, no
data models. The stage classes in ``memory_recall.pipeline`` wrap them.

Each module keeps a plain-Python ``_reference_*`` transliteration of the reference formula next to the array
implementation; the differential tests in ``tests/pipeline/kernels`` and ``scripts/bench_kernels.py`` compare
the two.

==================  ==========================================================  =================
module              functions                                                   reference (ST-BME)
==================  ==========================================================  =================
``diffusion``       :func:`build_adjacency`, :func:`propagate`, :func:`rank`     §1.3, §3.9
``diversity``       :func:`dpp_greedy_select`                                   §3.14
``residual``        :func:`nmf_query_analysis`, :func:`residual_novelty`,       §3.10 steps 3–4
                    :func:`sparse_code_residual`
``lexical``         :func:`lexical_units`, :func:`field_match`,                 §3.12 step 1
                    :func:`lexical_score`, :func:`prepare_sources`,
                    :func:`prepare_node`, :func:`prepared_lexical_score`,
                    :func:`pack_node`, :func:`batch_lexical_scores`,
                    :class:`PackedFieldTable`
``scoring``         :func:`time_decay`, :func:`hybrid_score`                    §1.9, §3.12 step 2
``cooccurrence``    :func:`build_cooccurrence_index`, :func:`cooccurrence_boost`,  §3.11
                    :func:`cooccurrence_neighbors`, :func:`id_order_key`
==================  ==========================================================  =================
"""

from __future__ import annotations

from memory_recall.pipeline.kernels.cooccurrence import (
    SOURCE_BATCH_JOURNAL,
    SOURCE_SEQ_RANGE,
    CooccurrenceIndex,
    build_cooccurrence_index,
    cooccurrence_boost,
    cooccurrence_neighbors,
    id_order_key,
)
from memory_recall.pipeline.kernels.diffusion import (
    INHIBIT_EDGE_TYPE,
    Adjacency,
    build_adjacency,
    propagate,
    rank,
)
from memory_recall.pipeline.kernels.diversity import dpp_greedy_select
from memory_recall.pipeline.kernels.lexical import (
    LexicalSources,
    PackedFieldTable,
    PackedNode,
    PreparedField,
    PreparedNode,
    UnitVocab,
    batch_lexical_scores,
    field_match,
    lexical_score,
    lexical_units,
    pack_node,
    prepare_field,
    prepare_node,
    prepare_sources,
    prepared_lexical_score,
)
from memory_recall.pipeline.kernels.residual import (
    NmfAnalysis,
    ResidualNovelty,
    SparseCode,
    nmf_query_analysis,
    residual_novelty,
    sparse_code_residual,
)
from memory_recall.pipeline.kernels.scoring import DAY_MS, HybridParts, hybrid_score, time_decay

__all__ = [
    "DAY_MS",
    "INHIBIT_EDGE_TYPE",
    "SOURCE_BATCH_JOURNAL",
    "SOURCE_SEQ_RANGE",
    "Adjacency",
    "CooccurrenceIndex",
    "HybridParts",
    "LexicalSources",
    "NmfAnalysis",
    "PackedFieldTable",
    "PackedNode",
    "PreparedField",
    "PreparedNode",
    "ResidualNovelty",
    "SparseCode",
    "UnitVocab",
    "batch_lexical_scores",
    "build_adjacency",
    "build_cooccurrence_index",
    "cooccurrence_boost",
    "cooccurrence_neighbors",
    "dpp_greedy_select",
    "field_match",
    "hybrid_score",
    "id_order_key",
    "lexical_score",
    "lexical_units",
    "nmf_query_analysis",
    "pack_node",
    "prepare_field",
    "prepare_node",
    "prepare_sources",
    "prepared_lexical_score",
    "propagate",
    "rank",
    "residual_novelty",
    "sparse_code_residual",
    "time_decay",
]
