"""Residual kernels: reference NMF query analysis (scenario 16), FISTA sparse coding (scenario 17), the
departure-9 novelty, and differential tests against the plain-Python transliterations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.decomposition import non_negative_factorization

from memory_recall.pipeline.kernels import nmf_query_analysis, residual_novelty, sparse_code_residual
from memory_recall.pipeline.kernels.residual import (
    _lcg_uniforms,
    _nmf_factorise,
    _nmf_init,
    _reference_nmf_query_analysis,
    _reference_sparse_code_residual,
)

E12 = [[1, 0, 0, 0], [0, 1, 0, 0]]


class TestNmfScenario16:
    @pytest.mark.parametrize("impl", [nmf_query_analysis, _reference_nmf_query_analysis])
    def test_partially_explained_query(self, impl) -> None:
        r = impl([0.8, 0.6, 0, 0], E12, n_topics=2, max_iter=50)
        assert r.novelty == pytest.approx(0.110830, abs=1e-6)
        assert list(r.top_topics) == pytest.approx([0.545115, 0.454885], abs=1e-6)
        assert r.topic_coverage == 2
        assert r.semantic_depth == pytest.approx(0.005881, abs=1e-6)

    @pytest.mark.parametrize("impl", [nmf_query_analysis, _reference_nmf_query_analysis])
    def test_orthogonal_query_novelty_exceeds_one(self, impl) -> None:
        r = impl([0, 0, 1, 0], E12)
        assert r.novelty == pytest.approx(1.377035, abs=1e-6)
        assert list(r.top_topics) == pytest.approx([0.5, 0.5], abs=1e-12)
        assert r.topic_coverage == 2 and r.semantic_depth == pytest.approx(0.0, abs=1e-12)

    @pytest.mark.parametrize("impl", [nmf_query_analysis, _reference_nmf_query_analysis])
    @pytest.mark.parametrize(("q", "basis"), [([1, 0, 0, 0], [[1, 0, 0, 0]]), ([], E12), ([1, 0], [])])
    def test_degenerate_inputs_give_the_empty_analysis(self, impl, q, basis) -> None:
        r = impl(q, basis)
        assert (r.semantic_depth, r.topic_coverage, r.novelty, r.top_topics) == (0.0, 0, 1.0, ())

    def test_single_topic_has_depth_one(self) -> None:
        r = nmf_query_analysis([0.5, 0.5, 0, 0], E12, n_topics=1)
        assert r.top_topics == (1.0,) and r.semantic_depth == 1.0 and r.topic_coverage == 1

    def test_sklearn_mu_cannot_reproduce_the_reference_factors(self) -> None:
        """Documents the module's decision. Even transposed (so that sklearn updates H before W) and from
        the same init, sklearn's whole-matrix (Jacobi) multiplicative update lands elsewhere than the
        reference's in-place one: topics 0.5070 / novelty 0.3054 instead of 0.5451 / 0.1108."""
        v = np.abs(np.asarray(E12, dtype=float))
        w0, h0 = _nmf_init(v, 2)
        _, h_ours, _ = _nmf_factorise(v, 2, 50, 0.0)
        w_sk, _, n_iter = non_negative_factorization(
            v.T, W=h0.T.copy(), H=w0.T.copy(), n_components=2, init="custom", solver="mu", tol=0.0,
            max_iter=50,
        )
        assert n_iter == 50
        h_sk = w_sk.T
        assert np.max(np.abs(h_sk - h_ours)) > 1e-2
        q = np.array([0.8, 0.6, 0, 0])
        p = np.exp(h_sk @ q - (h_sk @ q).max())
        p /= p.sum()
        assert p[0] == pytest.approx(0.5070, abs=1e-4)
        assert np.linalg.norm(q - p @ h_sk) == pytest.approx(0.3054, abs=1e-4)

    def test_lcg_jump_ahead_matches_sequential_generator(self) -> None:
        x, seq = 42, []
        for _ in range(5000):
            x = (1664525 * x + 1013904223) % 2**32
            seq.append(x / 0xFFFFFFFF)
        assert np.array_equal(_lcg_uniforms(5000), np.array(seq))

    def test_dimension_mismatch_raises(self) -> None:
        with pytest.raises(ValueError, match="dimension"):
            nmf_query_analysis([1, 0, 0], E12)


class TestSparseCodeScenario17:
    @pytest.mark.parametrize("impl", [sparse_code_residual, _reference_sparse_code_residual])
    def test_small_lambda(self, impl) -> None:
        r = impl([0.8, 0.6, 0, 0], E12, 0.01, 100)
        assert r.alpha.tolist() == pytest.approx([0.79, 0.59], abs=1e-12)
        assert r.residual.tolist() == pytest.approx([0.01, 0.01, 0, 0], abs=1e-12)
        assert r.residual_norm == pytest.approx(0.0141421, abs=1e-7)

    @pytest.mark.parametrize("impl", [sparse_code_residual, _reference_sparse_code_residual])
    def test_defaults(self, impl) -> None:
        r = impl([0.8, 0.6, 0, 0], E12)
        assert r.alpha.tolist() == pytest.approx([0.7, 0.5], abs=1e-12)
        assert r.residual_norm == pytest.approx(0.141421, abs=1e-6)

    @pytest.mark.parametrize("impl", [sparse_code_residual, _reference_sparse_code_residual])
    def test_degenerate_basis_returns_query(self, impl) -> None:
        r = impl([0.3, 0.4], [[0, 0], [0, 0]])
        assert r.alpha.tolist() == [0.0, 0.0]
        assert r.residual.tolist() == [0.3, 0.4] and r.residual_norm == pytest.approx(0.5)

    def test_query_is_raw_and_basis_normalised(self) -> None:
        r = sparse_code_residual([2.0, 0.0], [[5.0, 0.0]], lam=0.0, max_iter=10)
        assert r.alpha.tolist() == pytest.approx([2.0]) and r.residual_norm == pytest.approx(0.0, abs=1e-12)


class TestResidualNovelty:
    @pytest.mark.parametrize("method", ["nnls", "projection"])
    def test_query_equal_to_basis_row_is_not_novel(self, method: str) -> None:
        rng = np.random.default_rng(0)
        basis = rng.normal(size=(24, 384))
        assert residual_novelty(3.0 * basis[5], basis, method).novelty == pytest.approx(0.0, abs=1e-9)

    @pytest.mark.parametrize("method", ["nnls", "projection"])
    def test_orthogonal_query_is_fully_novel(self, method: str) -> None:
        assert residual_novelty([0, 0, 1, 0], E12, method).novelty == pytest.approx(1.0, abs=1e-12)
        rng = np.random.default_rng(1)
        basis = rng.normal(size=(24, 384))
        q = rng.normal(size=384)
        q -= basis.T @ np.linalg.lstsq(basis.T, q, rcond=None)[0]  # remove the span component
        assert residual_novelty(q, basis, method).novelty == pytest.approx(1.0, abs=1e-9)

    def test_signs_are_kept(self) -> None:
        # The reference's abs() would call −e1 fully explained; the cone does not contain it, the span does.
        assert residual_novelty([-1, 0, 0, 0], E12).novelty == pytest.approx(1.0)
        assert residual_novelty([-1, 0, 0, 0], E12, "projection").novelty == pytest.approx(0.0, abs=1e-12)

    def test_single_row_gives_sine_of_angle(self) -> None:
        r = residual_novelty([0.8, 0.6, 0, 0], [[1, 0, 0, 0]])
        assert r.novelty == pytest.approx(0.6) and r.coefficients.tolist() == pytest.approx([0.8])

    def test_scenario_16_inputs_are_fully_explained(self) -> None:
        r = residual_novelty([0.8, 0.6, 0, 0], E12)
        assert r.novelty == pytest.approx(0.0, abs=1e-12)
        assert r.coefficients.tolist() == pytest.approx([0.8, 0.6])

    def test_zero_query_or_empty_basis_is_fully_novel(self) -> None:
        assert residual_novelty([0, 0, 0, 0], E12).novelty == 1.0
        assert residual_novelty([1, 0], np.zeros((0, 2))).novelty == 1.0
        assert residual_novelty([1, 0], [[0, 0], [0, 0]]).novelty == 1.0

    def test_unknown_method_raises(self) -> None:
        with pytest.raises(ValueError, match="method"):
            residual_novelty([1, 0], [[1, 0]], "svd")  # type: ignore[arg-type]

    @settings(max_examples=150, deadline=None)
    @given(
        data=st.integers(min_value=1, max_value=12).flatmap(
            lambda rows: st.integers(min_value=1, max_value=24).flatmap(
                lambda dim: st.tuples(
                    arrays(np.float64, dim, elements=st.floats(-10, 10, allow_nan=False)),
                    arrays(np.float64, (rows, dim), elements=st.floats(-10, 10, allow_nan=False)),
                )
            )
        )
    )
    def test_novelty_is_in_unit_interval_and_cone_within_span(self, data) -> None:
        q, basis = data
        cone = residual_novelty(q, basis).novelty
        span = residual_novelty(q, basis, "projection").novelty
        assert 0.0 <= cone <= 1.0
        assert 0.0 <= span <= 1.0
        # The span contains the cone, to the solvers' round-off: on a near-degenerate basis (entries of 1e-10) both
        # novelties were ~5e-7, the cone's (NNLS) 1.4e-7 below the span's (least squares).
        assert span <= cone + 1e-6


def _rand_nmf_case(rng: np.random.Generator, rows: int, dim: int, low_rank: bool):
    if low_rank:  # exactly factorisable non-negative data: the tolerance stop triggers
        basis = rng.random((rows, 2)) @ rng.random((2, dim))
    else:
        basis = rng.normal(size=(rows, dim))
    return rng.normal(size=dim), basis


def test_differential_nmf_full_size_matches_reference() -> None:
    """Realistic size (24 × 384, 15 topics, 100 iterations): every output equal within 1e-6."""
    rng = np.random.default_rng(42)
    q, basis = _rand_nmf_case(rng, 24, 384, low_rank=False)
    got = nmf_query_analysis(q, basis)
    ref = _reference_nmf_query_analysis(q.tolist(), basis.tolist())
    assert got.n_iter == ref.n_iter == 100
    assert got.novelty == pytest.approx(ref.novelty, abs=1e-6)
    assert got.semantic_depth == pytest.approx(ref.semantic_depth, abs=1e-6)
    assert got.topic_coverage == ref.topic_coverage
    assert list(got.top_topics) == pytest.approx(list(ref.top_topics), abs=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_differential_nmf_smaller_shapes_match_reference(seed: int) -> None:
    """24×384-like data at smaller sizes, incl. exactly low-rank data where the early stop triggers."""
    rng = np.random.default_rng(seed)
    rows, dim = int(rng.integers(2, 12)), int(rng.integers(4, 64))
    q, basis = _rand_nmf_case(rng, rows, dim, low_rank=seed % 2 == 1)
    topics = int(rng.integers(1, 8))
    iters = int(rng.integers(5, 120))
    got = nmf_query_analysis(q, basis, topics, iters)
    ref = _reference_nmf_query_analysis(q.tolist(), basis.tolist(), topics, iters)
    assert got.n_iter == ref.n_iter
    assert got.novelty == pytest.approx(ref.novelty, abs=1e-6)
    assert got.semantic_depth == pytest.approx(ref.semantic_depth, abs=1e-6)
    assert got.topic_coverage == ref.topic_coverage
    assert list(got.top_topics) == pytest.approx(list(ref.top_topics), abs=1e-6)


def test_differential_nmf_early_stop_happens() -> None:
    rng = np.random.default_rng(5)
    q, basis = _rand_nmf_case(rng, 6, 20, low_rank=True)
    got = nmf_query_analysis(q, basis, 2, 500, tol=1e-3)
    assert got.n_iter < 500 and got.n_iter % 10 == 1
    assert got.n_iter == _reference_nmf_query_analysis(q.tolist(), basis.tolist(), 2, 500, tol=1e-3).n_iter


def test_differential_sparse_code_matches_reference() -> None:
    """20 random 24 × 384 cases with λ in {0.01, 0.1, 0.5}: α and residual equal within 1e-6."""
    rng = np.random.default_rng(99)
    for case in range(20):
        basis = rng.normal(size=(24, 384))
        q = rng.normal(size=384) * rng.uniform(0.1, 3)
        lam = float(rng.choice([0.01, 0.1, 0.5]))
        got = sparse_code_residual(q, basis, lam)
        ref = _reference_sparse_code_residual(q.tolist(), basis.tolist(), lam)
        assert np.max(np.abs(got.alpha - ref.alpha)) < 1e-6, case
        assert np.max(np.abs(got.residual - ref.residual)) < 1e-6, case
        assert got.residual_norm == pytest.approx(ref.residual_norm, abs=1e-6), case
