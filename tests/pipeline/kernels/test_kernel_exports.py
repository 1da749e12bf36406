"""Public surface of ``memory_recall.pipeline.kernels`` and the usage examples in its docstrings."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

import memory_recall.pipeline.kernels as kernels

MODULES = ["cooccurrence", "diffusion", "diversity", "lexical", "residual", "scoring"]


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(kernels) if not name.startswith("_")} - set(MODULES) - {"annotations"}
    assert sorted(kernels.__all__) == sorted(public)
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None


@pytest.mark.parametrize("module", MODULES)
def test_module_all_is_reexported(module: str) -> None:
    mod = importlib.import_module(f"memory_recall.pipeline.kernels.{module}")
    assert set(mod.__all__) <= set(kernels.__all__)
    assert mod.__doc__ and "reference" in mod.__doc__.lower()


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"memory_recall.pipeline.kernels.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def _call_all_kernels(arrays: dict[str, np.ndarray]) -> list[object]:
    a = arrays
    adj = kernels.build_adjacency(6, a["src"], a["dst"], a["w"], a["inh"], a["pairs"])
    idx = kernels.build_cooccurrence_index(
        ["a", "b", "c", "d", "e", "f"], a["rec"], a["imp"], a["start"], a["end"], a["batches"]
    )
    return [
        kernels.propagate(adj, a["seeds"], a["energy"], teleport_alpha=0.15),
        kernels.dpp_greedy_select(a["emb"], a["scores"], 3),
        kernels.nmf_query_analysis(a["q"], a["emb"], 3, 30),
        kernels.residual_novelty(a["q"], a["emb"]),
        kernels.sparse_code_residual(a["q"], a["emb"]),
        kernels.hybrid_score(a["scores"], a["scores"], a["scores"], a["imp"], a["start"], 10),
        kernels.cooccurrence_boost(a["seeds"][:2], a["energy"][:2], idx.counts),
        idx.counts.toarray(),
    ]


def test_kernels_do_not_mutate_inputs_and_are_deterministic() -> None:
    rng = np.random.default_rng(8)
    arrays = {
        "src": np.array([0, 1, 2, 3]), "dst": np.array([1, 2, 3, 4]), "w": rng.random(4),
        "inh": np.array([False, True, False, False]), "pairs": np.array([[4, 5], [5, 4]]),
        "seeds": np.array([0, 3, 0]), "energy": np.array([1.0, 0.5, 0.3]),
        "emb": rng.normal(size=(6, 8)), "scores": rng.random(6), "q": rng.normal(size=8),
        "rec": rng.random(6), "imp": rng.uniform(0, 10, 6), "start": np.array([1.0, 2, 2, 5, 6, 9]),
        "end": np.array([2.0, 3, 2, 7, 6, 9]), "batches": np.array([[2.0, 2.0]]),
    }
    before = {k: v.copy() for k, v in arrays.items()}
    first = repr(_call_all_kernels(arrays))
    for key, value in arrays.items():
        assert np.array_equal(value, before[key]), key
    assert repr(_call_all_kernels(arrays)) == first
