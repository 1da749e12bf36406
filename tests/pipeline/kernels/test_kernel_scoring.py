"""Hybrid score and time decay: reference §1.9, §3.12 step 2 and scenario 10; parts add up exactly."""

from __future__ import annotations

import numpy as np
import pytest

from memory_recall.pipeline.kernels import DAY_MS, hybrid_score, time_decay
from memory_recall.pipeline.kernels.scoring import _reference_hybrid_score, _reference_time_decay


class TestScenario10:
    def test_vector_only_node(self) -> None:
        parts = hybrid_score(0.0, 0.9, 0.0, 5, 0, 0)
        assert float(parts.score) == pytest.approx(0.2711864406779661, abs=1e-15)

    def test_raw_graph_score_is_halved(self) -> None:
        # The scenario's "g 1.0" is the raw graphScore (diffusion energy): g = clamp(1.0 / 2) = 0.5.
        parts = hybrid_score(1.0, 0.8, 0.5, 8, 0, 0)
        assert float(parts.score) == pytest.approx(0.6016949152542372, abs=1e-15)
        no_lexical = hybrid_score(1.0, 0.8, 0.5, 8, 0, 0, lexical_weight=0.0)
        assert float(no_lexical.score) == pytest.approx(0.62, abs=1e-15)
        assert float(no_lexical.lexical) == 0.0

    @pytest.mark.parametrize(
        ("days", "expected"), [(0, 1.0), (1, 0.918123), (7, 0.864947), (30, 0.845106), (365, 0.828974)]
    )
    def test_time_decay_values(self, days: int, expected: float) -> None:
        assert float(time_decay(0.0, days * DAY_MS)) == pytest.approx(expected, abs=1e-6)
        assert _reference_time_decay(0.0, days * DAY_MS) == pytest.approx(expected, abs=1e-6)


class TestTimeDecay:
    def test_missing_created_time_gives_one(self) -> None:
        got = time_decay(np.array([np.nan, np.inf, 0.0]), 30 * DAY_MS)
        assert got.tolist() == pytest.approx([1.0, 1.0, 0.845106], abs=1e-6)

    def test_future_created_time_clamps_to_zero_days(self) -> None:
        assert float(time_decay(10 * DAY_MS, 0)) == 1.0

    def test_tends_to_point_eight(self) -> None:
        assert 0.8 < float(time_decay(0.0, 1e6 * DAY_MS)) < 0.82


class TestHybridParts:
    def test_parts_add_up_exactly_and_match_reference(self) -> None:
        rng = np.random.default_rng(11)
        n = 2000
        graph, vector, lexical = rng.uniform(-0.5, 2.5, n), rng.uniform(-0.2, 1.2, n), rng.uniform(0, 1.2, n)
        importance = rng.uniform(-1, 12, n)
        importance[::17] = np.nan
        created = rng.uniform(0, 400 * DAY_MS, n)
        created[::13] = np.nan
        now = 400 * DAY_MS
        weights = dict(graph_weight=0.6, vector_weight=0.3, importance_weight=0.1, lexical_weight=0.18)
        parts = hybrid_score(graph, vector, lexical, importance, created, now, **weights)
        total = ((parts.graph + parts.vector) + parts.lexical) + parts.importance
        assert np.array_equal(total, parts.score)
        for i in range(0, n, 7):
            ref = _reference_hybrid_score(
                float(graph[i]), float(vector[i]), float(lexical[i]), float(importance[i]),
                float(created[i]), now, **weights,
            )
            assert float(parts.score[i]) == pytest.approx(ref, abs=1e-15)

    def test_missing_values(self) -> None:
        # NaN graph/vector/lexical count as 0, NaN importance as 5, NaN createdTime as decay 1.
        parts = hybrid_score(np.nan, np.nan, np.nan, np.nan, np.nan, 0)
        assert float(parts.score) == pytest.approx(0.1 * 0.5 / 1.18, abs=1e-15)
        assert float(parts.decay) == 1.0

    def test_negative_weight_counts_in_numerator_only(self) -> None:
        parts = hybrid_score(2.0, 1.0, 0.0, 10, 0, 0, graph_weight=-0.5, vector_weight=1.0,
                             importance_weight=0.0, lexical_weight=0.0)
        assert float(parts.score) == pytest.approx(0.5, abs=1e-15)
        assert float(parts.graph) == pytest.approx(-0.5, abs=1e-15)

    def test_all_zero_weights_use_the_floor(self) -> None:
        parts = hybrid_score(2.0, 1.0, 1.0, 10, 0, 0, 0.0, 0.0, 0.0, 0.0)
        assert float(parts.score) == 0.0

    def test_decay_multiplies_every_part(self) -> None:
        fresh = hybrid_score(1.5, 0.7, 0.3, 6, 0, 0)
        old = hybrid_score(1.5, 0.7, 0.3, 6, 0, 7 * DAY_MS)
        d = float(old.decay)
        for name in ("graph", "vector", "lexical", "importance"):
            assert float(getattr(old, name)) == pytest.approx(float(getattr(fresh, name)) * d, rel=1e-15)

    def test_broadcasts_scalars_against_arrays(self) -> None:
        parts = hybrid_score(np.array([0.0, 2.0]), 0.5, 0.0, 5, 0, 0)
        assert parts.score.shape == parts.importance.shape == (2,)
