"""Node embeddings (validation, one dimension per model and chat, models never mixed) and the global cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from store_helpers import node

from memory_recall.errors import InputError
from memory_recall.store import Store


@pytest.fixture
def seeded(store: Store) -> Store:
    store.upsert_nodes("c", [node("a"), node("b"), node("c")])
    return store


class TestValidation:
    @pytest.mark.parametrize(
        ("vector", "reason"),
        [
            (np.array([1.0, np.nan]), "must be finite"),
            (np.array([np.inf, 0.0]), "must be finite"),
            (np.array([1e39, 0.0]), "must be finite"),  # overflows float32
            (np.zeros((2, 2)), "must be a non-empty 1-D vector, got shape (2, 2)"),
            (np.zeros(0), "must be a non-empty 1-D vector, got shape (0,)"),
            (np.array(["a", "b"]), "must hold real numbers"),
            (np.array([True, False]), "must hold real numbers"),
            (np.array([1 + 2j]), "must hold real numbers"),
        ],
    )
    def test_bad_vectors(self, seeded: Store, vector: Any, reason: str) -> None:
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", {"a": np.ones(2), "b": vector})
        assert info.value.field == "vectors['b']"
        assert reason in info.value.reason
        assert seeded.get_embeddings("c", "m")[0] == []

    def test_lists_and_ints_are_accepted(self, seeded: Store) -> None:
        seeded.put_embeddings("c", "m", [("a", [1, 2], "h"), ("b", np.array([3, 4], dtype=np.int64), "")])
        assert seeded.get_embeddings("c", "m")[1].tolist() == [[1.0, 2.0], [3.0, 4.0]]

    def test_dimension_mismatch_inside_a_batch(self, seeded: Store) -> None:
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", [("a", np.ones(3), "h"), ("b", np.ones(4), "h")])
        assert (info.value.field, info.value.reason) == (
            "vectors[1]",
            "has dimension 4, but the first vector has 3",
        )

    def test_dimension_mismatch_with_stored_vectors(self, seeded: Store) -> None:
        seeded.put_embeddings("c", "m", {"a": np.ones(3)})
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", {"b": np.ones(4)})
        assert info.value.field == "vectors"
        assert "dimension 4 differs from the dimension 3 already stored for model 'm'" in info.value.reason
        # Another model, or another chat, may have another dimension.
        seeded.put_embeddings("c", "m2", {"b": np.ones(4)})
        seeded.upsert_nodes("d", [node("b")])
        seeded.put_embeddings("d", "m", {"b": np.ones(4)})
        # After deleting the model's vectors the dimension is free again.
        seeded.delete_embeddings("c", "m")
        seeded.put_embeddings("c", "m", {"b": np.ones(4)})

    def test_unknown_node_and_bad_items(self, seeded: Store) -> None:
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", {"a": np.ones(2), "ghost": np.ones(2)})
        assert (info.value.field, info.value.reason) == (
            "vectors['ghost']",
            "node 'ghost' does not exist in chat 'c'",
        )
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", [("a", np.ones(2))])  # type: ignore[list-item]
        assert info.value.field == "vectors[0]"
        with pytest.raises(InputError) as info:
            seeded.put_embeddings("c", "m", [("a", np.ones(2), None)])  # type: ignore[list-item]
        assert info.value.field == "vectors[0].text_hash"
        for bad in ("", "  ", "x\ny", "m" * 201):
            with pytest.raises(InputError) as info:
                seeded.put_embeddings("c", bad, {"a": np.ones(2)})
            assert info.value.field == "model_id"


class TestModels:
    def test_two_models_are_never_mixed(self, seeded: Store) -> None:
        seeded.put_embeddings("c", "small", {"a": np.full(2, 1.0), "c": np.full(2, 3.0)})
        seeded.put_embeddings("c", "large", [("b", np.full(5, 2.0), "hb"), ("a", np.full(5, 9.0), "ha")])
        ids, mat = seeded.get_embeddings("c", "small")
        assert ids == ["a", "c"] and mat.tolist() == [[1.0, 1.0], [3.0, 3.0]]
        ids, mat = seeded.get_embeddings("c", "large")
        assert ids == ["a", "b"] and mat[:, 0].tolist() == [9.0, 2.0]
        assert seeded.embedding_hashes("c", "large") == {"a": "ha", "b": "hb"}
        assert seeded.embedding_hashes("c", "small") == {"a": "", "c": ""}
        ids, mat = seeded.get_embeddings("c", "absent")
        assert ids == [] and mat.shape == (0, 0) and mat.dtype == np.float32
        assert seeded.stats("c")["embedded"] == {"large": 2, "small": 2}

    def test_replacing_a_vector_and_deleting_some(self, seeded: Store) -> None:
        seeded.put_embeddings("c", "m", [("a", np.ones(2), "h1"), ("b", np.ones(2), "h1")])
        seeded.put_embeddings("c", "m", [("a", np.zeros(2), "h2")])
        assert seeded.embedding_hashes("c", "m") == {"a": "h2", "b": "h1"}
        assert seeded.delete_embeddings("c", "m", ["a", "zz"]) == 1
        assert seeded.get_embeddings("c", "m")[0] == ["b"]


class TestCache:
    def test_get_and_put(self, store: Store) -> None:
        assert store.cache_get("m", ["h1"]) == {}
        assert store.cache_put("m", {"h1": np.array([1.0, 2.0]), "h2": np.array([3.0, 4.0])}) == 2
        got = store.cache_get("m", ["h2", "missing", "h1"])
        assert list(got) == ["h2", "h1"]
        assert got["h2"].dtype == np.float32 and got["h2"].tolist() == [3.0, 4.0]
        assert store.cache_get("other-model", ["h1"]) == {}
        store.cache_put("m", {"h1": np.array([5.0, 6.0])})
        assert store.cache_get("m", ["h1"])["h1"].tolist() == [5.0, 6.0]
        # The cache is global: no chat is created or bumped.
        assert store.list_chats() == []

    def test_many_hashes(self, store: Store) -> None:
        items = {f"h{i}": np.full(3, float(i)) for i in range(1200)}
        store.cache_put("m", items)
        got = store.cache_get("m", list(items))
        assert len(got) == 1200 and got["h1199"].tolist() == [1199.0] * 3

    def test_validation(self, store: Store) -> None:
        store.cache_put("m", {"h": np.ones(3)})
        with pytest.raises(InputError, match="dimension 4 differs from the dimension 3 cached"):
            store.cache_put("m", {"h2": np.ones(4)})
        with pytest.raises(InputError) as info:
            store.cache_put("m", {"h2": np.array([np.nan, 1, 1])})
        assert info.value.field == "items['h2']"
        with pytest.raises(InputError) as info:
            store.cache_put("m", {"": np.ones(3)})
        assert info.value.reason == "the text hash must not be empty"
