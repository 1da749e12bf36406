"""Benchmark the array kernels of ``memory_recall.pipeline.kernels`` against their plain-Python
``_reference_*`` transliterations, side by side on realistic sizes, and print speed ratios and the largest
absolute differences of their outputs.

Sizes: diffusion on a 10k-node random graph (average degree 8, 10 % inhibit edges, a temporal chain,
30 seeds, α 0.15, top-k 100); DPP on 90 candidates × 384 dimensions (k 30); NMF on 24 × 384 (15 topics,
100 iterations) plus scikit-learn's MU solver for comparison; FISTA on 24 × 384; co-occurrence seqRange
fallback (sweep vs all pairs) on 2 000 nodes; hybrid score on 10 000 candidates.

Usage: ``python scripts/bench_kernels.py [--repeat N] [--seed S] [--blas-threads T]``. Deterministic
inputs (seeded). BLAS is limited to one thread by default (``--blas-threads 0`` leaves it alone): the
matrices here are small, and a multi-threaded OpenBLAS on a busy 2-core machine turns a 0.1 ms 90 × 384
Gram product into ~10 ms of thread contention.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from memory_recall.pipeline.kernels import (
    build_adjacency,
    build_cooccurrence_index,
    dpp_greedy_select,
    hybrid_score,
    nmf_query_analysis,
    propagate,
    sparse_code_residual,
)
from memory_recall.pipeline.kernels.cooccurrence import _reference_build_cooccurrence_index
from memory_recall.pipeline.kernels.diffusion import (
    INHIBIT_EDGE_TYPE,
    _reference_build_adjacency,
    _reference_propagate,
)
from memory_recall.pipeline.kernels.diversity import _reference_dpp_greedy_select
from memory_recall.pipeline.kernels.residual import (
    _nmf_factorise,
    _nmf_init,
    _reference_nmf_query_analysis,
    _reference_sparse_code_residual,
    _row_normalise,
)
from memory_recall.pipeline.kernels.scoring import _reference_hybrid_score

ROWS: list[tuple[str, str, float, float, str]] = []


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time in ms over ``repeat`` runs, and the last result."""
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best, out


def record(name: str, size: str, fast_ms: float, ref_ms: float, diff: str) -> None:
    ROWS.append((name, size, fast_ms, ref_ms, diff))


def bench_diffusion(rng: np.random.Generator, repeat: int) -> None:
    n, avg_degree = 10_000, 8
    m = n * avg_degree // 2
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    strength = rng.uniform(0.1, 1.0, src.size)
    inhibit = rng.random(src.size) < 0.1
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    ids = [f"n{i:05d}" for i in range(n)]
    edges = [
        (ids[s], ids[d], float(w), INHIBIT_EDGE_TYPE if h else 0)
        for s, d, w, h in zip(src.tolist(), dst.tolist(), strength.tolist(), inhibit.tolist(), strict=True)
    ]
    tpairs = [(ids[a], ids[b]) for a, b in chain.tolist()]
    t_fast, adj = best_of(lambda: build_adjacency(n, src, dst, strength, inhibit, chain, 0.2), repeat)
    t_ref, (lists, _) = best_of(lambda: _reference_build_adjacency(ids, edges, tpairs, 0.2), repeat)
    record("adjacency build", f"{n} nodes, {src.size} edges", t_fast, t_ref, "-")

    seeds = rng.choice(n, 30, replace=False)
    energies = np.concatenate([rng.uniform(0.3, 0.9, 20), np.full(10, 2.0)])
    seed_list = [(ids[s], float(e)) for s, e in zip(seeds.tolist(), energies.tolist(), strict=True)]
    # top_k 100 is the app default; 5000 with 3 steps shows how both scale with the active set.
    for top_k, steps in ((100, 2), (5000, 3)):
        kwargs = dict(max_steps=steps, top_k=top_k, teleport_alpha=0.15)
        t_fast, (idx, energy) = best_of(lambda kw=kwargs: propagate(adj, seeds, energies, **kw), repeat)
        t_ref, ref = best_of(
            lambda kw=kwargs: _reference_propagate(lists, seed_list, tie_key=lambda s: int(s[1:]), **kw),
            repeat,
        )
        got = {ids[i]: e for i, e in zip(idx.tolist(), energy.tolist(), strict=True)}
        same_keys = got.keys() == ref.keys()
        diff = max(abs(got[k] - ref[k]) for k in ref) if same_keys else math.inf
        name = "propagate" if top_k == 100 else f"  top_k {top_k}, {steps} steps"
        size = f"{n} nodes, deg {avg_degree}, 30 seeds"
        record(name, size, t_fast, t_ref, f"{diff:.1e} ({len(got)} nodes)")


def bench_dpp(rng: np.random.Generator, repeat: int) -> None:
    emb = rng.normal(size=(90, 384))
    scores = rng.uniform(0.2, 1.0, 90)
    emb_list, score_list = emb.tolist(), scores.tolist()
    t_fast, fast = best_of(lambda: dpp_greedy_select(emb, scores, 30), repeat)
    t_ref, ref = best_of(lambda: _reference_dpp_greedy_select(emb_list, score_list, 30), repeat)
    record("dpp_greedy_select", "90 x 384, k 30", t_fast, t_ref, "same picks" if fast == ref else "DIFFERENT")


def bench_nmf(rng: np.random.Generator, repeat: int) -> None:
    basis, q = rng.normal(size=(24, 384)), rng.normal(size=384)
    b_list, q_list = basis.tolist(), q.tolist()
    t_fast, fast = best_of(lambda: nmf_query_analysis(q, basis), repeat)
    t_ref, ref = best_of(lambda: _reference_nmf_query_analysis(q_list, b_list), max(1, repeat // 3))
    diff = max(
        abs(fast.novelty - ref.novelty),
        abs(fast.semantic_depth - ref.semantic_depth),
        max(abs(a - b) for a, b in zip(fast.top_topics, ref.top_topics, strict=True)),
    )
    record("nmf_query_analysis", "24 x 384, 15 topics", t_fast, t_ref, f"{diff:.1e}")

    # scikit-learn MU on the transposed problem (so it updates H before W), same init, no early stop.
    from sklearn.decomposition import non_negative_factorization

    v = np.abs(_row_normalise(basis))
    w0, h0 = _nmf_init(v, 15)
    _, h_ours, n_iter = _nmf_factorise(v, 15, 100, 1e-4)

    def run_sklearn() -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w_sk, _, _ = non_negative_factorization(
                v.T, W=h0.T.copy(), H=w0.T.copy(), n_components=15, init="custom", solver="mu",
                tol=0.0, max_iter=n_iter,
            )
        return np.asarray(w_sk.T)

    t_sk, h_sk = best_of(run_sklearn, repeat)
    rel = float(np.max(np.abs(h_sk - h_ours)) / np.max(np.abs(h_ours)))
    record("  sklearn MU (H factor)", "24 x 384, 15 topics", t_sk, t_ref,
           f"{np.max(np.abs(h_sk - h_ours)):.1e} (rel {rel:.1e})")


def bench_fista(rng: np.random.Generator, repeat: int) -> None:
    basis, q = rng.normal(size=(24, 384)), rng.normal(size=384)
    b_list, q_list = basis.tolist(), q.tolist()
    t_fast, fast = best_of(lambda: sparse_code_residual(q, basis), repeat)
    t_ref, ref = best_of(lambda: _reference_sparse_code_residual(q_list, b_list), repeat)
    diff = max(
        float(np.max(np.abs(fast.alpha - ref.alpha))), float(np.max(np.abs(fast.residual - ref.residual)))
    )
    record("sparse_code_residual", "24 x 384, 80 iters", t_fast, t_ref, f"{diff:.1e}")


def bench_cooccurrence(rng: np.random.Generator, repeat: int) -> None:
    n = 2000
    start = rng.integers(0, 4000, n).astype(float)
    end = start + rng.integers(0, 4, n)
    rec, imp = rng.random(n), rng.random(n)
    ids = [f"n{i:05d}" for i in range(n)]
    nodes = [
        {"id": ids[i], "recency": rec[i], "importance": imp[i], "start": start[i], "end": end[i]}
        for i in range(n)
    ]
    t_fast, idx = best_of(lambda: build_cooccurrence_index(ids, rec, imp, start, end, []), repeat)
    t_ref, (ref, _) = best_of(lambda: _reference_build_cooccurrence_index(nodes, []), 1)
    coo = idx.counts.tocoo()
    got = {(ids[r], ids[c]): v for r, c, v in zip(coo.row, coo.col, coo.data, strict=True)}
    expected = {(a, b): v for a, nb in ref.items() for b, v in nb.items()}
    diff = "equal" if got == expected else "DIFFERENT"
    record("cooccurrence seqRange", f"{n} nodes, {coo.nnz // 2} pairs", t_fast, t_ref, diff)


def bench_hybrid(rng: np.random.Generator, repeat: int) -> None:
    n = 10_000
    g, v, lx = rng.uniform(0, 2, n), rng.random(n), rng.random(n)
    imp, created = rng.uniform(0, 10, n), rng.uniform(0, 1e10, n)
    now = 2e10
    cols = [a.tolist() for a in (g, v, lx, imp, created)]
    t_fast, parts = best_of(lambda: hybrid_score(g, v, lx, imp, created, now), repeat)
    t_ref, ref = best_of(
        lambda: [_reference_hybrid_score(*row, now) for row in zip(*cols, strict=True)], repeat
    )
    diff = float(np.max(np.abs(parts.score - np.array(ref))))
    record("hybrid_score", f"{n} candidates", t_fast, t_ref, f"{diff:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats (best of N)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS thread limit, 0 = no limit")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with threadpool_limits(limits=args.blas_threads if args.blas_threads > 0 else None, user_api="blas"):
        for bench in (bench_diffusion, bench_dpp, bench_nmf, bench_fista, bench_cooccurrence, bench_hybrid):
            bench(rng, args.repeat)
    print(f"BLAS threads: {args.blas_threads or 'unlimited'}; best of {args.repeat} runs (reference NMF: "
          f"{max(1, args.repeat // 3)})")
    header = (
        f"{'kernel':<24} {'size':<32} {'array ms':>10} {'reference ms':>13} {'speed-up':>9}  max abs diff"
    )
    print(header)
    print("-" * len(header))
    for name, size, fast_ms, ref_ms, diff in ROWS:
        print(f"{name:<24} {size:<32} {fast_ms:>10.2f} {ref_ms:>13.2f} {ref_ms / fast_ms:>8.1f}x  {diff}")


if __name__ == "__main__":
    main()
