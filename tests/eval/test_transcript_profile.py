"""The ``transcript`` profile holds exactly the values tuned on the LoCoMo dev split (docs/evaluation.md), so a
change to it is deliberate and comes with new figures; the ``app`` profile keeps the reference's values."""

from __future__ import annotations

import pytest

from memory_recall.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMORY_RECALL_PROFILE", "MEMORY_RECALL_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _tuned(profile: str) -> dict[str, object]:
    s = load_settings(profile=profile)
    return {
        "scoring.vector_weight": s.scoring.vector_weight,
        "scoring.time_decay": s.scoring.time_decay,
        "scoring.neighbour_carry": s.scoring.neighbour_carry,
        "lexical.lexical_weight": s.lexical.lexical_weight,
        "lexical.bm25_top_k": s.lexical.bm25_top_k,
        "lexical.field_match_weight": s.lexical.field_match_weight,
        "lexical.stem": s.lexical.stem,
        "diffusion.enabled": s.diffusion.enabled,
        "diffusion.hub_degree_threshold": s.diffusion.hub_degree_threshold,
        "diffusion.temporal_link_strength": s.diffusion.temporal_link_strength,
        "anchors.enabled": s.anchors.enabled,
    }


def test_transcript_profile_values() -> None:
    assert _tuned("transcript") == {
        "scoring.vector_weight": 3.0,
        "scoring.time_decay": False,
        "scoring.neighbour_carry": 0.8,
        "lexical.lexical_weight": 5.0,
        "lexical.bm25_top_k": 100,
        "lexical.field_match_weight": 0.0,
        "lexical.stem": "porter",
        "diffusion.enabled": True,
        "diffusion.hub_degree_threshold": 8,
        "diffusion.temporal_link_strength": 0.5,
        "anchors.enabled": False,
    }


def test_app_profile_keeps_exact_terms_anchors_and_the_field_match() -> None:
    app = _tuned("app")
    assert (app["lexical.stem"], app["lexical.field_match_weight"], app["anchors.enabled"]) == ("none", 1.0, True)
    assert app["diffusion.enabled"] is True and app["scoring.time_decay"] is True
