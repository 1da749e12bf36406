"""The ``default`` profile (``transcript`` is its alias) holds exactly the values tuned on the LoCoMo dev split
(docs/evaluation.md), so a change to it is deliberate and comes with new figures; the ``app`` profile keeps the
reference's values."""

from __future__ import annotations

import pytest

from memory_recall.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMORY_RECALL_PROFILE", "MEMORY_RECALL_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _tuned(profile: str | None) -> dict[str, object]:
    s = load_settings(profile=profile)
    return {
        "scoring.vector_weight": s.scoring.vector_weight,
        "scoring.time_decay": s.scoring.time_decay,
        "scoring.neighbour_carry": s.scoring.neighbour_carry,
        "scoring.message_weights": s.scoring.message_weights,
        "scoring.message_graph_weight": s.scoring.message_graph_weight,
        "scoring.message_vector_weight": s.scoring.message_vector_weight,
        "scoring.message_importance_weight": s.scoring.message_importance_weight,
        "scoring.message_lexical_weight": s.scoring.message_lexical_weight,
        "scoring.message_field_match_weight": s.scoring.message_field_match_weight,
        "scoring.message_time_decay": s.scoring.message_time_decay,
        "scoring.message_neighbour_carry": s.scoring.message_neighbour_carry,
        "scoring.time_cue": s.scoring.time_cue,
        "scoring.time_expression_boost": s.scoring.time_expression_boost,
        "scoring.time_range_boost": s.scoring.time_range_boost,
        "scoring.speaker_cue": s.scoring.speaker_cue,
        "scoring.speaker_cue_boost": s.scoring.speaker_cue_boost,
        "lexical.lexical_weight": s.lexical.lexical_weight,
        "lexical.bm25_top_k": s.lexical.bm25_top_k,
        "lexical.field_match_weight": s.lexical.field_match_weight,
        "lexical.stem": s.lexical.stem,
        "lexical.feedback_docs": s.lexical.feedback_docs,
        "lexical.turn_context_previous": s.lexical.turn_context_previous,
        "lexical.turn_context_next": s.lexical.turn_context_next,
        "vector.turn_context_previous": s.vector.turn_context_previous,
        "vector.turn_context_next": s.vector.turn_context_next,
        "diffusion.enabled": s.diffusion.enabled,
        "diffusion.hub_degree_threshold": s.diffusion.hub_degree_threshold,
        "diffusion.hub_degree_counts": s.diffusion.hub_degree_counts,
        "diffusion.temporal_link_strength": s.diffusion.temporal_link_strength,
        "anchors.enabled": s.anchors.enabled,
    }


def test_default_profile_values() -> None:
    """Message nodes get the transcript values, every other node the reference's (the unprefixed ones)."""
    assert _tuned("default") == {
        "scoring.vector_weight": 0.3,
        "scoring.time_decay": True,
        "scoring.neighbour_carry": 0.0,
        "scoring.message_weights": True,
        "scoring.message_graph_weight": 0.6,
        "scoring.message_vector_weight": 3.0,
        "scoring.message_importance_weight": 0.1,
        "scoring.message_lexical_weight": 5.0,
        "scoring.message_field_match_weight": 0.0,
        "scoring.message_time_decay": False,
        "scoring.message_neighbour_carry": 0.7,
        "scoring.time_cue": True,
        "scoring.time_expression_boost": 0.3,
        "scoring.time_range_boost": 0.3,
        "scoring.speaker_cue": True,
        "scoring.speaker_cue_boost": 0.3,
        "lexical.lexical_weight": 0.18,
        "lexical.bm25_top_k": 100,
        "lexical.field_match_weight": 1.0,
        "lexical.stem": "porter",
        "lexical.feedback_docs": 0,
        "lexical.turn_context_previous": 0.5,
        "lexical.turn_context_next": 0.2,
        "vector.turn_context_previous": 0.5,
        "vector.turn_context_next": 0.2,
        "diffusion.enabled": True,
        "diffusion.hub_degree_threshold": 8,
        "diffusion.hub_degree_counts": "message",
        "diffusion.temporal_link_strength": 0.2,
        "anchors.enabled": True,
    }


def test_no_profile_is_the_default_and_transcript_its_alias() -> None:
    assert load_settings().profile == "default"
    assert _tuned(None) == _tuned("default") == _tuned("transcript")


def test_app_profile_keeps_exact_terms_anchors_and_the_field_match() -> None:
    app = _tuned("app")
    assert (app["lexical.stem"], app["lexical.field_match_weight"], app["anchors.enabled"]) == ("none", 1.0, True)
    assert app["diffusion.enabled"] is True and app["scoring.time_decay"] is True
    assert (app["scoring.message_weights"], app["scoring.time_cue"]) == (False, False)
