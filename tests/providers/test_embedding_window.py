"""Texts are cut to the local model's window before they are embedded: one text costs at most one window,
whatever its length (a 200,000-character message took minutes and held the engine for every chat)."""

from __future__ import annotations

import numpy as np
import pytest

from memory_recall.providers.embedding import (
    LOCAL_WINDOW_CHARS,
    LOCAL_WINDOW_TOKENS,
    LocalEmbedder,
    fit_window,
)


def words(text: str) -> int:
    """A token counter: one token per word, plus 2 (the model's special tokens)."""
    return len(text.split()) + 2


class TestFitWindow:
    def test_a_text_that_fits_is_kept_whole(self) -> None:
        assert fit_window("a b c", words, 5, 100) == "a b c"
        assert fit_window("", words, 5, 100) == ""

    def test_the_longest_prefix_that_fits(self) -> None:
        text = " ".join(f"w{i}" for i in range(1000))  # 1,000 words of 2 to 4 characters
        cut = fit_window(text, words, 102, 10**6)
        assert words(cut) <= 102
        assert text.startswith(cut)
        # Within 1 % of its length of the longest prefix that fits.
        longest = max(n for n in range(len(text) + 1) if words(text[:n]) <= 102)
        assert longest - len(text) // 100 <= len(cut) <= longest

    def test_characters_are_cut_first(self) -> None:
        calls: list[int] = []

        def count(text: str) -> int:
            calls.append(len(text))
            return words(text)

        text = "x " * 50_000
        cut = fit_window(text, count, 10**6, 1_000)
        assert cut == text[:1_000]
        assert calls == [1_000]  # the counter never reads past max_chars

    def test_deterministic(self) -> None:
        text = " ".join(f"token{i % 37}" for i in range(5_000))
        assert fit_window(text, words, 300, 10**6) == fit_window(text, words, 300, 10**6)


LONG = {
    "en": "The lighthouse keeper Marcus said hello to Erin at the harbor. " * 3200,
    "zh": "灯塔看守人马库斯在港口向艾琳问好。" * 11_000,
}


class TestLocalWindow:
    @pytest.mark.parametrize("lang", ["en", "zh"])
    def test_a_long_passage_is_embedded_as_its_window(self, local_embedder: LocalEmbedder, lang: str) -> None:
        text = LONG[lang][:200_000]
        vector = local_embedder.embed_passages([text])[0]
        model = local_embedder._model
        window = LocalEmbedder.window(model, text, is_query=False)
        assert text.startswith(window) and len(window) < len(text)
        assert model.token_count(window, False) <= LOCAL_WINDOW_TOKENS
        more = text[: len(window) + max(2, len(window) // 50)]  # a little more no longer fits
        assert model.token_count(more, False) > LOCAL_WINDOW_TOKENS
        np.testing.assert_array_equal(vector, local_embedder.embed_passages([window])[0])

    def test_a_long_query_is_cut_the_same_way(self, local_embedder: LocalEmbedder) -> None:
        text = "Where did Marcus hide the brass key? " * 5_000
        vector = local_embedder.embed_query(text)
        window = LocalEmbedder.window(local_embedder._model, text, is_query=True)
        assert local_embedder._model.token_count(window, True) <= LOCAL_WINDOW_TOKENS
        np.testing.assert_array_equal(vector, local_embedder.embed_query(window))

    def test_a_text_within_the_window_is_embedded_whole(self, local_embedder: LocalEmbedder) -> None:
        text = "Alice hid the silver key under the blue flowerpot. " * 20  # about 260 tokens
        local_embedder.embed_passages(["warm"])
        assert LocalEmbedder.window(local_embedder._model, text, is_query=False) == text

    def test_the_character_cut_is_beyond_the_window(self, local_embedder: LocalEmbedder) -> None:
        """The character pre-cut never decides the window for ordinary text: it holds more tokens than fit."""
        local_embedder.embed_passages(["warm"])
        model = local_embedder._model
        for text in LONG.values():
            assert model.token_count(text[:LOCAL_WINDOW_CHARS], False) > LOCAL_WINDOW_TOKENS
