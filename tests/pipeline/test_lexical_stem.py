"""LexicalStage with ``lexical.stem``: the method reaches the index, stemmed queries find inflected words."""

from __future__ import annotations

from functools import partial

import pytest
from ctx_helpers import NOW, make_state, node, run_all, snapshot

from memory_recall.errors import ConfigError
from memory_recall.model.state import MemoryGraph
from memory_recall.pipeline.lexical import LexicalStage
from memory_recall.pipeline.query_plan import QueryPlanStage
from memory_recall.pipeline.state import Providers
from memory_recall.settings import LexicalSettings, QueryPlanSettings, load_settings
from memory_recall.store import Store
from memory_recall.store.snapshot import build_snapshot

PLAN = QueryPlanStage(QueryPlanSettings())


class KwIndex:
    """Records ``(terms, limit, kwargs)`` of each call; returns no hits."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int, dict[str, str]]] = []

    def __call__(self, terms, limit, **kwargs):
        self.calls.append((list(terms), limit, kwargs))
        return []


def planned(snap, message: str):
    state, _ = run_all(make_state(snap, message), PLAN)
    return state


def test_method_is_passed_only_when_set() -> None:
    snap = snapshot([node("a")])
    index = KwIndex()
    LexicalStage(LexicalSettings(), Providers(lexical_index=index)).run(planned(snap, "painted lakes"))
    LexicalStage(LexicalSettings(stem="porter"), Providers(lexical_index=index)).run(planned(snap, "painted lakes"))
    # Query terms stay as written: the index stems them with the same stemmer as its documents.
    assert index.calls == [(["painted", "lakes"], 30, {}), (["painted", "lakes"], 30, {"stem": "porter"})]


def test_stemmed_query_finds_inflected_words(tmp_path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    try:
        chat = "chat-stem"
        store.replace_graph(
            chat,
            MemoryGraph(
                nodes=(
                    node("p", "event", name="Sunrise", summary="Melanie was painting a sunrise by the lake"),
                    node("d", "event", name="Dog", summary="Caroline adopted a dog"),
                    node("x", "event", name="Other", summary="nothing here"),
                )
            ),
        )
        snap = build_snapshot(store.snapshot_source(chat, ""), now_ms=NOW)
        providers = Providers(lexical_index=partial(store.bm25, chat))
        state = planned(snap, "Who paints sunrises? Any adopting?")
        plain = LexicalStage(LexicalSettings(), providers).run(state)
        stemmed = LexicalStage(LexicalSettings(stem="porter"), providers).run(state)
        assert plain.state.bm25_hits[0].size == 0  # no exact term in common
        ids = [snap.ids[i] for i in stemmed.state.bm25_hits[0].tolist()]
        assert ids == ["p", "d"]  # two stems (paint, sunris) beat one (adopt)
        assert stemmed.state.bm25_hits[1][0] == 1.0 and 0 < stemmed.state.bm25_hits[1][1] < 1.0
    finally:
        store.close()


def test_stem_setting_validation_and_profiles(monkeypatch) -> None:
    assert LexicalSettings().stem == "none"
    with pytest.raises(ValueError):
        LexicalSettings(stem="snowball")
    with pytest.raises(ConfigError, match="lexical.stem"):
        load_settings(overrides={"lexical": {"stem": "snowball"}})
    monkeypatch.delenv("MEMORY_RECALL_LEXICAL__STEM", raising=False)
    assert load_settings(profile="app").lexical.stem == "none"
    transcript = load_settings(profile="transcript")
    # Porter for the whole BM25 channel; the field match is off for message nodes only (scoring.message_*).
    assert (transcript.lexical.stem, transcript.lexical.field_match_weight) == ("porter", 1.0)
    assert transcript.scoring.message_field_match_weight == 0.0
    monkeypatch.setenv("MEMORY_RECALL_LEXICAL__STEM", "s")
    assert load_settings(profile="transcript").lexical.stem == "s"  # the environment beats the profile
